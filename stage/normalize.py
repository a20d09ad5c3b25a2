"""Input transforms, running statistics, and the `Normalizer` the trained model carries.

CBED intensities span several decades (the bright-field disc against weak high-angle scattering),
so each pattern is shifted to a minimum of 0 and compressed (``log1p`` or ``sqrt``) before being
standardised. Targets (projected potential in V*Angstrom, projected density in e/Angstrom^2) are
standardised only. Statistics are accumulated per sample at write time (Chan et al. 1979 parallel
variance), stored in the manifest per split, and combined here, so fitting never re-reads data.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from namsa.errors import UserError

TRANSFORMS: tuple[str, ...] = ("none", "log1p", "sqrt")
TARGET_NAMES: tuple[str, ...] = ("potential", "density")
#: values per chunk when accumulating statistics (bounds temporary memory to ~32 MiB of float64).
_STATS_CHUNK_VALUES = 1 << 22

Moments = list[float]  # [count, mean, M2] with M2 = sum of squared deviations


def transform_cbed(x: Any, transform: str, inplace: bool = False) -> Any:
    """Subtract each pattern's minimum, then apply ``transform``; numpy or torch, (..., P, P).

    Returns float32 (numpy) or float32 tensors (torch) on the input's device. ``inplace`` reuses
    a float32 numpy input's memory (the loader's own fresh buffer) instead of copying it.
    """
    if transform not in TRANSFORMS:
        raise UserError(f"unknown cbed transform {transform!r}; use one of {TRANSFORMS}")
    if isinstance(x, np.ndarray):
        x = x.astype(np.float32, copy=not inplace)
        x -= x.min(axis=(-2, -1), keepdims=True)
        if transform == "log1p":
            np.log1p(x, out=x)
        elif transform == "sqrt":
            np.sqrt(x, out=x)
        return x
    x = x.float()
    x = x - x.amin(dim=(-2, -1), keepdim=True)
    if transform == "log1p":
        return x.log1p_()
    if transform == "sqrt":
        return x.sqrt_()
    return x


def moments(values: np.ndarray) -> Moments:
    """[count, mean, M2] of ``values`` accumulated in float64."""
    flat = np.asarray(values, dtype=np.float64).ravel()
    if flat.size == 0:
        return [0.0, 0.0, 0.0]
    mean = float(flat.mean())
    return [float(flat.size), mean, float(np.square(flat - mean).sum())]


def combine(a: Sequence[float], b: Sequence[float]) -> Moments:
    """Merge two [count, mean, M2] triples (Chan, Golub & LeVeque 1979)."""
    na, ma, m2a = a
    nb, mb, m2b = b
    n = na + nb
    if n == 0:
        return [0.0, 0.0, 0.0]
    delta = mb - ma
    return [n, ma + delta * nb / n, m2a + m2b + delta * delta * na * nb / n]


def combine_all(items: Iterable[Sequence[float]]) -> Moments:
    total: Moments = [0.0, 0.0, 0.0]
    for item in items:
        total = combine(total, item)
    return total


def sample_statistics(cbed: np.ndarray, targets: dict[str, np.ndarray]) -> dict[str, Any]:
    """Moments of the transformed cbed (every transform) and of each target, for one sample.

    ``cbed`` should be the array as stored (after the float16 cast), so the statistics describe
    exactly what readers will see.
    """
    per_transform = {t: [0.0, 0.0, 0.0] for t in TRANSFORMS}
    step = max(1, _STATS_CHUNK_VALUES // max(1, int(np.prod(cbed.shape[1:]))))
    for start in range(0, cbed.shape[0], step):
        chunk = cbed[start: start + step]
        for name in TRANSFORMS:
            per_transform[name] = combine(per_transform[name], moments(transform_cbed(chunk, name)))
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


def _mean_std(m: Sequence[float]) -> tuple[float, float]:
    n, mean, m2 = m
    std = math.sqrt(m2 / n) if n > 0 else 0.0
    # A constant field (std 0) is only shifted, never divided by ~0.
    return float(mean), float(std if std > 1e-12 else 1.0)


class Normalizer:
    """Input transform + standardisation of cbed, standardisation of targets, and its inverse.

    ``cbed(x)``: x is (S, P, P) or (B, S, P, P), numpy or torch (any device); returns float32.
    ``target(y, name)`` / ``target_inverse(y, name)``: y in physical units (potential: V*Angstrom,
    density: electrons/Angstrom^2) <-> standardised units.
    """

    def __init__(self, transform: str, cbed_mean: float, cbed_std: float,
                 targets: dict[str, tuple[float, float]]):
        if transform not in TRANSFORMS:
            raise UserError(f"unknown cbed transform {transform!r}; use one of {TRANSFORMS}")
        self.transform = transform
        self.cbed_mean = float(cbed_mean)
        self.cbed_std = float(cbed_std)
        self.targets = {k: (float(v[0]), float(v[1])) for k, v in targets.items()}

    @classmethod
    def from_statistics(cls, stats: dict[str, Any], transform: str) -> "Normalizer":
        cbed_mean, cbed_std = _mean_std(stats["cbed"][transform])
        targets = {k: _mean_std(v) for k, v in stats.items() if k != "cbed"}
        return cls(transform, cbed_mean, cbed_std, targets)

    @classmethod
    def fit(cls, paths: Any, transform: str = "log1p", split: str = "train") -> "Normalizer":
        """Fit on the ``split`` samples of the stores at ``paths`` from their manifest statistics."""
        from .store import open_stores  # local: store imports this module

        with open_stores(paths) as stores:
            stats = stores.statistics(split)
            if stats["cbed"][transform][0] == 0:
                raise UserError(f"no {split} samples in {stores.describe()}; a Normalizer is fitted on the "
                                f"{split} split: simulate more materials or change data.split_fractions")
        return cls.from_statistics(stats, transform)

    def cbed(self, x: Any, inplace: bool = False) -> Any:
        out = transform_cbed(x, self.transform, inplace=inplace)
        out -= self.cbed_mean
        out /= self.cbed_std
        return out

    def target(self, y: Any, name: str) -> Any:
        mean, std = self._target_stats(name)
        return (y - mean) / std

    def target_inverse(self, y: Any, name: str) -> Any:
        mean, std = self._target_stats(name)
        return y * std + mean

    def _target_stats(self, name: str) -> tuple[float, float]:
        if name not in self.targets:
            raise UserError(f"target {name!r} has no statistics in this Normalizer; known: {sorted(self.targets)}")
        return self.targets[name]

    def to_dict(self) -> dict[str, Any]:
        return {"transform": self.transform, "cbed_mean": self.cbed_mean, "cbed_std": self.cbed_std,
                "targets": {k: list(v) for k, v in self.targets.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Normalizer":
        try:
            return cls(data["transform"], data["cbed_mean"], data["cbed_std"],
                       {k: tuple(v) for k, v in data["targets"].items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"normalizer dict is malformed ({exc}); it must come from Normalizer.to_dict()") from exc

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Normalizer) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return (f"Normalizer(transform={self.transform!r}, cbed_mean={self.cbed_mean:.6g}, "
                f"cbed_std={self.cbed_std:.6g}, targets={self.targets})")
