"""A store of the model-independent classical reconstructions (ptychography, multislice ptychography),
so that scoring a second model on the same data (another variant, another seed, the final model after a
choice on dev) reuses them instead of iterating again: converged ptychography costs seconds to minutes
per sample, the network milliseconds.

One file per (sample, method, settings): ``<dir>/<method>/<sample_id>-<digest>.npz`` holding the raw
map (physical units, never fitted to the truth) and the facts of its computation (JSON, ``seconds`` =
the original compute time). The sample id ends in the physics hash of its simulation, and the digest
covers every setting of the method and `CACHE_FORMAT`, so a changed sample, setting or kind of map is a
different file, never a stale one: the least-squares-fitted maps of format 1 are simply not found.
Written to a temporary name and renamed: a kill leaves the entry whole or absent.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

#: (map in physical units on the targets' grid, facts of its computation)
Baseline = tuple[np.ndarray, dict[str, Any]]
#: what an entry holds: 1 = maps fitted to the truth (before issue 30), 2 = raw maps in physical units.
CACHE_FORMAT = 2


def settings_digest(settings: Any) -> str:
    """16 hex digits of the JSON of ``settings`` (pydantic models, dicts, numbers) and `CACHE_FORMAT`."""
    payload = json.dumps({"format": CACHE_FORMAT, "settings": settings}, sort_keys=True,
                         default=lambda o: o.model_dump() if hasattr(o, "model_dump") else str(o))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def cached(cache_dir: str | Path | None, method: str, sample_id: str, settings: Any,
           compute: Callable[[], Baseline]) -> Baseline:
    """``compute()``'s (map, facts), from ``cache_dir`` when it holds this sample's entry for these
    settings, else computed and kept there; no cache when ``cache_dir`` is None."""
    if cache_dir is None:
        return compute()
    path = Path(cache_dir) / method / f"{sample_id}-{settings_digest(settings)}.npz"
    if path.is_file():
        with np.load(path) as entry:
            return entry["map"], {**json.loads(str(entry["facts"])), "cached": True}
    result_map, facts = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(partial, "wb") as fh:
        np.savez(fh, map=np.asarray(result_map), facts=np.asarray(json.dumps(facts, default=float)))
    os.replace(partial, path)
    return result_map, facts
