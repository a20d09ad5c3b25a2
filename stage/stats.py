"""Running statistics of the stored samples: per-sample moments at write time, merged per split.

Statistics are accumulated per sample at write time (Chan et al. 1979 parallel variance), stored
in the manifest per split, and combined here, so fitting a `Normalizer` never re-reads data.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .transforms import TRANSFORMS, subtract_pattern_min

#: values per chunk when accumulating statistics (bounds temporary memory to ~16 MiB of float32).
_STATS_CHUNK_VALUES = 1 << 22
#: at most this many cbed values per sample enter the statistics: beyond it every k-th pattern
#: is used (a 1024 x 256 x 256 stack -> every 16th pattern, 4M values). Means and stds of
#: millions of values are exact to far better than a normalisation needs, and the full-stack
#: pass cost a third of the simulation time per sample (benchmarks/RESULTS.md).
STATS_MAX_VALUES = 1 << 22

Moments = list[float]  # [count, mean, M2] with M2 = sum of squared deviations


def moments(values: np.ndarray) -> Moments:
    """[count, mean, M2] of ``values``; float32 arithmetic with float64 (pairwise) accumulation,
    which keeps the relative error near 1e-7 without float64 copies of large stacks."""
    flat = np.asarray(values).ravel()
    if flat.size == 0:
        return [0.0, 0.0, 0.0]
    mean = float(np.add.reduce(flat, dtype=np.float64)) / flat.size
    dev = flat - flat.dtype.type(mean) if flat.dtype.kind == "f" else flat.astype(np.float64) - mean
    dev *= dev
    return [float(flat.size), mean, float(np.add.reduce(dev, dtype=np.float64))]


def combine(a: Sequence[float], b: Sequence[float]) -> Moments:
    """Merge two [count, mean, M2] triples (Chan, Golub & LeVeque 1979)."""
    na, ma, m2a = a
    nb, mb, m2b = b
    n = na + nb
    if n == 0:
        return [0.0, 0.0, 0.0]
    delta = mb - ma
    return [n, ma + delta * nb / n, m2a + m2b + delta * delta * na * nb / n]


def sample_statistics(cbed: np.ndarray, targets: dict[str, np.ndarray], scale: float = 1.0) -> dict[str, Any]:
    """Moments of the transformed cbed (every transform) and of each target, for one sample.

    ``cbed`` should be the array as stored (after the float16 cast) and ``scale`` the factor that
    takes it to intensity-scaled units (``intensity_scale(P) / storage scale``), so the statistics
    describe exactly what the Normalizer will see. Large stacks are subsampled by pattern
    (``STATS_MAX_VALUES``); targets always use every value.
    """
    per_transform = {t: [0.0, 0.0, 0.0] for t in TRANSFORMS}
    pattern_values = max(1, int(np.prod(cbed.shape[1:])))
    stride = max(1, -(-cbed.size // STATS_MAX_VALUES))
    cbed = cbed[::stride]
    step = max(1, _STATS_CHUNK_VALUES // pattern_values)
    for start in range(0, cbed.shape[0], step):
        shifted = subtract_pattern_min(cbed[start: start + step])  # shared by all three transforms
        if scale != 1.0:
            shifted *= np.float32(scale)
        for name, values in (("none", shifted), ("sqrt", np.sqrt(shifted)), ("log1p", np.log1p(shifted))):
            per_transform[name] = combine(per_transform[name], moments(values))
    stats: dict[str, Any] = {"cbed": per_transform}
    for name, array in targets.items():
        stats[name] = moments(array)
    return stats


def merge_statistics(items: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Combine per-sample (or per-store) statistics dicts of the shape `sample_statistics` returns."""
    merged: dict[str, Any] = {"cbed": {t: [0.0, 0.0, 0.0] for t in TRANSFORMS}}
    for item in items:
        for t, m in item.get("cbed", {}).items():
            merged["cbed"][t] = combine(merged["cbed"].get(t, [0.0, 0.0, 0.0]), m)
        for name, m in item.items():
            if name != "cbed":
                merged[name] = combine(merged.get(name, [0.0, 0.0, 0.0]), m)
    return merged
