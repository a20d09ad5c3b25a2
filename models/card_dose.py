"""A model card's error-vs-dose curve (``dose_response``), typed and bounded, and what it says at one dose.

`namsa evaluate` with ``evaluation.doses`` scores the network and the swept baselines on the same
Poisson-noised patterns at each dose (`evaluation.dose_sweep`); scripts/card_dose_curve.py runs that on
a dev store simulated at the card's physics and records, per dose (electrons/Angstrom^2), each method's
relative L2 under the field's rule (the map in its own units with only its mean taken from the truth:
metrics.json's ``aggregates[target][method]["field"]["rel_l2"]``) for the network, the mean training
target (the mean image) and iCoM, and once the constant map's (the truth's mean everywhere). The input
report (`models.scan_fit.card_checks`) reads it to say, for a scan's measured dose, which error the card
measured there and whether the maps are unusable.

The unusable rule (`DoseResponse.unusable`, from measured figures only): the maps at a dose are
**unusable** when the network's potential error there is not shown to be below that of a map that
ignores the data, i.e. the upper end of the network's interval (bootstrap over materials) reaches the
lower of the mean image's and the constant map's mean errors. Both maps are the same whatever the scan
(the mean image averages training targets; the constant map is only the truth's mean, which the
field's rule hands every method), so a network that does not demonstrably beat them has read nothing
usable from the patterns at that dose. The constant map is there because a mean image averaged over a
small training store keeps the columns of its heaviest samples and scores worse than no structure at
all (the flagship's curve: 0.69 against 0.37), which would make the rule too lenient.
"""
from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
Error = Annotated[float, Field(ge=0.0)]
Text = Annotated[str, Field(min_length=1, max_length=1024)]


class ErrorStat(BaseModel):
    """One method's relative L2 (field's rule; dimensionless, >= 0) over the curve's samples at one dose:
    the ``mean`` with its bootstrap interval [``low``, ``high``] over materials and the ``median``."""

    model_config = _STRICT

    mean: Error
    low: Error
    high: Error
    median: Error

    @model_validator(mode="after")
    def _interval(self) -> "ErrorStat":
        if self.low > self.high:
            raise ValueError(f"interval [{self.low:g}, {self.high:g}] has its low end above its high end")
        return self


class MethodErrors(BaseModel):
    """One target's errors at one dose: the network, the mean image (the mean training target, a map
    that ignores the data) and iCoM (potential only; None for the density)."""

    model_config = _STRICT

    network: ErrorStat
    mean_image: ErrorStat
    icom: ErrorStat | None = None


class ConstantErrors(BaseModel):
    """The constant map's error (the truth's mean in every pixel: under the field's rule, the map of a
    method that reads nothing from the scan) per target over the curve's samples; no dose changes it."""

    model_config = _STRICT

    potential: ErrorStat
    density: ErrorStat | None = None


class DosePoint(BaseModel):
    """The errors at one dose (electrons/Angstrom^2, > 0) per target the model predicts."""

    model_config = _STRICT

    dose_e_per_A2: Annotated[float, Field(gt=0.0)]
    potential: MethodErrors
    density: MethodErrors | None = None


