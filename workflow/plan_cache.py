"""A plan kept on disk (`cached_plan`), trusted for nothing that can be checked or planned instead.

Planning a large generated study takes a minute or two of one core, paid again by every `namsa
simulate`, in two slow steps: drawing the generated materials (configs/gpu-study.yaml: 600 of them,
~15 s) and searching every material's automatic zone axes (~40 s). Only those two choices are stored
(`namsa.plan.PlanChoices`). Everything that follows cheaply from the config is planned from it on
every read (`namsa.plan.plan_and_choices`): the named materials and the CIFs of ``cif_dir``, what
each is loaded from, which fail and why, the variants (and so their seeds) and the order. A read of
the study's plan takes ~12 s in a fresh process against ~60 s of planning, 8 s of it loading the
AFLOW templates, which its simulation would load next anyway.

The cache folder may be shared, and anyone who can write it can put a file there whose key (a public
function of config and code) matches. So a stored plan is believed only when it is signed: an
HMAC-SHA256 over its content with this user's secret key, which never lives in the cache folder
(`workflow.plan_signature`: ``~/.cache/namsa/plan-cache.key`` or the file ``NAMSA_PLAN_KEY`` names);
a writer of the folder without the key can make a run plan afresh, never make it believe another
choice. Each user's plans are stored under their own signer's name, so users sharing a folder do not
replace each other's. A key file that cannot be trusted (a link, not a regular file, open to group or
others, another user's) is refused in one warning line: the plan is made afresh and not stored.
What is read is also checked against the config, as a second layer:

- a regular file only, under `MAX_PLAN_BYTES`, opened without following a link and without blocking
  on a FIFO, parsed with a nesting cap (`models.safe_files.open_regular`, `models.safe_files.parse_json_bytes`);
- signed with this user's key, then exactly the fields `_payload` writes, under this config's key;
- the generated ids: generator.count of them, distinct, each a recipe of the config's generator in
  its canonical spelling (template among the config's templates and sources, elements from the pool,
  the light slots' from its light elements; `namsa.generator.build` accepts it);
- the zone axes: stored only under ``zone_axes: auto``, one to max_zone_axes distinct axes per
  material, each three integers of the form and index range the search returns;
- the refused generated ids (drawn, no zone axis could be built, replaced by the next draw): distinct,
  none among the generated ones, each a recipe of the config's generator, no more than its draws.

A file that fails a check (its signature included) is planned over as if it were absent, and stored
again: a bad cache is never an error and never a traceback. A material without stored axes is
searched (a failure is always searched again, so no material is dropped by leaving it out), and an
entry for a material the config does not plan is never used; such a file is stored again too. A
refused material is searched again too (its failure is planned, not stored); one the plan's checks
judge otherwise than the file did is planned over (`namsa.plan.plan_and_choices`). What
no check of the content can tell apart is one valid choice from another (a recipe the generator could
have drawn, another low-index axis): the signature is what guards that.

The plan's key (`plan_key`, public, unlike the signing key) is everything the plan is a function
of: the simulation config (but for `NOT_PLANNED`: the machine's fields and which variants), every
file of the namsa package (its code and structure data), the CIF files of ``cif_dir`` and the
structure libraries that planning calls (pymatgen, spglib). numpy and scipy versions are deliberately
not part of it, so that a plan made on one machine serves another (scripts/gpu_study.sh reads the
study's plan made on the build machine, with the signing key scripts/gpu_wheels.sh ships beside it):
at worst another numpy resolves a floating-point tie between two zone axes differently, and the
stored choices are still valid ones of the config, the same on both machines.

Orchestration, not physics: it lives beside the runners that plan, and stores through stage's one
atomic JSON writer (`stage.jsonfile.write_json_atomic`).
"""
from __future__ import annotations

import hashlib
import math
import sys
from importlib import metadata
from itertools import product
from pathlib import Path
from typing import Any

import namsa
from models.safe_files import open_regular, parse_json_bytes
from namsa import generator, library
from namsa.config import MACHINE_FIELDS, SimulationConfig
from namsa.element_pool import DEFAULT_ELEMENTS, LIGHT_ELEMENTS
from namsa.errors import UserError
from namsa.material_id import generated_id, split_generated_id
from namsa.plan import Plan, PlanChoices, plan_and_choices, plan_samples
from namsa.sample import config_hash
from namsa.zone_axes import MAX_INDEX
from stage.jsonfile import write_json_atomic

from .plan_signature import MAC_FIELD, PlanKeyRefused, plan_secret, signed, signer_id, verified

