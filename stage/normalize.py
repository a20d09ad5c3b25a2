"""Input transforms, running statistics, and the `Normalizer` the trained model carries.

Intensity scale: a CBED pattern carries total intensity 1 spread over P x P pixels, so a typical
pixel holds ~1/P^2 (1.5e-5 at P = 256). That is below float16's smallest normal number (6.1e-5),
where float16 keeps only a few significant bits, and it makes ``log1p`` a no-op (log1p(x) ~ x).
Both the float16 store and the transforms therefore work on intensities multiplied by
``intensity_scale(P) = 2^min(15, round(log2(P^2)) - 4)`` (mean pixel ~1/16): a power of two, so
scaling is exact, and at most 32768, so a pixel <= 1 never overflows float16 (max 65504).

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
#: values per chunk when accumulating statistics (bounds temporary memory to ~16 MiB of float32).
_STATS_CHUNK_VALUES = 1 << 22
#: at most this many cbed values per sample enter the statistics: beyond it every k-th pattern
#: is used (a 1024 x 256 x 256 stack -> every 16th pattern, 4M values). Means and stds of
#: millions of values are exact to far better than a normalisation needs, and the full-stack
#: pass cost a third of the simulation time per sample (benchmarks/RESULTS.md).
STATS_MAX_VALUES = 1 << 22

Moments = list[float]  # [count, mean, M2] with M2 = sum of squared deviations


def intensity_scale(pattern_px: int) -> float:
    """Power-of-two factor applied to CBED intensities before float16 storage and transforms."""
    exponent = min(15, max(0, round(math.log2(pattern_px * pattern_px)) - 4))
    return float(2 ** exponent)


def subtract_pattern_min(x: Any, inplace: bool = False) -> Any:
    """Shift every pattern (last two axes) to a minimum of 0; numpy or torch, (..., P, P).

    Returns float32 (numpy) or a float32 tensor on the input's device. ``inplace`` reuses a
    float32 numpy input's memory (the loader's own fresh buffer) instead of copying it.
    """
    if isinstance(x, np.ndarray):
        x = x.astype(np.float32, copy=not inplace)
        x -= x.min(axis=(-2, -1), keepdims=True)
        return x
    x = x.float()
    return x - x.amin(dim=(-2, -1), keepdim=True)


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


def combine_all(items: Iterable[Sequence[float]]) -> Moments:
    total: Moments = [0.0, 0.0, 0.0]
    for item in items:
        total = combine(total, item)
    return total


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


def _mean_std(m: Sequence[float]) -> tuple[float, float]:
    n, mean, m2 = m
    std = math.sqrt(m2 / n) if n > 0 else 0.0
    # A constant field (std 0) is only shifted, never divided by ~0.
    return float(mean), float(std if std > 1e-12 else 1.0)


class Normalizer:
    """Input transform + standardisation of cbed, standardisation of targets, and its inverse.

    ``cbed(x)``: x is (S, P, P) or (B, S, P, P) intensities (total 1 per pattern), numpy or torch
    (any device); returns float32: ((f(scale * x - min over the pattern)) - mean) / std with f the
    transform and scale = ``intensity_scale`` (see the module doc). ``cbed(x, stored_scale=s)``
    takes x already multiplied by s (the raw float16 values of a store).
    ``target(y, name)`` / ``target_inverse(y, name)``: y in physical units (potential: V*Angstrom,
    density: electrons/Angstrom^2) <-> standardised units.
    """

    def __init__(self, transform: str, cbed_mean: float, cbed_std: float,
                 targets: dict[str, tuple[float, float]], intensity_scale: float = 1.0):
        if transform not in TRANSFORMS:
            raise UserError(f"unknown cbed transform {transform!r}; use one of {TRANSFORMS}")
        self.transform = transform
        self.cbed_mean = float(cbed_mean)
        self.cbed_std = float(cbed_std)
        self.intensity_scale = float(intensity_scale)
        self.targets = {k: (float(v[0]), float(v[1])) for k, v in targets.items()}

    @classmethod
    def from_statistics(cls, stats: dict[str, Any], transform: str, intensity_scale: float) -> "Normalizer":
        cbed_mean, cbed_std = _mean_std(stats["cbed"][transform])
        targets = {k: _mean_std(v) for k, v in stats.items() if k != "cbed"}
        return cls(transform, cbed_mean, cbed_std, targets, intensity_scale)

    @classmethod
    def fit(cls, paths: Any, transform: str = "log1p", split: str = "train") -> "Normalizer":
        """Fit on the ``split`` samples of the stores at ``paths`` from their manifest statistics."""
        from .store import open_stores  # local: store imports this module

        with open_stores(paths) as stores:
            stats = stores.statistics(split)
            if stats["cbed"][transform][0] == 0:
                raise UserError(f"no {split} samples in {stores.describe()}; a Normalizer is fitted on the "
                                f"{split} split: simulate more materials or change data.split_fractions")
            scale = stores.intensity_scale
        return cls.from_statistics(stats, transform, scale)

    def cbed(self, x: Any, inplace: bool = False, stored_scale: float = 1.0) -> Any:
        if self.transform not in TRANSFORMS:
            raise UserError(f"unknown cbed transform {self.transform!r}; use one of {TRANSFORMS}")
        out = subtract_pattern_min(x, inplace=inplace)
        factor = self.intensity_scale / stored_scale
        if factor != 1.0:
            out *= factor
        if self.transform == "log1p":
            out = np.log1p(out, out=out) if isinstance(out, np.ndarray) else out.log1p_()
        elif self.transform == "sqrt":
            out = np.sqrt(out, out=out) if isinstance(out, np.ndarray) else out.sqrt_()
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
                "intensity_scale": self.intensity_scale, "targets": {k: list(v) for k, v in self.targets.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Normalizer":
        try:
            return cls(data["transform"], data["cbed_mean"], data["cbed_std"],
                       {k: tuple(v) for k, v in data["targets"].items()}, data["intensity_scale"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"normalizer dict is malformed ({exc}); it must come from Normalizer.to_dict()") from exc

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Normalizer) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return (f"Normalizer(transform={self.transform!r}, intensity_scale={self.intensity_scale:g}, "
                f"cbed_mean={self.cbed_mean:.6g}, cbed_std={self.cbed_std:.6g}, targets={self.targets})")