class DoseEstimate(BaseModel):
    """What the curve says at one dose: the errors (interpolated, or the nearest end's), how they were
    read (``how``: one phrase) and whether the rule calls the maps unusable there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    network: float
    network_high: float
    mean_image: float
    constant: float
    icom: float | None
    how: str
    unusable: bool


class DoseResponse(BaseModel):
    """``dose_response``: the error-vs-dose curve the card measured (see the module docstring for the
    unusable rule). ``points`` ascend in dose; ``split`` and ``n_samples`` / ``n_materials`` say what was
    scored, ``mean_image_samples`` how many training samples the mean image averages, ``symmetry_average``
    whether the network's maps were averaged over the 8 turns (as `namsa reconstruct` does),
    ``ci_level`` the intervals' level, ``command`` what measured it and ``measured`` when (ISO date);
    ``constant_map`` the constant map's errors over the same samples."""

    model_config = _STRICT

    view: Literal["field"]
    metric: Literal["rel_l2"]
    split: Text
    n_samples: Annotated[int, Field(ge=1)]
    n_materials: Annotated[int, Field(ge=1)]
    mean_image_samples: Annotated[int, Field(ge=1)]
    symmetry_average: bool
    ci_level: Annotated[float, Field(gt=0.0, lt=1.0)]
    command: Text
    measured: Text
    constant_map: ConstantErrors
    points: Annotated[list[DosePoint], Field(min_length=1, max_length=64)]

    @model_validator(mode="after")
    def _ascending(self) -> "DoseResponse":
        doses = [p.dose_e_per_A2 for p in self.points]
        for before, after in zip(doses, doses[1:]):
            if after <= before:
                raise ValueError(f"doses must ascend: {after:g} e/Angstrom^2 follows {before:g}; list the points "
                                 f"from the lowest dose up, each dose once")
        return self

    @property
    def doses(self) -> list[float]:
        """The curve's doses, electrons/Angstrom^2, ascending."""
        return [p.dose_e_per_A2 for p in self.points]

    def at(self, dose: float) -> DoseEstimate:
        """The curve's potential errors at ``dose`` (e/Angstrom^2): a measured dose's own, linear in log
        dose between the two measured doses around it, the nearest end's outside the measured range
        (below it the data carry less than the curve's lowest dose: the error there is a lower bound)."""
        doses, first, last = self.doses, self.points[0], self.points[-1]
        same = next((p for p in self.points if math.isclose(dose, p.dose_e_per_A2, rel_tol=1e-3)), None)
        if same is not None:
            said = f"measured at {same.dose_e_per_A2:g} e/Angstrom^2"
            return self._estimate(same.potential, same.potential, 0.0, said)
        if dose < doses[0]:
            return self._estimate(first.potential, first.potential, 0.0,
                                  f"at the curve's lowest dose, {doses[0]:g} e/Angstrom^2: less dose, more error")
        if dose > doses[-1]:
            return self._estimate(last.potential, last.potential, 0.0,
                                  f"at the curve's highest dose, {doses[-1]:g} e/Angstrom^2")
        upper = next(i for i, d in enumerate(doses) if d > dose)
        lo, hi = self.points[upper - 1], self.points[upper]
        w = math.log(dose / lo.dose_e_per_A2) / math.log(hi.dose_e_per_A2 / lo.dose_e_per_A2)
        how = f"interpolated in log dose between {lo.dose_e_per_A2:g} and {hi.dose_e_per_A2:g} e/Angstrom^2"
        return self._estimate(lo.potential, hi.potential, w, how)

    def _estimate(self, lo: MethodErrors, hi: MethodErrors, w: float, how: str) -> DoseEstimate:
        """The errors ``w`` of the way from ``lo`` to ``hi`` (0: ``lo``), and the unusable rule on them."""
        def mix(a: float, b: float) -> float:
            return (1.0 - w) * a + w * b

        network, high = mix(lo.network.mean, hi.network.mean), mix(lo.network.high, hi.network.high)
        mean_image, constant = mix(lo.mean_image.mean, hi.mean_image.mean), self.constant_map.potential.mean
        icom = mix(lo.icom.mean, hi.icom.mean) if lo.icom is not None and hi.icom is not None else None
        return DoseEstimate(network=network, network_high=high, mean_image=mean_image, constant=constant, icom=icom,
                            how=how, unusable=high >= min(mean_image, constant))

    def unusable(self, dose: float) -> bool:
        """Whether the maps at ``dose`` (e/Angstrom^2) are unusable by the rule of the module docstring."""
        return self.at(dose).unusable


__all__ = ["DoseResponse", "DosePoint", "ConstantErrors", "MethodErrors", "ErrorStat", "DoseEstimate"]
