"""Checks of a scan before inference (`namsa reconstruct`): the file against itself and its calibrations.

The patterns must be convergent-beam (one round bright-field disc), the disc's radius must agree
with the semi-angle and detector sampling, and the counts per pattern, the dose they imply and
detector saturation are measured. What no model can read is refused in one line
(`ExperimentalInputError`, exit 2); the rest are warnings with a code. The report
{"warnings": [{"code", "message"}], "measured": {name: {"value", "unit", ...}}} goes into
reconstruction.json; the checks against a model's card (after inference, and of `predict`'s input)
are models.scan_fit.card_checks, which write the same report. Scans are read by slicing only (see autocal).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from namsa.constants import wavelength_A

from . import autocal
from .calibration import Calibrations, check_energy, resolve_calibrations
from .errors import ExperimentalInputError

#: relative tolerance of the disc radius against semi-angle / detector pixel, plus `RADIUS_ATOL_PX`:
#: a thresholded disc is measured to about half a pixel, and the mean pattern of a thick crystal
#: blurs its edge by some 5-10% (a namsa simulation at 20 mrad measures 6% small)
RADIUS_RTOL = 0.15
RADIUS_ATOL_PX = 0.5
#: fraction of all pixels at one (the largest) value above which the detector looks clipped;
#: a scan's true maximum is held by a handful of pixels, a saturated one by whole disc areas
SATURATION_FRACTION = 1e-3
#: mean total intensity per pattern of normalised data (the model's convention: the incident
#: probe carries 1, minus what leaves the detector)
NORMALISED_TOTAL = (0.5, 1.05)
#: where a fitted value comes from (Calibrations.sources)
FIT_SOURCE = "from the data (fit)"


def new_report() -> dict[str, Any]:
    """An empty check report: {"warnings": [], "measured": {}}."""
    return {"warnings": [], "measured": {}}


def add_warning(report: dict[str, Any], code: str, message: str) -> None:
    """A finding of ``report``: a short ``code`` and a one-line ``message``."""
    report["warnings"].append({"code": code, "message": message})


def add_measurement(report: dict[str, Any], name: str, value: Any, unit: str, **extra: Any) -> None:
    """A measured ``value`` (in ``unit``) of ``report``, with whatever else describes it."""
    report["measured"][name] = {"value": value, "unit": unit, **extra}


def check_before_inference(scan: Any, given: Mapping[str, Any],
                           block_bytes: int = autocal.BLOCK_BYTES) -> tuple[Calibrations, dict[str, Any], Any]:
    """Checks of ``scan`` (a RawScan) before any inference, and the calibrations to use; the scan
    is read in blocks of at most ``block_bytes`` (float64), so memory does not grow with the file.

    Returns (calibrations, report, DataCalibration). A semi-angle neither given nor in the file
    is taken from the disc (source "from the data (fit)"); a given one must match the disc.
    """
    check_energy(scan.found, given)  # the values and the data's sign first: the disc check would blame the angle
    mean = autocal.subsample(scan.data).mean(axis=0)
    refuse_if_negative(mean, scan.path)
    disc = autocal.find_disc(mean)
    refuse_if_not_cbed(disc, scan.path)
    scalars = autocal.scan_scalars(scan.data, disc, block_bytes)
    calib = autocal.calibrate(scan.data, disc, scalars)
    fitted = _fitted_semiangle(scan.found, given, disc)
    cal = resolve_calibrations(scan.found, given, fitted={"semiangle_mrad": fitted[0]} if fitted else None)
    calib.semiangle_mrad = fitted or autocal.semiangle_from_disc(disc, float(np.mean(cal.dk_inv_A)), cal.energy_kv)
    report = new_report()
    _check_radius(report, disc, cal)
    _check_counts(report, scan.data, scalars, cal)
    _check_saturation(report, scan.data, scalars)
    return cal, report, calib


def refuse_if_negative(mean: np.ndarray, path: str) -> None:
    """One-line refusal when the mean pattern is dominated by negative values (negated data, or a
    dark reference subtracted with an offset): dark-subtracted noise dips a little below zero, but
    never below minus the bright-field disc's level."""
    low, high = float(mean.min()), float(mean.max())
    if low < 0 and -low >= high:
        raise ExperimentalInputError(f"{path}: the data are negative (the mean pattern spans {low:.4g} to "
                                     f"{high:.4g}): the file holds signed data, e.g. negated or dark-subtracted "
                                     "with an offset; namsa reconstruct needs intensities (counts >= 0): save "
                                     "them unsigned, without the offset")


def refuse_if_not_cbed(disc: autocal.Disc | None, path: str) -> None:
    """One-line refusal when the mean pattern shows no single round bright-field disc."""
    why = None
    if disc is None:
        why = "nothing stands out of the background"
    elif disc.radius_px < autocal.MIN_DISC_RADIUS_PX:
        why = f"the direct beam is a spot of radius {disc.radius_px:.2g} px, not a disc"
    elif disc.roundness < autocal.MIN_ROUNDNESS:
        why = f"the brightest region is not round (minor/major axis {disc.roundness:.2f})"
    elif disc.second_spot > autocal.MAX_SECOND_SPOT:
        why = f"a second bright region carries {100 * disc.second_spot:.0f}% of the direct beam's intensity"
    if why:
        raise ExperimentalInputError(f"{path}: the patterns do not look like CBED ({why}); namsa reconstruct "
                                     "needs convergent-beam 4D-STEM data with one bright-field disc, not spot "
                                     "(parallel-beam) diffraction")


