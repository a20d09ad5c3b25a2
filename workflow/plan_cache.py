"""A plan kept on disk (`cached_plan`): planning a large generated study (drawing and checking substituted
AFLOW templates, choosing each material's zone axes) takes a minute or two of one core, paid again by
every `namsa simulate`. A stored plan is read instead when everything the plan is a function of is
unchanged: the simulation config (but for the machine's fields: device, memory, workers, threads),
every file of the namsa package (its code and structure data), the CIF files of ``cif_dir`` and the
structure libraries that planning calls (pymatgen, spglib).

numpy and scipy versions are deliberately not part of the key, so that a plan made on one machine
serves another (scripts/gpu_study.sh reads the study's plan made on the build machine): at worst
another numpy resolves a floating-point tie between two zone axes differently, and the stored plan is
still a valid plan of the config, the same one on both machines.

Orchestration, not physics: it lives beside the runners that plan, and stores through stage's one
atomic JSON writer (`stage.jsonfile.write_json_atomic`).
"""
from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

import namsa
from namsa.config import MACHINE_FIELDS, SimulationConfig
from namsa.errors import UserError
from namsa.plan import Plan, SampleSpec, plan_samples
from namsa.sample import config_hash
from stage.jsonfile import write_json_atomic

#: the structure libraries whose answers a plan holds (symmetry, oxidation states, neighbours)
PLANNING_LIBRARIES = ("pymatgen", "pymatgen-core", "spglib")
_PACKAGE_DIR = Path(namsa.__file__).resolve().parent


def cached_plan(cfg: SimulationConfig, cache_dir: str | Path | None) -> tuple[Plan, Path | None]:
    """(the plan of ``cfg``, the file it was read from or None). With ``cache_dir`` a stored plan of
    the same key is read, else the plan is made and stored there; None: always planned afresh."""
    if cache_dir is None:
        return plan_samples(cfg), None
    key = plan_key(cfg)
    path = Path(cache_dir) / f"plan-{key[:24]}.json"
    stored = _read(path, key)
    if stored is not None:
        return stored, path
    plan = plan_samples(cfg)
    try:
        write_json_atomic(path, _payload(key, plan), make_parents=True)
    except OSError as exc:
        raise UserError(f"execution.plan_cache_dir={cache_dir}: cannot store the plan there ({exc.strerror or exc}); "
                        f"point it at a writable folder or leave it unset") from exc
    return plan, None


def plan_key(cfg: SimulationConfig) -> str:
    """sha256 over what a plan is a function of (module docstring)."""
    # how the samples are computed (device, memory, workers, threads) plans nothing
    payload = {"simulation": cfg.model_dump(mode="json", exclude=set(MACHINE_FIELDS)), "namsa": _files_digest(_PACKAGE_DIR),
               "cif_dir": _files_digest(Path(cfg.cif_dir), "*.cif") if cfg.cif_dir else None,
               "libraries": {name: library_version(name) for name in PLANNING_LIBRARIES}}
    return config_hash(payload)


def _files_digest(root: Path, pattern: str = "*") -> str:
    """sha256 over the relative paths and contents of the files under ``root`` (compiled files aside)."""
    digest = hashlib.sha256()
    if not root.is_dir():
        return digest.hexdigest()
    for path in sorted(p for p in root.rglob(pattern) if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def library_version(name: str) -> str | None:
    """The installed version of distribution ``name``, None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _read(path: Path, key: str) -> Plan | None:
    """The plan stored at ``path`` under ``key``; None when there is none, or it is unreadable or
    another key's (it is then made again and overwritten: a cache never decides a plan)."""
    try:
        stored = json.loads(path.read_text())
        if not isinstance(stored, dict) or stored.get("key") != key:
            return None
        return Plan(specs=[SampleSpec(m, tuple(int(i) for i in axis), int(v)) for m, axis, v in stored["specs"]],
                    failures=[(str(m), str(why)) for m, why in stored["failures"]],
                    sources={str(k): str(v) for k, v in stored["sources"].items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _payload(key: str, plan: Plan) -> dict:
    """The stored form of ``plan`` under ``key`` (what `_read` reads back)."""
    return {"key": key, "specs": [[s.material_id, list(s.zone_axis), s.variant] for s in plan.specs],
            "failures": [list(f) for f in plan.failures], "sources": plan.sources}


__all__ = ["cached_plan", "plan_key", "library_version", "PLANNING_LIBRARIES"]
