"""Checks of a scan against a model's card: the maps after inference (`namsa reconstruct`) and the
stack `Reconstructor.predict` is given. Both write the report of stage.microscope.checks
({"warnings": [...], "measured": {...}}); what the model was trained on is read from its typed card
(`models.card.ModelCard`), its sampling from `ExpectsInput.sampling` (namsa.sampling), the training
distribution of the input's cheap statistics from its ``training_statistics`` (`check_training_distribution`)."""
from __future__ import annotations

import warnings
from typing import Any, Mapping

import numpy as np

from stage.microscope.check_report import add_measurement, add_warning, new_report
from stage.microscope.checks import RADIUS_ATOL_PX, RADIUS_RTOL
from stage.microscope.counts import NORMALISED_TOTAL
from stage.microscope.disc import find_disc
from stage.scan_statistics import (NOISE_FREE_DOSE_E_PER_A2, DefocusEstimate, bright_field_disc,
                                   defocus_tolerance_A, dose_from_quanta, high_angle_loss, parallax_defocus,
                                   scattered_fraction)

from ..card import ModelCard, TrainingStatistics
from .dose_warning import dose_message
from .trained_ranges import DEFOCUS_UNIT, current_statistics, trained_dose_range, trained_ranges

#: a map above the training mean + this many training standard deviations is far outside
MAP_SIGMAS = 6.0
#: more than this fraction of negative pixels: a potential / density no specimen has
NEGATIVE_FRACTION = 0.5
#: a scattering statistic above its training range by more than this fraction of the range's top plus
#: `SCATTERING_ATOL` (fractions of the intensity) is outside it. The ranges are read over every training
#: stack (`stage.scan_statistics.split_ranges`, up to `MAX_SPLIT_SAMPLES`; a fine-tune's joined with its
#: initial model's card's, which older cards read over 64 strided stacks), so no stack they were read over
#: lies past them, but a new draw of the same physics lies past the top of n with chance 1 / (n + 1), more
#: so for a small split or an older card's strided part. Kept at 0.25: with the flagship's new ranges no
#: held-out sample of its physics needs any margin (dev, test and 120 fresh training-split samples reach at
#: most 0.91 of the top; benchmarks/RESULTS.md, 2026-12-06), so narrowing it would buy sensitivity no
#: measurement here asks for, on cards whose ends are less certain
SCATTERING_RTOL = 0.25
SCATTERING_ATOL = 2e-3
NOT_TRUSTWORTHY = "its maps are not trustworthy here"
NO_STATISTICS = ("the card records no training statistics of this code's estimators (training_statistics: cards "
                 "written before them, like the shipped ones, have none)")


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


def _check_dose(report: dict[str, Any], dose: float, card: ModelCard) -> None:
    """Warn when a measured dose (e/Angstrom^2) lies below what the model was trained at, with the error
    the card's ``dose_response`` measured there (`models.scan_fit.dose_warning`); above the noise-free
    threshold (`stage.scan_statistics.NOISE_FREE_DOSE_E_PER_A2`), or inside the trained range, there is
    nothing to say."""
    trained = trained_dose_range(card)
    if dose >= NOISE_FREE_DOSE_E_PER_A2 or (trained is not None and dose >= trained[0]):
        return
    # the card's error-vs-dose curve, when it has one, says how much error and whether the maps are unusable
    add_warning(report, "dose", dose_message(dose, trained, card.dose_response))


