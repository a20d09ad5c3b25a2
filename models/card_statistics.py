"""What a model card says its model was trained on, typed and bounded: the ranges of the input's
cheap statistics over the training split (``training_statistics``, `stage.scan_statistics`) and the
loader's dose augmentation (``trained_on.dose_augmentation``, `stage.config.DoseAugmentationConfig`).

The input report (`models.scan_fit.card_checks`) believes these ranges: a scan inside them draws no
warning. So a range is refused at load when it is no range (low above high) or lies outside what its
estimator can give (`STATISTIC_BOUNDS`): a dose range reaching below `namsa.constants.MIN_DOSE_E_PER_A2`
would silence the low-dose check of every scan, a focus of kilometres or a fraction above 1 is a
damaged or made-up card, not a finding.
"""
from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from namsa.constants import MIN_DOSE_E_PER_A2
from stage.config import DoseAugmentationConfig

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

StatisticName = Literal["defocus_A", "scattered_fraction", "high_angle_loss", "dose_e_per_A2"]

#: (low, high) of the values each statistic can take: the focus (Angstrom) of any STEM probe is within
#: 10 micrometres of the specimen; the scattered fraction is a fraction of the detected intensity and
#: the high-angle loss (1 - the mean pattern total) one of the incident probe, which shot noise can
#: push a little below 0; a dose (electrons/Angstrom^2) is at least `MIN_DOSE_E_PER_A2`
STATISTIC_BOUNDS: dict[str, tuple[float, float]] = {
    "defocus_A": (-1e5, 1e5), "scattered_fraction": (0.0, 1.0), "high_angle_loss": (-1.0, 1.0),
    "dose_e_per_A2": (MIN_DOSE_E_PER_A2, math.inf)}


def check_range(where: str, statistic: str, low: float, high: float) -> None:
    """Raise a one-line ValueError naming ``where`` when (low, high) of ``statistic`` is no range or
    leaves its `STATISTIC_BOUNDS`."""
    if low > high:
        raise ValueError(f"{where} is [{low:g}, {high:g}]: low above high, which no training set gives")
    floor, top = STATISTIC_BOUNDS[statistic]
    if low < floor or high > top:
        why = " (below it a pattern holds less than one electron)" if statistic == "dose_e_per_A2" else ""
        raise ValueError(f"{where} [{low:g}, {high:g}] leaves [{floor:g}, {top:g}], the values it can take{why}")


class StatisticRange(BaseModel):
    """One statistic's (low, high) over ``samples`` training stacks, in ``unit`` (`stage.scan_statistics.UNITS`)."""

    model_config = _STRICT

    low: float
    high: float
    samples: Annotated[int, Field(ge=1)]
    unit: Annotated[str, Field(max_length=128)]


class TrainingStatistics(BaseModel):
    """``training_statistics``: the ranges of the input's cheap statistics (`stage.scan_statistics`, of
    estimator ``version``) over the training split, and its probe steps (Angstrom) and semi-angle (mrad);
    a fine-tune's cover its chain's training splits as well (`union_statistics`), which ``note`` says."""

    model_config = _STRICT

    version: Annotated[int, Field(ge=1)]
    split: Annotated[str, Field(max_length=16)]
    samples: Annotated[int, Field(ge=1)]
    ranges: dict[StatisticName, StatisticRange]
    step_A: Annotated[list[Annotated[float, Field(gt=0, le=1e4)]], Field(min_length=2, max_length=2)]
    semiangle_mrad: Annotated[float, Field(gt=0, le=1_000)]
    note: Annotated[str, Field(max_length=1024)] | None = None

    @model_validator(mode="after")
    def _plausible(self) -> "TrainingStatistics":
        for name, r in self.ranges.items():
            check_range(f"ranges.{name}", name, r.low, r.high)
            if r.samples > self.samples:
                raise ValueError(f"ranges.{name} counts {r.samples} samples of a split of {self.samples}")
        if self.step_A[0] > self.step_A[1]:
            raise ValueError(f"step_A {self.step_A} is [smallest, largest] probe step: low above high")
        return self


def union_statistics(parent: TrainingStatistics | None, split: TrainingStatistics | None, parent_name: str,
                     version: int) -> TrainingStatistics | None:
    """A fine-tune's ``training_statistics``: its weights were trained on its chain's training splits, so the
    ranges are the union of ``parent``'s (the card of the model it started from, named ``parent_name``; a
    fine-tune's own a union of its chain's) and this run's ``split``: the lowest low and the highest high of
    each statistic, samples summed, the probe steps' (Angstrom) span joined, the semi-angle (mrad) this run's.
    A parent without statistics of estimator ``version`` (this code's) leaves ``split`` alone, a split that
    could not be measured the parent's; ``note`` says which. None when neither has any."""
    origin = f"{parent_name[:256]} (the model this run was fine-tuned from)"
    if parent is not None and parent.version != version:
        return _noted(split, f"{origin} records statistics of estimator version {parent.version}, not this code's "
                             f"{version}: this run's training split alone")
    if parent is None:
        return _noted(split, f"{origin} records no training statistics: this run's training split alone")
    if split is None:
        return _noted(parent, f"this run's training split could not be measured: the ranges of {origin} alone")
    names = (*parent.ranges, *(n for n in split.ranges if n not in parent.ranges))
    steps = [min(parent.step_A[0], split.step_A[0]), max(parent.step_A[1], split.step_A[1])]
    return TrainingStatistics(version=version, split=split.split, samples=parent.samples + split.samples,
                              ranges={n: _joined(parent.ranges.get(n), split.ranges.get(n)) for n in names},
                              step_A=steps, semiangle_mrad=split.semiangle_mrad,
                              note=f"the union of the training statistics of {parent_name[:256]} ({parent.samples} "
                                   f"stacks), the model this run was fine-tuned from, and of this run's training "
                                   f"split ({split.samples} stacks)")


def _noted(stats: TrainingStatistics | None, note: str) -> TrainingStatistics | None:
    """``stats`` with ``note`` (None stays None)."""
    return None if stats is None else stats.model_copy(update={"note": note})


def _joined(a: StatisticRange | None, b: StatisticRange | None) -> StatisticRange:
    """The union of two ranges of one statistic (either may be missing, not both): lowest low, highest high,
    samples summed."""
    if a is None or b is None:
        return a or b
    return StatisticRange(low=min(a.low, b.low), high=max(a.high, b.high), samples=a.samples + b.samples, unit=b.unit)


class DoseAugmentationRecord(DoseAugmentationConfig):
    """``trained_on.dose_augmentation``: the training's `stage.config.DoseAugmentationConfig`, its range
    checked as the card's other ranges are (`check_range`); the low-dose check reads ``enabled`` and
    ``dose_range_e_per_A2`` (electrons/Angstrom^2), which an enabled augmentation must state."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("dose_range_e_per_A2")
    @classmethod
    def _positive_ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        return value   # the config's own rule, replaced by `_plausible`'s, which names the card's ranges

    @model_validator(mode="after")
    def _plausible(self) -> "DoseAugmentationRecord":
        if "dose_range_e_per_A2" in self.model_fields_set:
            check_range("dose_range_e_per_A2", "dose_e_per_A2", *self.dose_range_e_per_A2)
        elif self.enabled:
            raise ValueError("enabled without a dose_range_e_per_A2: the doses the model was trained at are unknown")
        return self


__all__ = ["StatisticName", "StatisticRange", "TrainingStatistics", "DoseAugmentationRecord", "STATISTIC_BOUNDS",
           "check_range", "union_statistics"]
