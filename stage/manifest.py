"""The store's JSON: sealed info/index entries, the manifest derived from them, and the schema version."""
from __future__ import annotations

import functools
import json
import re
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import lmdb

from namsa.targets import TARGETS_VERSION

from . import codec
from .errors import CorruptRecordError, SchemaError, StoreError
from .layout import MANIFEST_NAME
from .splits import SPLITS
from .stats import merge_statistics
from .transforms import intensity_scale

SCHEMA_VERSION = 1
FORMAT_NAME = "namsa-store"
_INFO_KEY = b"store"


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """Installed package version, the data version of the targets (`namsa.targets.TARGETS_VERSION`,
    so stores written with other targets are told apart) and the git commit of the source tree
    when there is one, e.g. ``0.1.0+targets2.abc1234`` (the one code version of manifests,
    checkpoints and model cards; cached: one git call a process)."""
    try:
        version = metadata.version("namsa")
    except metadata.PackageNotFoundError:
        version = "unknown"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    local = f"targets{TARGETS_VERSION}" + (f".{commit}" if commit else "")
    return f"{version}+{local}"


def targets_version(version: str | None) -> int:
    """The targets' data version a `code_version` string names (``+targets<N>``); 1 for the code
    versions written before the tag existed (the hard-cutoff targets, before 2026-11-24)."""
    found = re.search(r"\+targets(\d+)", str(version or ""))
    return int(found.group(1)) if found else 1


def _json_seal(obj: Any) -> bytes:
    return codec.seal(json.dumps(obj, separators=(",", ":"), sort_keys=True).encode())


def _json_unseal(buf: bytes | memoryview) -> Any:
    return json.loads(bytes(codec.unseal(buf)))


def _check_schema_version(path: Path, version: Any, where: str) -> None:
    if not isinstance(version, int):
        raise SchemaError(f"store {path}: {where} has no integer schema_version; it was not written by namsa")
    if version > SCHEMA_VERSION:
        raise SchemaError(f"store {path} was written with store schema v{version} but this namsa reads up to "
                          f"v{SCHEMA_VERSION}; upgrade namsa to read it")


def build_manifest(path: Path, info: dict[str, Any], index: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The manifest of a store, derived entirely from its LMDB info and index databases."""
    ids = sorted(index)
    counts = {s: 0 for s in SPLITS}
    per_split: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for sid in ids:
        entry = index[sid]
        counts[entry["split"]] += 1
        per_split[entry["split"]].append(entry["stats"])
    return {
        "format": FORMAT_NAME,
        "schema_version": info.get("schema_version", SCHEMA_VERSION),
        "code_version": info.get("code_version", code_version()),
        "config_hash": info.get("config_hash"),
        "cbed_dtype": info.get("cbed_dtype"),
        "compression": info.get("compression"),
        "checksum": codec.CHECKSUM_NAME,
        "arrays": info.get("arrays", {}),
        "split_fractions": info.get("split_fractions"),
        "split_seed": info.get("split_seed"),
        "count": len(ids),
        "counts": counts,
        "bytes": int(sum(index[s]["nbytes"] for s in ids)),
        "samples": [{"id": sid, "split": index[sid]["split"], "material_id": index[sid]["material_id"]}
                    for sid in ids],
        "statistics": {s: merge_statistics(per_split[s]) for s in SPLITS},
        "intensity_scale": (intensity_scale(info["arrays"]["cbed"]["shape"][-1])
                            if info.get("arrays") else None),
        "created": info.get("created"),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _read_info_and_index(env: lmdb.Environment, dbs: dict[bytes, Any], path: Path
                         ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    with env.begin(buffers=True) as txn:
        raw_info = txn.get(_INFO_KEY, db=dbs[b"info"])
        try:
            info = _json_unseal(raw_info) if raw_info is not None else {}
        except (codec.RecordCorrupt, ValueError) as exc:
            raise CorruptRecordError(str(path), "info", str(exc)) from exc
        index = {}
        for key, value in txn.cursor(db=dbs[b"index"]):
            sid = bytes(key).decode()
            try:
                index[sid] = _json_unseal(value)
            except (codec.RecordCorrupt, ValueError) as exc:
                raise CorruptRecordError(str(path), f"index/{sid}", str(exc)) from exc
    return info, index


def _load_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_text())
    except PermissionError as exc:
        raise StoreError(f"permission denied reading {path / MANIFEST_NAME}; fix its permissions") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{path / MANIFEST_NAME} is not valid JSON ({exc}); delete it and open the "
                          f"store with a writer to rebuild it") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise SchemaError(f"{path / MANIFEST_NAME} is not a {FORMAT_NAME} manifest; point at a store "
                          f"directory written by namsa")
    return manifest