#: the structure libraries whose answers a plan holds (symmetry, oxidation states, neighbours)
PLANNING_LIBRARIES = ("pymatgen", "pymatgen-core", "spglib")
#: largest plan file read: the GPU study's is ~0.1 MB, 20,000 generated materials (generator's
#: MAX_GENERATED) with three axes each ~5 MB
MAX_PLAN_BYTES = 16 << 20
_FIELDS = frozenset({"key", "generated", "zone_axes", "refused"})   # signed; the signature beside them
_PACKAGE_DIR = Path(namsa.__file__).resolve().parent
#: the largest index the automatic search tries in a structure's own basis (axes only its standard cell
#: gives, beyond it, are not stored: `namsa.plan.PlanChoices`)
_SEARCH_MAX_INDEX: int = MAX_INDEX
#: every axis a stored plan may hold: the search's in a structure's own basis, gcd 1, first non-zero
#: index positive (u v w ~ -u -v -w)
SEARCH_AXES = frozenset(axis for axis in product(range(-_SEARCH_MAX_INDEX, _SEARCH_MAX_INDEX + 1), repeat=3)
                        if any(axis) and math.gcd(*axis) == 1 and next(i for i in axis if i) > 0)


class _Untrusted(Exception):
    """A stored plan that fails a check (never leaves this module: the plan is made afresh)."""


def cached_plan(cfg: SimulationConfig, cache_dir: str | Path | None) -> tuple[Plan, Path | None]:
    """(the plan of ``cfg``, the file its choices were read from or None). With ``cache_dir`` this
    user's signed choices of the same key are checked and used, and stored (again, signed) whenever
    they are not exactly the plan's; None, or a key file that cannot be trusted (one warning line):
    planned afresh, nothing stored."""
    if cache_dir is None:
        return plan_samples(cfg), None
    try:
        secret = plan_secret()
    except PlanKeyRefused as exc:
        print(f"namsa: warning: {exc}, so the plan is made afresh and not stored: {exc.advice}", file=sys.stderr)
        return plan_samples(cfg), None
    key = plan_key(cfg)
    path = plan_path(key, cache_dir, secret)
    stored = _read(path, key, cfg, secret)
    plan, choices = plan_and_choices(cfg, stored)
    if choices == stored:
        return plan, path
    try:
        write_json_atomic(path, signed(_payload(key, choices), secret), make_parents=True)
    except OSError as exc:
        raise UserError(f"execution.plan_cache_dir={cache_dir}: cannot store the plan there ({exc.strerror or exc}); "
                        f"point it at a writable folder or leave it unset") from exc
    return plan, None


def plan_path(key: str, cache_dir: str | Path, secret: bytes) -> Path:
    """Where the plan of ``key`` signed with ``secret`` is kept in ``cache_dir`` (one file per signer)."""
    return Path(cache_dir) / f"plan-{key[:24]}-{signer_id(secret)}.json"


#: what the stored choices (materials, zone axes, refusals) do not depend on: how the samples are computed
#: (device, memory, workers, threads), and which variants of each choice are planned (`simulation.variants`
#: from `first_variant`: a later device call's fresh variants read the plan stored for the first)
NOT_PLANNED = frozenset({*MACHINE_FIELDS, "variants", "first_variant"})