def _pick(found: Mapping[str, Any], given: Mapping[str, Any], name: str) -> float | None:
    """The mean of a given (else found) positive calibration, or None."""
    value = given.get(name) if given.get(name) is not None else found.get(name)
    try:
        v = float(np.mean(np.asarray(value, dtype=np.float64)))
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) and v > 0 else None


def _fitted_semiangle(found: Mapping[str, Any], given: Mapping[str, Any],
                      disc: autocal.Disc) -> tuple[float, float] | None:
    """(semi-angle, error) mrad from the disc when neither the command line nor the file has one."""
    if _pick(found, given, "semiangle_mrad") is not None:
        return None
    dk_mrad = _pick(found, given, "dk_mrad")
    dk, kv = _pick(found, given, "dk_inv_A"), _pick(found, given, "energy_kv")
    if dk is not None and kv is not None:
        dk_mrad = dk * wavelength_A(kv) * 1e3
    if dk_mrad is None:
        return None  # resolve_calibrations names what is missing
    return disc.radius_px * dk_mrad, disc.radius_err_px * dk_mrad


def _check_radius(report: dict[str, Any], disc: autocal.Disc, cal: Calibrations) -> None:
    """Refuse a disc whose radius disagrees with semi-angle / (detector pixel in mrad)."""
    dk_mrad = float(np.mean(cal.dk_inv_A)) * wavelength_A(cal.energy_kv) * 1e3
    expected = cal.semiangle_mrad / dk_mrad
    add_measurement(report, "disc_radius_px", disc.radius_px, "px", uncertainty=disc.radius_err_px,
                    expected=expected, tolerance=RADIUS_RTOL * expected + RADIUS_ATOL_PX)
    if cal.sources.get("semiangle_mrad") == FIT_SOURCE:
        return
    if abs(disc.radius_px - expected) > RADIUS_RTOL * expected + RADIUS_ATOL_PX:
        raise ExperimentalInputError(
            f"the bright-field disc has a radius of {disc.radius_px:.2f} px but the semi-angle "
            f"{cal.semiangle_mrad:g} mrad ({cal.sources.get('semiangle_mrad')}) at {dk_mrad:.4g} mrad per detector "
            f"pixel gives {expected:.2f} px (tolerance {100 * RADIUS_RTOL:.0f}% + {RADIUS_ATOL_PX} px); the data "
            f"suggest {disc.radius_px * dk_mrad:.3g} mrad: correct --semiangle-mrad or the detector pixel "
            "(--dk-inv-a / --dk-mrad)")


def _check_counts(report: dict[str, Any], data: Any, scalars: autocal.ScanScalars, cal: Calibrations) -> None:
    """Counts per pattern and the dose they imply (e/Angstrom^2), or why there is none."""
    total = float(scalars.total.mean())
    add_measurement(report, "total_per_pattern", total, "detector units", spread=float(scalars.total.std()))
    sample = autocal.subsample(data, 16)
    counted = np.issubdtype(data.dtype, np.integer) or bool(np.all(sample == np.round(sample)))
    if counted and total > NORMALISED_TOTAL[1]:
        dose = total / (cal.step_A[0] * cal.step_A[1])
        add_measurement(report, "dose_e_per_A2", dose, "electrons/Angstrom^2", counts_per_pattern=total,
                        source="counts per pattern / (step_y * step_x)")
    elif NORMALISED_TOTAL[0] <= total <= NORMALISED_TOTAL[1]:
        add_warning(report, "normalised", f"the patterns carry {total:.3g} each: they look normalised, not counted, "
                                          "so no dose can be estimated")
    else:
        add_warning(report, "arbitrary-units", f"the patterns carry {total:.4g} each in non-integer units: neither "
                                               "counts nor normalised, so no dose can be estimated")


def _check_saturation(report: dict[str, Any], data: Any, scalars: autocal.ScanScalars) -> None:
    """Warn when many pixels sit at the scan's largest value or the dtype's maximum."""
    fraction = scalars.n_at_max / scalars.n_pixels
    add_measurement(report, "pixels_at_scan_max", fraction, "fraction of all pixels", max_value=scalars.max_value)
    at_dtype_max = np.issubdtype(data.dtype, np.integer) and scalars.max_value == np.iinfo(data.dtype).max
    if fraction > SATURATION_FRACTION or (at_dtype_max and scalars.n_at_max > 1):
        add_warning(report, "saturation", f"{100 * fraction:.2g}% of the pixels hold the scan's largest value "
                                          f"{scalars.max_value:g}: the detector looks saturated, so the bright-field "
                                          "intensities are clipped; record with a shorter dwell or lower beam current")
