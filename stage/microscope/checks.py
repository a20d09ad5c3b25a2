"""Checks of a scan before inference (`namsa reconstruct`): the file against itself and its calibrations.

The patterns must be convergent-beam (one round bright-field disc with an edge: stage.microscope.disc),
the disc's radius must agree with the semi-angle and detector sampling, and the counts per pattern,
the one dose figure they imply (stage.microscope.counts) and detector saturation are measured. What
makes the rest moot (negative data, no counts at all, not CBED) is refused alone; every other problem
found (missing calibrations, a disc that disagrees with them, and whatever the caller's
``model_problems`` finds against a model) is refused together, in one line, so one run tells a user
everything to fix. The rest are warnings with a code. The report {"warnings": [{"code", "message"}],
"measured": {name: {"value", "unit", ...}}} goes into reconstruction.json; the checks against a
model's card (after inference, and of `predict`'s input) are models.scan_fit.card_checks, which write
the same report. Scans are read by slicing only (see autocal).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from namsa.constants import mrad_per_inv_A

from . import autocal
from .check_report import add_measurement, add_warning, new_report
from .calibration import Calibrations, check_energy, known_calibrations, missing_calibrations
from .counts import MIN_DISC_ELECTRONS, dose_record, is_counted, mean_pattern, nominal_disc
from .counts_restore import camera_counts
from .disc import Disc, find_disc, not_cbed
from .errors import ExperimentalInputError, all_problems

#: relative tolerance of the disc radius against semi-angle / detector pixel, plus `RADIUS_ATOL_PX`:
#: a thresholded disc is measured to about half a pixel, and the mean pattern of a thick crystal
#: blurs its edge by some 5-10% (a namsa simulation at 20 mrad measures 6% small)
RADIUS_RTOL = 0.15
RADIUS_ATOL_PX = 0.5
#: fraction of all pixels at one (the largest) value above which the detector looks clipped;
#: a scan's true maximum is held by a handful of pixels, a saturated one by whole disc areas
SATURATION_FRACTION = 1e-3
#: counted data whose largest value is below this are not clipped, however many pixels hold it (a
#: scan of a few electrons per pattern: most lit pixels hold 1 or 2)
MIN_SATURATED_COUNTS = 16
#: where a fitted value comes from (Calibrations.sources)
FIT_SOURCE = "from the data (fit)"
#: what a caller checks against a model, given the calibrations known so far (known_calibrations):
#: one line per problem no flag can fix (models.scan_fit.sampling_problems)
ModelProblems = Callable[[Mapping[str, Any]], list[str]]

__all__ = ["check_before_inference", "refuse_if_negative", "refuse_if_not_cbed", "RADIUS_RTOL", "RADIUS_ATOL_PX", "FIT_SOURCE",
           "ModelProblems"]


def check_before_inference(scan: Any, given: Mapping[str, Any], block_bytes: int = autocal.BLOCK_BYTES,
                           model_problems: ModelProblems | None = None) -> tuple[Calibrations, dict[str, Any], Any]:
    """Checks of ``scan`` (a RawScan) before any inference, and the calibrations to use; the scan
    is read in blocks of at most ``block_bytes`` (float64), so memory does not grow with the file.

    Returns (calibrations, report, DataCalibration). A semi-angle neither given nor in the file
    is taken from the disc (source "from the data (fit)"); a given one must match the disc. Data that
    are not Poisson counts (a camera's gain, dark level, read noise: stage.microscope.counts_restore)
    are converted before any check reads them; the conversion is ``DataCalibration.counts``, which also
    deconvolves ``given["detector_psf_px"]`` (the camera's point spread, detector pixels) from the blocks
    the model reads when it is there.
    ``model_problems(known)`` adds what a model refuses to the one refusal (see the module docstring).
    """
    check_energy(scan.found, given)  # the values and the data's sign first: the disc check would blame the angle
    report = new_report()
    # negated data first: the camera's dark subtraction would clip them to zeros and blame the disc
    refuse_if_negative(autocal.subsample(scan.data).mean(axis=0), scan.path)
    data, counted, restore = camera_counts(scan.data, scan.path, is_counted(scan.data), report, block_bytes,
                                           given.get("detector_psf_px"))
    mean, electrons = mean_pattern(data, counted, block_bytes)
    refuse_if_negative(mean, scan.path)
    refuse_if_blank(mean, scan.path)
    few = electrons is not None and electrons < MIN_DISC_ELECTRONS
    disc = _nominal(mean, scan, given) if few else _disc_or_refuse(mean, scan.path)
    scalars = autocal.scan_scalars(data, disc, block_bytes)
    calib = autocal.calibrate(data, disc, scalars)
    calib.counts = restore
    if few:
        add_warning(report, "too-few-counts", f"the scan holds only {electrons:.0f} electrons, fewer than the "
                                              f"{MIN_DISC_ELECTRONS} that show its bright-field disc: the patterns "
                                              "are not checked to be CBED, nor the semi-angle against the disc; "
                                              "expect maps dominated by shot noise")
    else:  # the disc's shape, as one pattern shows it: the descan no longer smears its edge
        disc = _disc_or_refuse(autocal.recentred_mean(data, calib.descan), scan.path, complete=True)
    fitted = None if few else _fitted_semiangle(scan.found, given, disc)
    known = known_calibrations(scan.found, given, fitted={"semiangle_mrad": fitted[0]} if fitted else None)
    problems = [p for p in (missing_calibrations(known), None if few else _radius_problem(disc, known)) if p]
    problems += model_problems(known) if model_problems is not None else []
    if problems:
        raise all_problems(problems)
    cal = Calibrations.from_known(known)
    if not few:
        calib.semiangle_mrad = fitted or autocal.semiangle_from_disc(disc, float(np.mean(cal.dk_inv_A)), cal.energy_kv)
        _measure_radius(report, disc, known)
    _check_counts(report, scalars, cal, counted, restore.per_pattern if restore else None)
    _check_saturation(report, scan.data, scalars, counted)
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


def refuse_if_blank(mean: np.ndarray, path: str) -> None:
    """One-line refusal of a scan without a single count (a pattern without one is data; a scan is not)."""
    if not float(mean.max()) > 0:
        raise ExperimentalInputError(f"{path}: every pixel of every pattern is 0: the beam was blanked or the "
                                     "detector was off during the whole scan; record the scan again")


def refuse_if_not_cbed(disc: Disc | None, path: str) -> None:
    """One-line refusal when the mean pattern shows no single round bright-field disc with an edge."""
    why = not_cbed(disc)
    if why:
        raise ExperimentalInputError(f"{path}: the patterns do not look like CBED ({why}); namsa reconstruct "
                                     "needs convergent-beam 4D-STEM data with one bright-field disc, not spot "
                                     "(parallel-beam or precession) diffraction")


def _disc_or_refuse(mean: np.ndarray, path: str, complete: bool = False) -> Disc:
    """The disc of ``mean``. Before the descan is known only a pattern with no bright region at all
    is refused (a descan smears the plain mean's disc into an oval); ``complete``: every criterion."""
    disc = find_disc(mean)
    if disc is None or complete:
        refuse_if_not_cbed(disc, path)
    return disc  # type: ignore[return-value]


def _nominal(mean: np.ndarray, scan: Any, given: Mapping[str, Any]) -> Disc:
    """The window of a scan too sparse to show its disc: the radius its calibrations give, if known."""
    expected = _expected_radius(known_calibrations(scan.found, given))
    return nominal_disc(mean, expected[0] if expected else None)


def _pick(found: Mapping[str, Any], given: Mapping[str, Any], name: str) -> float | None:
    """The mean of a given (else found) positive calibration, or None."""
    value = given.get(name) if given.get(name) is not None else found.get(name)
    try:
        v = float(np.mean(np.asarray(value, dtype=np.float64)))
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) and v > 0 else None


def _fitted_semiangle(found: Mapping[str, Any], given: Mapping[str, Any], disc: Disc) -> tuple[float, float] | None:
    """(semi-angle, error) mrad from the disc when neither the command line nor the file has one."""
    if _pick(found, given, "semiangle_mrad") is not None:
        return None
    dk_mrad = _pick(found, given, "dk_mrad")
    dk, kv = _pick(found, given, "dk_inv_A"), _pick(found, given, "energy_kv")
    if dk is not None and kv is not None:
        dk_mrad = dk * mrad_per_inv_A(kv)
    if dk_mrad is None:
        return None  # missing_calibrations names what is missing
    return disc.radius_px * dk_mrad, disc.radius_err_px * dk_mrad


def _expected_radius(known: Mapping[str, Any]) -> tuple[float, float] | None:
    """(expected disc radius px, detector pixel mrad) from the known calibrations, or None."""
    if not {"semiangle_mrad", "dk_inv_A", "energy_kv"} <= set(known):
        return None
    dk_mrad = float(np.mean(known["dk_inv_A"])) * mrad_per_inv_A(known["energy_kv"])
    return known["semiangle_mrad"] / dk_mrad, dk_mrad


def _radius_problem(disc: Disc, known: Mapping[str, Any]) -> str | None:
    """A disc whose radius disagrees with semi-angle / (detector pixel in mrad), in words."""
    expected = _expected_radius(known)
    if expected is None or known["sources"].get("semiangle_mrad") == FIT_SOURCE:
        return None
    radius, dk_mrad = expected
    if abs(disc.radius_px - radius) <= RADIUS_RTOL * radius + RADIUS_ATOL_PX:
        return None
    return (f"the bright-field disc has a radius of {disc.radius_px:.2f} px but the semi-angle "
            f"{known['semiangle_mrad']:g} mrad ({known['sources'].get('semiangle_mrad')}) at {dk_mrad:.4g} mrad per "
            f"detector pixel gives {radius:.2f} px (tolerance {100 * RADIUS_RTOL:.0f}% + {RADIUS_ATOL_PX} px); the "
            f"data suggest {disc.radius_px * dk_mrad:.3g} mrad: correct --semiangle-mrad or the detector pixel "
            "(--dk-inv-a / --dk-mrad)")


def _measure_radius(report: dict[str, Any], disc: Disc, known: Mapping[str, Any]) -> None:
    expected, _ = _expected_radius(known)  # type: ignore[misc]  (every calibration is known by now)
    add_measurement(report, "disc_radius_px", disc.radius_px, "px", uncertainty=disc.radius_err_px,
                    expected=expected, tolerance=RADIUS_RTOL * expected + RADIUS_ATOL_PX,
                    edge_px=disc.edge_px)


def _check_counts(report: dict[str, Any], scalars: autocal.ScanScalars, cal: Calibrations, counted: bool,
                  restored_total: float | None = None) -> None:
    """Counts per pattern and the one dose they imply (e/Angstrom^2), or why there is none;
    ``restored_total``: the electrons per pattern of restored data before their negatives were set to 0."""
    total = float(scalars.total.mean())
    add_measurement(report, "total_per_pattern", total, "detector units", spread=float(scalars.total.std()),
                    patterns_without_counts=int(np.count_nonzero(scalars.total <= 0)))
    dose, code, message = dose_record(total if restored_total is None else restored_total, counted, cal.step_A)
    if dose is not None:
        report["measured"]["dose_e_per_A2"] = dose
    else:
        add_warning(report, code, message)


def _check_saturation(report: dict[str, Any], data: Any, scalars: autocal.ScanScalars, counted: bool) -> None:
    """Warn when many pixels sit at the scan's largest value or the dtype's maximum (a few counts
    per pixel at low dose are no clipped detector, however many pixels hold the largest)."""
    fraction = scalars.n_at_max / scalars.n_pixels
    add_measurement(report, "pixels_at_scan_max", fraction, "fraction of all pixels", max_value=scalars.max_value)
    at_dtype_max = np.issubdtype(data.dtype, np.integer) and scalars.max_value == np.iinfo(data.dtype).max
    piled = fraction > SATURATION_FRACTION and not (counted and scalars.max_value < MIN_SATURATED_COUNTS)
    if piled or (at_dtype_max and scalars.n_at_max > 1):
        add_warning(report, "saturation", f"{100 * fraction:.2g}% of the pixels hold the scan's largest value "
                                          f"{scalars.max_value:g}: the detector looks saturated, so the bright-field "
                                          "intensities are clipped; record with a shorter dwell or lower beam current")
