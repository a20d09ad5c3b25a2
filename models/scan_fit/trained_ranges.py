"""What a reconstructor was trained on, one figure per range, from its card: the focus (relative to the
specimen's middle), the thickness, the probe step and the dose.

Every warning that names a training range (card_checks.py, thickness.py, the scan fit of fit.py through
`ModelExpectation`), the ranges table docs/experimental-data.md prints (expectation.py `ranges_table`)
and reconstruction.json read these; no other code states a training range. Each range says where it
comes from (``source``): the card's training config (``expects_input``: what the samples were simulated
with) where it states the range, else what the trainer measured over the training split
(``training_statistics``).
"""
from __future__ import annotations

from dataclasses import dataclass

from stage.scan_statistics import STATISTICS_VERSION

from ..card import ModelCard, TrainingStatistics

#: the unit of a focus: where the parallax estimator reads it (`stage.scan_statistics.parallax_defocus`)
DEFOCUS_UNIT = "Angstrom (focus relative to the specimen's middle, + = overfocus)"
#: what a range read from the training split's statistics says it is
MEASURED = "measured over {n} training samples"


@dataclass(frozen=True)
class TrainedRange:
    """(``low``, ``high``) in ``unit``, and where the card gave it (``source``)."""

    low: float
    high: float
    unit: str
    source: str

    def span(self) -> tuple[float, float]:
        return self.low, self.high

    def said(self, digits: str = ".0f") -> str:
        """``low..high`` in words for a warning: ``-35..115``."""
        return f"{self.low:{digits}}..{self.high:{digits}}"


@dataclass(frozen=True)
class TrainedRanges:
    """A card's training ranges (None where the card states none): ``defocus_A`` (Angstrom, the focus
    relative to the specimen's middle, + = overfocus, as `stage.scan_statistics.parallax_defocus` reads a
    file), ``thickness_A`` (Angstrom), ``scan_step_A`` (Angstrom, either axis), ``dose_e_per_A2``
    (electrons/Angstrom^2; None: trained noise-free only)."""

    defocus_A: TrainedRange | None
    thickness_A: TrainedRange | None
    scan_step_A: TrainedRange | None
    dose_e_per_A2: TrainedRange | None

    @classmethod
    def of(cls, card: ModelCard) -> "TrainedRanges":
        return cls(defocus_A=_defocus(card), thickness_A=_thickness(card), scan_step_A=_scan_step(card),
                   dose_e_per_A2=_dose(card))


def trained_ranges(card: ModelCard) -> TrainedRanges:
    """The training ranges of ``card`` (`TrainedRanges`)."""
    return TrainedRanges.of(card)


def current_statistics(card: ModelCard) -> TrainingStatistics | None:
    """The card's training statistics when this code's estimators (`STATISTICS_VERSION`) wrote them."""
    stats = card.training_statistics
    return stats if stats is not None and stats.version == STATISTICS_VERSION else None


def trained_dose_range(card: ModelCard) -> tuple[float, float] | None:
    """(low, high) electrons/Angstrom^2 the model saw in training (`TrainedRanges.dose_e_per_A2`), or
    None when it was trained noise-free only."""
    dose = _dose(card)
    return None if dose is None else dose.span()


def _defocus(card: ModelCard) -> TrainedRange | None:
    """The focus range: the training config's C1 range at the entrance surface (namsa sets C1 there) plus
    half of each thickness (a specimen is imaged from its middle), else the range the trainer's parallax
    estimator read over the training split."""
    unit = DEFOCUS_UNIT
    if card.expects_input is not None:
        cfg = card.expects_input.simulation_config()
        c1, (low, high) = cfg.aberrations.C1_A, cfg.variations.defocus_range_A
        t_low, t_high = cfg.variations.thickness_range_A or (cfg.thickness_A, cfg.thickness_A)
        return TrainedRange(c1 + low + t_low / 2, c1 + high + t_high / 2, unit,
                            f"training config: C1 {c1 + low:g}..{c1 + high:g} A at the entrance surface of "
                            f"{t_low:g}-{t_high:g} A thick specimens")
    stats = current_statistics(card)
    measured = stats.ranges.get("defocus_A") if stats is not None else None
    if measured is None:
        return None
    return TrainedRange(measured.low, measured.high, unit, MEASURED.format(n=measured.samples))


def _thickness(card: ModelCard) -> TrainedRange | None:
    """The training config's ``variations.thickness_range_A`` (else its one ``thickness_A``); namsa builds
    whole unit cells at least that thick, so the realised ends lie up to one cell above."""
    if card.expects_input is None:
        return None
    cfg = card.expects_input.simulation_config()
    low, high = cfg.variations.thickness_range_A or (cfg.thickness_A, cfg.thickness_A)
    return TrainedRange(float(low), float(high), "Angstrom", "training config; whole unit cells, so up to one "
                                                             "cell thicker")


def _scan_step(card: ModelCard) -> TrainedRange | None:
    """The probe steps the training config allows (`namsa.sampling.config_sampling`: supercells of 1-2 x
    its lateral cell), widened to those the trainer measured over the training split: a material whose
    unit cell is wider than twice the lateral cell gives larger steps, which only the measurement shows
    (and a few measured samples span less than the config, which the config's span keeps)."""
    stats = current_statistics(card)
    measured = None if stats is None else (float(stats.step_A[0]), float(stats.step_A[1]))
    planned = None if card.expects_input is None else tuple(float(v) for v in card.expects_input.sampling.step_A)
    if planned is None and measured is None:
        return None
    if planned is None or measured is None or (measured[0] >= planned[0] and measured[1] <= planned[1]):
        low, high = planned or measured
        return TrainedRange(low, high, "Angstrom", "training config" if planned else MEASURED.format(n=stats.samples))
    return TrainedRange(min(planned[0], measured[0]), max(planned[1], measured[1]), "Angstrom",
                        f"training config {planned[0]:.4g}-{planned[1]:.4g}, "
                        f"{MEASURED.format(n=stats.samples)} {measured[0]:.4g}-{measured[1]:.4g}")


def _dose(card: ModelCard) -> TrainedRange | None:
    """The loader's dose augmentation, else the doses measured in the training split's counted patterns,
    else one fixed simulated dose; None when the model was trained noise-free only."""
    unit = "electrons/Angstrom^2"
    augmentation = card.trained_on.dose_augmentation if card.trained_on else None
    if augmentation is not None and augmentation.enabled and augmentation.dose_range_e_per_A2 is not None:
        low, high = augmentation.dose_range_e_per_A2
        return TrainedRange(float(low), float(high), unit, "the loader's dose augmentation")
    stats = card.training_statistics
    measured = stats.ranges.get("dose_e_per_A2") if stats is not None else None
    if measured is not None:
        return TrainedRange(measured.low, measured.high, unit, MEASURED.format(n=measured.samples))
    variations = card.expects_input.variations if card.expects_input else None
    fixed = variations.dose_e_per_A2 if variations is not None else None
    return None if fixed is None else TrainedRange(float(fixed), float(fixed), unit, "training config")


__all__ = ["DEFOCUS_UNIT", "TrainedRange", "TrainedRanges", "trained_ranges", "trained_dose_range", "current_statistics"]
