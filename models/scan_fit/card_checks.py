"""Checks of a scan against a model's card: the maps after inference (`namsa reconstruct`) and the
stack `Reconstructor.predict` is given. Both write the report of stage.microscope.checks
({"warnings": [...], "measured": {...}}); what the model was trained on is read from its typed card
(`models.card.ModelCard`), its sampling from `ExpectsInput.sampling` (namsa.sampling)."""
from __future__ import annotations

import warnings
from typing import Any, Mapping

import numpy as np

from stage.microscope import autocal
from stage.microscope.checks import (NORMALISED_TOTAL, RADIUS_ATOL_PX, RADIUS_RTOL, add_measurement, add_warning,
                                     new_report)

from ..card import ModelCard

#: a map above the training mean + this many training standard deviations is far outside
MAP_SIGMAS = 6.0
#: more than this fraction of negative pixels: a potential / density no specimen has
NEGATIVE_FRACTION = 0.5
#: above this dose (electrons/Angstrom^2; ~1e7 electrons per pattern at the study's 0.375 A step) shot
#: noise is below a part in 3,000 of a pattern's total: the data count as noise-free and no dose
#: warning is given (a quantum found in synthetic or rescaled float data implies absurd doses)
NOISE_FREE_DOSE_E_PER_A2 = 1e8


class OutsideTrainingWarning(UserWarning):
    """An input (or output) lies outside what the model learned; the result may not be trusted."""


def check_after_inference(maps: Mapping[str, np.ndarray], card: ModelCard,
                          before: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Plausibility of the output ``maps`` (name -> (T, T) array, physical units) against the
    card's training targets (normaliser mean, std), and the measured dose against the card's."""
    report = new_report()
    units = card.target_units or {}
    for name, (mean, std) in card.normalizer.targets.items():
        if name not in maps:
            continue
        m = np.asarray(maps[name], dtype=np.float64)
        negative, top = float(np.mean(m < 0)), float(m.max())
        limit = mean + MAP_SIGMAS * std
        add_measurement(report, f"{name}_range", [float(m.min()), top], units.get(name, ""),
                        negative_fraction=negative, training_mean=mean, training_std=std)
        if negative > NEGATIVE_FRACTION:
            add_warning(report, f"{name}-negative", f"{100 * negative:.0f}% of the {name} map is negative, which "
                                                    "no specimen gives: the input is outside what the model learned")
        if top > limit:
            add_warning(report, f"{name}-too-large", f"the {name} map reaches {top:.4g} {units.get(name, '')}, "
                                                     f"above the training mean + {MAP_SIGMAS:g} sd ({limit:.4g}): "
                                                     "implausible")
    dose = ((before or {}).get("measured") or {}).get("dose_e_per_A2")
    if dose:
        _check_dose(report, dose["value"], card)
    return report


def trained_dose_range(card: ModelCard) -> tuple[float, float] | None:
    """(low, high) electrons/Angstrom^2 the model saw in training (the loader's dose augmentation, or
    one fixed simulated dose), or None when it was trained noise-free only."""
    augmentation = (card.trained_on.dose_augmentation if card.trained_on else None) or {}
    if augmentation.get("enabled"):
        low, high = augmentation["dose_range_e_per_A2"]
        return float(low), float(high)
    variations = (card.expects_input.variations if card.expects_input else None) or {}
    fixed = variations.get("dose_e_per_A2")
    return None if fixed is None else (float(fixed), float(fixed))


def _check_dose(report: dict[str, Any], dose: float, card: ModelCard) -> None:
    """Warn when a measured dose (e/Angstrom^2) lies below what the model was trained at; above the
    noise-free threshold, or inside the trained range, there is nothing to say."""
    trained = trained_dose_range(card)
    if dose >= NOISE_FREE_DOSE_E_PER_A2 or (trained is not None and dose >= trained[0]):
        return
    if trained is None:
        message = (f"the data carry about {dose:.3g} e/Angstrom^2 but the model was trained noise-free; expect "
                   "more error at low dose")
    else:
        message = (f"the data carry about {dose:.3g} e/Angstrom^2, below the {trained[0]:g}-{trained[1]:g} "
                   "e/Angstrom^2 the model was trained at; expect more error")
    add_warning(report, "dose", message)


def input_report(cbed: np.ndarray, card: ModelCard) -> dict[str, Any]:
    """Cheap checks of a (S, P, P) stack given to `Reconstructor.predict` against the card: total
    intensity per pattern, the dose its quantisation implies, the disc radius vs the card's
    semi-angle and sampling. Uses at most 64 patterns."""
    report = new_report()
    sample = np.asarray(cbed[:: max(1, len(cbed) // 64)], dtype=np.float64)
    total = float(sample.sum(axis=(1, 2)).mean())
    add_measurement(report, "total_per_pattern", total, "intensity (incident probe = 1)")
    if not NORMALISED_TOTAL[0] <= total <= NORMALISED_TOTAL[1]:
        add_warning(report, "total", f"the patterns carry {total:.4g} each but the model learned patterns carrying "
                                     "about 1 (the incident probe): divide each pattern by the incident intensity")
    _dose_from_quanta(report, sample, card)
    _disc_against_card(report, sample.mean(axis=0), card)
    return report


def _dose_from_quanta(report: dict[str, Any], sample: np.ndarray, card: ModelCard) -> None:
    """Counted patterns divided by their count are multiples of one quantum (1 / electrons per pattern);
    the dose is that count over the scan step's area (the finest step the card's config gives)."""
    positive = sample[sample > 0]
    if positive.size == 0:
        return
    quantum = float(positive.min())
    steps = sample / quantum
    if not np.allclose(steps, np.round(steps), rtol=0.0, atol=1e-2) or np.unique(np.round(steps)).size < 3:
        return  # not quantised (noise-free, or not counted), or too few levels to tell (a flat pattern)
    electrons = float(sample.sum(axis=(1, 2)).mean()) / quantum
    if card.expects_input is not None:
        step = card.expects_input.sampling.step_A[0]
        dose = electrons / step ** 2
        add_measurement(report, "dose_e_per_A2", dose, "electrons/Angstrom^2", electrons_per_pattern=electrons)
        _check_dose(report, dose, card)


def _disc_against_card(report: dict[str, Any], mean: np.ndarray, card: ModelCard) -> None:
    """The disc radius (px) against semi-angle / detector pixel (mrad) of the card's expected input."""
    e = card.expects_input
    disc = autocal.find_disc(mean)
    if e is None or disc is None:
        return
    expected = e.semiangle_mrad / e.sampling.dk_mrad[0]
    add_measurement(report, "disc_radius_px", disc.radius_px, "px", expected=expected)
    if abs(disc.radius_px - expected) > RADIUS_RTOL * expected + RADIUS_ATOL_PX:
        add_warning(report, "disc-radius", f"the bright-field disc has a radius of {disc.radius_px:.2f} px but the "
                                           f"model learned {expected:.2f} px ({e.semiangle_mrad} mrad): another "
                                           "semi-angle or detector sampling")


def warn_report(report: Mapping[str, Any], stacklevel: int = 2) -> None:
    """Issue each warning of ``report`` as an `OutsideTrainingWarning`, attributed ``stacklevel``
    frames above this function's caller (its user's line, not ours)."""
    for w in report.get("warnings", []):
        warnings.warn(f"{w['code']}: {w['message']}", OutsideTrainingWarning, stacklevel=stacklevel + 1)