def plan_key(cfg: SimulationConfig) -> str:
    """sha256 over what a plan is a function of (module docstring)."""
    payload = {"simulation": cfg.model_dump(mode="json", exclude=set(NOT_PLANNED)), "namsa": _files_digest(_PACKAGE_DIR),
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


def _read(path: Path, key: str, cfg: SimulationConfig, secret: bytes) -> PlanChoices | None:
    """The choices stored at ``path`` under ``key``, signed with ``secret``, once every check of the
    module docstring passes; None when there is no such file or it fails one (it is then planned over)."""
    try:
        with open_regular(path, "stored plan") as fh:   # refuses a link, a FIFO, a device
            raw = fh.read(MAX_PLAN_BYTES + 1)
        return _checked(_authentic(parse_json_bytes(raw, f"stored plan {path}", MAX_PLAN_BYTES), secret), key, cfg)
    except (UserError, OSError, _Untrusted):
        return None


def _authentic(stored: Any, secret: bytes) -> dict[str, Any]:
    """``stored`` less its signature when ``secret`` signed it; `_Untrusted` otherwise (unsigned, another
    user's, or edited since: the content is not even looked at)."""
    content = verified(stored, secret) if isinstance(stored, dict) and MAC_FIELD in stored else None
    if content is None:
        raise _Untrusted("not signed with this user's key")
    return content


def _checked(stored: Any, key: str, cfg: SimulationConfig) -> PlanChoices:
    """``stored`` (parsed JSON) as the choices of ``cfg``'s plan; `_Untrusted` when any part is not."""
    if not isinstance(stored, dict) or set(stored) != _FIELDS or stored["key"] != key:
        raise _Untrusted("not a stored plan of this key")
    generated = _checked_generated(stored["generated"], cfg)
    return PlanChoices(generated, _checked_zone_axes(stored["zone_axes"], cfg),
                       _checked_refused(stored["refused"], cfg, generated))


def _checked_generated(ids: Any, cfg: SimulationConfig) -> tuple[str, ...]:
    """The stored generated ids: as many as the generator draws, distinct, each one of its recipes."""
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise _Untrusted("generated ids are not a list of strings")
    if len(ids) != cfg.generator.count or len(set(ids)) != len(ids):
        raise _Untrusted(f"{len(ids)} generated ids for generator.count={cfg.generator.count}, or repeated ones")
    for slot, material_id in enumerate(ids):
        _check_recipe(material_id, slot, cfg.generator)
    return tuple(ids)


def _checked_refused(ids: Any, cfg: SimulationConfig, generated: tuple[str, ...]) -> tuple[str, ...]:
    """The stored refused ids: distinct, none generated, each a recipe of the generator (drawn for a
    slot the file does not say, so from its whole pool), no more than it draws."""
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise _Untrusted("refused ids are not a list of strings")
    if len(ids) > generator.draw_budget(cfg.generator.count) or len(set(ids)) != len(ids) or set(ids) & set(generated):
        raise _Untrusted(f"{len(ids)} refused ids: more than the generator draws, repeated, or generated ones")
    for material_id in ids:
        _check_recipe(material_id, None, cfg.generator)
    return tuple(ids)


def _check_recipe(material_id: str, slot: int | None, gen: generator.GeneratorConfig) -> None:
    """`_Untrusted` unless ``material_id`` is a recipe ``gen`` could draw as its material ``slot`` (None:
    as any one)."""
    try:
        template, elements, scale = split_generated_id(material_id)
        spelled = generated_id(template, elements, float(scale))
    except ValueError as exc:
        raise _Untrusted(str(exc)) from None
    pool = set(gen.elements or DEFAULT_ELEMENTS)
    if slot is not None and generator.is_light_slot(slot, gen.light_fraction):
        pool &= set(LIGHT_ELEMENTS)
    if material_id != spelled or not set(elements) <= pool or not _template_allowed(template, gen):
        raise _Untrusted(f"{material_id!r} is not a recipe of this generator")
    try:
        generator.build(material_id)   # the template is one the generator accepts, the scale in range
    except Exception as exc:   # whatever a hostile id makes a structure library raise: planned over
        raise _Untrusted(f"{material_id!r}: {type(exc).__name__}") from None


def _template_allowed(template: str, gen: generator.GeneratorConfig) -> bool:
    """Whether ``gen`` draws from ``template``: one it lists, else one of its sources' (an AFLOW label's
    acceptance is `generator.build`'s check)."""
    if gen.templates != "all":
        return template in gen.templates
    return ("library" if template in library.list_ids() else "aflow") in gen.sources


def _checked_zone_axes(entries: Any, cfg: SimulationConfig) -> dict[str, tuple[tuple[int, int, int], ...]]:
    """The stored automatic zone axes: none under explicit ``zone_axes`` (they follow from the config)."""
    if not isinstance(entries, dict) or (entries and cfg.zone_axes != "auto"):
        raise _Untrusted("zone axes where the config plans none, or not a mapping")
    return {material_id: _checked_axes(axes, cfg.max_zone_axes) for material_id, axes in entries.items()}


def _checked_axes(axes: Any, most: int) -> tuple[tuple[int, int, int], ...]:
    """One material's stored axes: 1 to ``most`` distinct axes the search can return."""
    if not isinstance(axes, list) or not 1 <= len(axes) <= most:
        raise _Untrusted(f"not 1 to max_zone_axes={most} zone axes")
    checked = tuple(_checked_axis(axis) for axis in axes)
    if len(set(checked)) != len(checked):
        raise _Untrusted("a zone axis stored twice")
    return checked


def _checked_axis(axis: Any) -> tuple[int, int, int]:
    # type(...) is int: JSON's true/false are Python bools, an int subclass
    if not isinstance(axis, list) or not all(type(i) is int for i in axis) or tuple(axis) not in SEARCH_AXES:
        raise _Untrusted("a zone axis the search does not return")
    return tuple(axis)  # type: ignore[return-value]


def _payload(key: str, choices: PlanChoices) -> dict:
    """The stored form of ``choices`` under ``key``, before its signature (what `_read` reads back)."""
    zone_axes = {material_id: [list(axis) for axis in axes] for material_id, axes in choices.zone_axes.items()}
    return {"key": key, "generated": list(choices.generated), "zone_axes": zone_axes, "refused": list(choices.refused)}


__all__ = ["cached_plan", "plan_path", "plan_key", "library_version", "PLANNING_LIBRARIES", "MAX_PLAN_BYTES",
           "SEARCH_AXES"]