def input_report(cbed: np.ndarray, card: ModelCard, calibration: Any = None, check_dose: bool = True) -> dict[str, Any]:
    """Cheap checks of a (S, P, P) stack given to `Reconstructor.predict` against the card: total
    intensity per pattern, the dose its quantisation implies, the disc radius vs the card's
    semi-angle and sampling (on at most 64 patterns), and the defocus and scattering against the
    training distribution (`check_training_distribution`; ``calibration``, a `namsa.icom.ScanCalibration`
    or its dict, gives the probe step the defocus is read with; ``check_dose`` False skips the dose, for a
    caller that measured it on the data as read)."""
    report = new_report()
    sample = np.asarray(cbed[:: max(1, len(cbed) // 64)], dtype=np.float64)
    total = float(sample.sum(axis=(1, 2)).mean())
    add_measurement(report, "total_per_pattern", total, "intensity (incident probe = 1)")
    if not NORMALISED_TOTAL[0] <= total <= NORMALISED_TOTAL[1]:
        add_warning(report, "total", f"the patterns carry {total:.4g} each but the model learned patterns carrying "
                                     "about 1 (the incident probe): divide each pattern by the incident intensity")
    if check_dose:
        _dose_from_quanta(report, sample, card)
    _disc_against_card(report, sample.mean(axis=0), card)
    check_training_distribution(report, np.asarray(cbed), card, calibration)
    return report


def _dose_from_quanta(report: dict[str, Any], sample: np.ndarray, card: ModelCard) -> None:
    """The dose counted patterns imply (`stage.scan_statistics.dose_from_quanta`) over the finest scan
    step the card's config (or its training split) gives, checked against the trained doses."""
    steps = trained_ranges(card).scan_step_A
    found = None if steps is None else dose_from_quanta(sample, steps.low)
    if found is not None:
        dose, electrons = found
        add_measurement(report, "dose_e_per_A2", dose, "electrons/Angstrom^2", electrons_per_pattern=electrons)
        _check_dose(report, dose, card)


def _disc_against_card(report: dict[str, Any], mean: np.ndarray, card: ModelCard) -> None:
    """The disc radius (px) against the card's expected input: its semi-angle over each end of its
    detector pixels' span (mrad; a training sample's pixel follows its supercell, so the disc of the
    training data spans semi-angle / coarsest .. semi-angle / finest pixel)."""
    e = card.expects_input
    disc = find_disc(mean)
    if e is None or disc is None:
        return
    finest, coarsest = e.sampling.dk_mrad
    low, high = e.semiangle_mrad / coarsest, e.semiangle_mrad / finest
    add_measurement(report, "disc_radius_px", disc.radius_px, "px", expected=[low, high])
    if low * (1 - RADIUS_RTOL) - RADIUS_ATOL_PX <= disc.radius_px <= high * (1 + RADIUS_RTOL) + RADIUS_ATOL_PX:
        return
    add_warning(report, "disc-radius", f"the bright-field disc has a radius of {disc.radius_px:.2f} px but the "
                                       f"model learned {low:.2f}-{high:.2f} px ({e.semiangle_mrad:g} mrad at detector "
                                       f"pixels of {finest:.3g}-{coarsest:.3g} mrad): another semi-angle or detector "
                                       "sampling")


def check_training_distribution(report: dict[str, Any], cbed: np.ndarray, card: ModelCard,
                                calibration: Any = None) -> None:
    """The scattering (thickness) and the defocus of the (S, P, P) stack ``cbed`` (`stage.scan_statistics`)
    beside the ranges the model was trained on: one warning line per finding (codes "thickness", "defocus"),
    each estimate recorded in ``report["measured"]`` with its range and where that came from. The thickness
    in Angstrom (`models.scan_fit.thickness.check_thickness`) is `namsa reconstruct`'s, on a file's whole
    scan: its premise, a thermal-diffuse tail, does not hold for simulations without frozen phonons, which
    `namsa evaluate` scores (it read the quickstart's 40 A samples as up to 194 A).

    The scattering ranges are the card's ``training_statistics`` (every stack of its training split, a
    fine-tune's joined with its initial model's, measured when the card was written; a card without them
    checks no thickness, saying so in a note); the focus range is
    the card's one (`models.scan_fit.trained_ranges`: its training config's, else the statistics'). Through a specimen thicker
    than the training set's the parallax estimate means nothing: its defocus is then recorded, not judged."""
    stats = current_statistics(card)
    disc = bright_field_disc(cbed)
    thicker = _check_scattering(report, cbed, disc, stats)
    _check_defocus(report, cbed, disc, card, calibration, judged=not thicker)


def _check_scattering(report: dict[str, Any], cbed: np.ndarray, disc: Any, stats: TrainingStatistics | None) -> bool:
    """Scattered fraction and high-angle loss against the training ranges; True when the specimen
    scatters more than any training sample (thicker, or of heavier elements)."""
    values = {"scattered_fraction": None if disc is None else scattered_fraction(cbed, disc),
              "high_angle_loss": high_angle_loss(cbed)}
    above, below = [], []
    for name, value in values.items():
        trained = stats.ranges.get(name) if stats is not None else None
        extra = ({"training_range": [trained.low, trained.high], "training_samples": trained.samples}
                 if trained else {"note": f"thickness not checked: {NO_STATISTICS}; a thickness range alone cannot "
                                          "be compared with the data without the specimen's composition"})
        add_measurement(report, name, value, "fraction of the intensity", **extra)
        if value is None or trained is None:
            continue
        said = f"{name.replace('_', ' ')} {value:.3g} against {trained.low:.3g}-{trained.high:.3g}"
        if value > trained.high * (1 + SCATTERING_RTOL) + SCATTERING_ATOL:
            above.append(said)
        elif name == "scattered_fraction" and value < trained.low * (1 - SCATTERING_RTOL) - SCATTERING_ATOL:
            below.append(said)
    if above:
        add_warning(report, "thickness", f"the specimen scatters more than any training sample ({'; '.join(above)} "
                                         f"in training): thicker (or of heavier elements) than the model was trained "
                                         f"on: {NOT_TRUSTWORTHY}")
    elif below:
        add_warning(report, "thickness", f"the specimen scatters less than any training sample ({'; '.join(below)} "
                                         f"in training): thinner (or of lighter elements) than the model was trained "
                                         f"on: {NOT_TRUSTWORTHY}")
    return bool(above)


def trained_defocus_range(card: ModelCard) -> tuple[float, float, str] | None:
    """(low, high, where from) of the focus (Angstrom, relative to the specimen's middle, as
    `stage.scan_statistics.parallax_defocus` reads it) the model was trained on (`TrainedRanges.defocus_A`);
    None when the card states none."""
    found = trained_ranges(card).defocus_A
    return None if found is None else (found.low, found.high, found.source)


#: the notes of a defocus measured but not judged
NOT_JUDGED = {"thick": "not judged: the specimen scatters more than any training sample, and through a thicker "
                       "specimen the parallax estimate means nothing",
              "no range": "not judged: the card records neither training statistics nor a training config"}


def _check_defocus(report: dict[str, Any], cbed: np.ndarray, disc: Any, card: ModelCard, calibration: Any,
                   judged: bool) -> None:
    """The parallax focus of ``cbed`` against `trained_defocus_range`. Without the input's probe step
    (``calibration``) it is read at each end of the training steps' span: a range, warned about only
    when all of it lies outside the trained one by more than the estimate's tolerance."""
    found = _read_defocus(cbed, disc, card, calibration)
    if isinstance(found, str):
        add_measurement(report, "defocus_A", None, DEFOCUS_UNIT, note=found)
        return
    estimate, step, scale = found
    trained = trained_defocus_range(card)
    extra = _defocus_context(step, scale, estimate.search_A, trained, judged)
    if estimate.outside:
        _outside_search_window(report, estimate, extra, trained)
        return
    low, high = sorted((estimate.value_A, estimate.value_A * scale))  # the focus read scales with the step
    tolerance = defocus_tolerance_A(low if trained is None else _nearest(estimate.value_A, scale, trained))
    alias = None if "note" in extra else next((a for a in estimate.aliases_A if _inside_training(a, scale, trained)),
                                               None)
    if alias is not None:
        extra["note"] = (f"not judged: the focus curve peaks as high at {alias:.0f} A, inside the training range "
                         f"(a crystal lattice aliases the focus read from the parallax)")
    add_measurement(report, "defocus_A", low if scale == 1.0 else [low, high], DEFOCUS_UNIT, tolerance_A=tolerance,
                    aliases_A=list(estimate.aliases_A), **extra)
    if "note" in extra or _inside_training(estimate.value_A, scale, trained):
        return
    said = f"{low:.0f}" if scale == 1.0 else f"{low:.0f}..{high:.0f}"
    add_warning(report, "defocus", f"defocus estimated {said} +- {tolerance:.0f} A from the bright-field parallax "
                                   f"(the focus relative to the specimen's middle{_step_note(step, scale)}); "
                                   f"{_trained_on(trained)}")


def _nearest(value: float, scale: float, trained: tuple[float, float, str]) -> float:
    """Of a focus reading ``value`` (Angstrom) and ``value`` x ``scale`` (the other end of the step span),
    and every focus between, the one closest to the trained range."""
    low, high = sorted((value, value * scale))
    return min(max(trained[0], low), high)


def _inside_training(value: float, scale: float, trained: tuple[float, float, str]) -> bool:
    """Whether a focus reading ``value`` (`_nearest` over the step span) lies inside the trained focus
    range within the reading's stated accuracy."""
    nearest = _nearest(value, scale, trained)
    tolerance = defocus_tolerance_A(nearest)
    return trained[0] - tolerance <= nearest <= trained[1] + tolerance


def _defocus_context(step: tuple[float, float], scale: float, search: float,
                     trained: tuple[float, float, str] | None, judged: bool) -> dict[str, Any]:
    """What the defocus measurement records beside its value: the step it was read at, the window searched,
    the training range, and a note when it is not judged."""
    extra: dict[str, Any] = {"probe_step_A": list(step), "probe_step_scale": scale, "search_A": search}
    if trained is not None:
        extra.update(training_range=list(trained[:2]), training_source=trained[2])
    if trained is None or not judged:
        extra["note"] = NOT_JUDGED["thick" if not judged else "no range"]
    return extra


def _trained_on(trained: tuple[float, float, str]) -> str:
    """The end of a defocus warning: the focus range the model was trained on, and where it came from."""
    return f"the model was trained on {trained[0]:.0f}..{trained[1]:.0f} A ({trained[2]}): {NOT_TRUSTWORTHY}"


def _step_note(step: tuple[float, float], scale: float) -> str:
    """How the probe step was known, for a warning ('' when the input's own step was given)."""
    return "" if scale == 1.0 else (f", at the {step[0]:.3g}-{step[0] * scale:.3g} A probe steps of the training "
                                    f"data: the input's step was not given")


def _outside_search_window(report: dict[str, Any], estimate: DefocusEstimate, extra: dict[str, Any],
                           trained: tuple[float, float, str] | None) -> None:
    """A focus outside the parallax's search window (`DefocusEstimate.outside`: no number, a wrapped one
    would lie): a warning when the training range lies inside the window, so the focus lies outside it too.
    The window grows with the probe step: at the smallest step of the span it is +-``search_A``."""
    search, scale = estimate.search_A, extra["probe_step_scale"]
    if trained is not None and not -search <= trained[0] <= trained[1] <= search and "note" not in extra:
        extra["note"] = "not judged: the training range reaches beyond the search window"
    add_measurement(report, "defocus_A", None, DEFOCUS_UNIT, outside_search_window=estimate.reason, **extra)
    if "note" in extra:
        return
    window = f"+-{search:.0f}" if scale == 1.0 else f"+-{search:.0f}..{search * scale:.0f}"
    add_warning(report, "defocus", f"defocus outside the search window ({window} A) of the bright-field parallax: "
                                   f"{estimate.reason}{_step_note(tuple(extra['probe_step_A']), scale)}; "
                                   f"{_trained_on(trained)}")


def _read_defocus(cbed: np.ndarray, disc: Any, card: ModelCard, calibration: Any
                  ) -> tuple[DefocusEstimate, tuple[float, float], float] | str:
    """(the `parallax_defocus` estimate, the (dy, dx) step it was read at, the factor to the step span's
    other end), or a note saying why there is no estimate; ``disc``: the stack's `bright_field_disc`,
    found once for both checks."""
    scan_shape, steps, semiangle = _scan_geometry(card, len(cbed), calibration)
    if scan_shape is None or steps is None or semiangle is None:
        return "not estimated: the card gives no scan shape, probe step or semi-angle and no calibration was passed"
    step, scale = steps
    estimate = parallax_defocus(cbed, scan_shape, step, semiangle, disc)
    if estimate.value_A is None and not estimate.outside:
        return f"not estimated: {estimate.reason}"
    return estimate, step, scale


def _scan_geometry(card: ModelCard, patterns: int, calibration: Any
                   ) -> tuple[tuple[int, int] | None, tuple[tuple[float, float], float] | None, float | None]:
    """(scan shape, ((dy, dx) probe step Angstrom to read the defocus at, factor to the span's other
    end), semi-angle mrad) of a stack of ``patterns``: the step from ``calibration`` (factor 1), else
    the lower end of the probe steps the model was trained on (`TrainedRanges.scan_step_A`)."""
    cal = calibration.to_dict() if hasattr(calibration, "to_dict") else dict(calibration or {})
    e, stats = card.expects_input, current_statistics(card)
    shapes = [cal.get("scan_shape"), e.scan_shape if e else None, card.architecture.scan_shape,
              [int(round(patterns ** 0.5))] * 2]
    shape = next((tuple(int(v) for v in s) for s in shapes if s and int(s[0]) * int(s[1]) == patterns), None)
    trained = trained_ranges(card).scan_step_A
    span = None if trained is None else trained.span()
    given = cal.get("scan_step_A")
    steps = (((float(given[0]), float(given[1])), 1.0) if given else
             None if span is None else ((float(span[0]), float(span[0])), float(span[1]) / float(span[0])))
    semiangle = e.semiangle_mrad if e is not None else (stats.semiangle_mrad if stats is not None else None)
    return shape, steps, semiangle


def warn_report(report: Mapping[str, Any], stacklevel: int = 2) -> None:
    """Issue each warning of ``report`` as an `OutsideTrainingWarning`, attributed ``stacklevel``
    frames above this function's caller (its user's line, not ours)."""
    for w in report.get("warnings", []):
        warnings.warn(f"{w['code']}: {w['message']}", OutsideTrainingWarning, stacklevel=stacklevel + 1)
