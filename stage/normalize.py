"""The `Normalizer` the trained model carries: input transform + standardisation, and its inverse.

CBED intensities span several decades (the bright-field disc against weak high-angle scattering),
so each pattern is shifted to a minimum of 0 and compressed (``log1p`` or ``sqrt``) before being
standardised, in intensity-scaled units (`stage.transforms`). Targets (projected potential in
V*Angstrom, projected density in e/Angstrom^2) are standardised only, with the statistics of
`stage.stats`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from namsa.errors import UserError

from .physics_inputs import fit_physics_statistics
from .storeset import open_stores
from .transforms import TRANSFORMS, subtract_pattern_min

def _mean_std(m: Sequence[float]) -> tuple[float, float]:
    n, mean, m2 = m
    std = math.sqrt(m2 / n) if n > 0 else 0.0
    # A constant field (std 0) is only shifted, never divided by ~0.
    return float(mean), float(std if std > 1e-12 else 1.0)


class Normalizer:
    """Input transform + standardisation of cbed, standardisation of targets, and its inverse.

    ``cbed(x)``: x is (S, P, P) or (B, S, P, P) intensities (total 1 per pattern), numpy or torch
    (any device); returns float32: ((f(scale * x - min over the pattern)) - mean) / std with f the
    transform and scale = ``intensity_scale`` (see `stage.transforms`). ``cbed(x, stored_scale=s)``
    takes x already multiplied by s (the raw float16 values of a store).
    ``target(y, name)`` / ``target_inverse(y, name)``: y in physical units (potential: V*Angstrom,
    density: electrons/Angstrom^2) <-> standardised units.
    ``physics_stats`` (name -> (mean, std)) and ``calibration`` (a `namsa.icom.ScanCalibration`
    dict, the training set's typical one) exist when the model takes physics input channels
    (`stage.physics_inputs`); ``physics(maps, names)`` standardises them.
    """

    def __init__(self, transform: str, cbed_mean: float, cbed_std: float,
                 targets: dict[str, tuple[float, float]], intensity_scale: float = 1.0,
                 physics_stats: dict[str, Sequence[float]] | None = None,
                 calibration: dict[str, Any] | None = None):
        if transform not in TRANSFORMS:
            raise UserError(f"unknown cbed transform {transform!r}; use one of {TRANSFORMS}")
        self.transform = transform
        self.cbed_mean = float(cbed_mean)
        self.cbed_std = float(cbed_std)
        self.intensity_scale = float(intensity_scale)
        self.targets = {k: (float(v[0]), float(v[1])) for k, v in targets.items()}
        self.physics_stats = {k: (float(v[0]), float(v[1])) for k, v in (physics_stats or {}).items()}
        self.calibration = calibration

    @classmethod
    def from_statistics(cls, stats: dict[str, Any], transform: str, intensity_scale: float) -> "Normalizer":
        cbed_mean, cbed_std = _mean_std(stats["cbed"][transform])
        targets = {k: _mean_std(v) for k, v in stats.items() if k != "cbed"}
        return cls(transform, cbed_mean, cbed_std, targets, intensity_scale)

    @classmethod
    def fit(cls, paths: Any, transform: str = "log1p", split: str = "train",
            physics_inputs: Sequence[str] = ()) -> "Normalizer":
        """Fit on the ``split`` samples of the stores at ``paths`` from their manifest statistics;
        ``physics_inputs`` also fits those channels' statistics (computed from the samples)."""
        with open_stores(paths) as stores:
            stats = stores.statistics(split)
            if stats["cbed"][transform][0] == 0:
                raise UserError(f"no {split} samples in {stores.describe()}; a Normalizer is fitted on the "
                                f"{split} split: simulate more materials or change data.split_fractions")
            scale = stores.intensity_scale
            physics = fit_physics_statistics(stores, split, physics_inputs) if physics_inputs else {}
        norm = cls.from_statistics(stats, transform, scale)
        norm.physics_stats = {k: (v[0], v[1]) for k, v in physics.get("physics", {}).items()}
        norm.calibration = physics.get("calibration")
        return norm

    def physics(self, maps: Any, names: Sequence[str]) -> Any:
        """Standardise physics maps (K, ...) or (B, K, ...) whose channel k is ``names[k]``, in place."""
        missing = [n for n in names if n not in self.physics_stats]
        if missing:
            raise UserError(f"physics inputs {missing} have no statistics in this Normalizer; the model was "
                            f"trained with {sorted(self.physics_stats) or 'none'}")
        for k, name in enumerate(names):
            mean, std = self.physics_stats[name]
            plane = maps[k] if maps.ndim == 3 else maps[:, k]
            plane -= mean
            plane /= std
        return maps

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
        data = {"transform": self.transform, "cbed_mean": self.cbed_mean, "cbed_std": self.cbed_std,
                "intensity_scale": self.intensity_scale, "targets": {k: list(v) for k, v in self.targets.items()}}
        if self.physics_stats:  # only models with physics inputs carry them (older cards stay valid)
            data["physics"] = {k: list(v) for k, v in self.physics_stats.items()}
            data["calibration"] = self.calibration
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Normalizer":
        try:
            return cls(data["transform"], data["cbed_mean"], data["cbed_std"],
                       {k: tuple(v) for k, v in data["targets"].items()}, data["intensity_scale"],
                       data.get("physics"), data.get("calibration"))
        except (KeyError, TypeError, ValueError, UserError) as exc:
            raise UserError(f"normalizer dict is malformed ({exc}); it must come from Normalizer.to_dict()") from exc

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Normalizer) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return (f"Normalizer(transform={self.transform!r}, intensity_scale={self.intensity_scale:g}, "
                f"cbed_mean={self.cbed_mean:.6g}, cbed_std={self.cbed_std:.6g}, targets={self.targets})")
