"""Restoring electron counts from a camera's values before the checks and the model see them.

The model was trained on Poisson counts of electrons (normalised per tile). An integrating camera
writes ``dark + gain * electrons + read noise`` (counts): its read noise dips below 0, and the model's
input transform shifts every pattern by its minimum (stage.transforms), so a read noise of 2 counts
lifted a whole pattern by ~7 counts and the maps' level by 27x; a gain of 10 in whole numbers read as
10x the dose. `camera_counts` measures the noise (stage.microscope.noise, a photon-transfer curve)
and decides:

- counted data (whole numbers) whose values share a divisor k > 1 (a camera writing gain x electrons
  in whole numbers): divided by k, so the dose is read after the gain;
- data in other units with negative values or a dark offset: the dark level subtracted and negatives
  set to 0 (read noise around an empty pixel; a count cannot be negative), which is what the maps
  need; the photon-transfer gain is reported, not applied (see `_decide`), so the units stay
  arbitrary and no dose is claimed;
- normalised data, and counts with gain 1: as they are;
- a camera point spread given by the user (``--detector-psf-px``, from the camera's MTF calibration: it
  cannot be read from a specimen's scan, see stage.microscope.point_spread): after the above, every
  pattern the model reads deconvolved (Richardson-Lucy), whatever the data's units.

What was measured is a measurement (``camera_noise``) and what was done a finding (`add_warning`):
``camera-gain`` (electrons restored), ``camera-noise`` (dark subtracted only), ``camera-psf``
(deconvolved). A file with
negative values whose scan is too small to measure is refused in one line. `CountsRestore.restore`
is what the reconstruction applies to every block it reads (`with_counts_restored`). Axis order:
(scan_y, scan_x, ky, kx).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from .check_report import add_measurement, add_warning
from .counts import NORMALISED_TOTAL
from .errors import ExperimentalInputError
from .noise import MIN_PAIRS, NoiseMeasurement, measure_noise
from .point_spread import MAX_PSF_SIGMA_PX, PSF_ITERATIONS, deconvolve

#: fraction of negative pixels above which the data hold read noise around a subtracted dark level
NEGATIVE_FRACTION = 1e-3

PatternTransform = Callable[[np.ndarray, int, int], np.ndarray]


@dataclass(frozen=True)
class CountsRestore:
    """The conversion of a camera's values to electrons: (x - dark) / gain, negatives set to 0.
    ``gain``: counts per electron (1.0 when not measured: the dark level is subtracted only);
    ``dark``: counts; ``electrons``: whether the result is in electrons (a measured gain);
    ``per_pattern``: mean electrons (or counts) per pattern before negatives are set to 0 (the dose's
    figure: setting read noise's negatives to 0 adds to it); ``psf_sigma_px``: the camera's Gaussian point
    spread (detector pixels) deconvolved after that, 0 for none, in ``psf_iterations`` Richardson-Lucy
    iterations (`stage.microscope.point_spread`)."""

    gain: float
    dark: float
    electrons: bool
    per_pattern: float = float("nan")
    psf_sigma_px: float = 0.0
    psf_iterations: int = PSF_ITERATIONS

    def restore(self, block: np.ndarray) -> np.ndarray:
        """A block (..., ky, kx) of the file's values -> float64 electrons (or dark-subtracted counts)."""
        out = (np.asarray(block, dtype=np.float64) - self.dark) / self.gain
        out = np.clip(out, 0.0, None, out=out)
        return deconvolve(out, self.psf_sigma_px, self.psf_iterations, in_place=True) if self.psf_sigma_px > 0 else out


class RestoredData:
    """A (scan_y, scan_x, ky, kx) scan read through ``restore``: slicing reads the file's block and
    restores it (float64); nothing is held."""

    def __init__(self, data: Any, restore: CountsRestore) -> None:
        self._data, self._restore = data, restore
        self.shape: tuple[int, ...] = tuple(data.shape)
        self.ndim = len(self.shape)
        self.dtype = np.dtype(np.float64)

    def __getitem__(self, key: Any) -> np.ndarray:
        return self._restore.restore(self._data[key])


def with_counts_restored(restore: CountsRestore | None, transform: PatternTransform | None
                         ) -> PatternTransform | None:
    """The pattern transform (block, y0, x0) -> block of the reconstruction: ``restore`` first (the
    checks and the fitted calibration saw restored data), then ``transform``; ``transform`` itself
    when there is nothing to restore."""
    if restore is None:
        return transform

    def restored(block: np.ndarray, y0: int, x0: int) -> np.ndarray:
        out = restore.restore(block)
        return transform(out, y0, x0) if transform is not None else out

    return restored


def camera_counts(data: Any, path: str, counted: bool, report: dict[str, Any], block_bytes: int,
                  psf_sigma_px: float | None = None) -> tuple[Any, bool, CountsRestore | None]:
    """(the data the checks should read, whether they are counts, the restore the reconstruction applies to
    every block or None); the measurement and the finding go into ``report``. ``psf_sigma_px``: the camera's
    point spread (Gaussian sigma, detector pixels; ``--detector-psf-px``), deconvolved, when given, from the
    blocks the model reads (not from what the checks read: see the comment below).
    Refuses (one line) negative data whose noise cannot be measured, and a point spread outside
    0-`MAX_PSF_SIGMA_PX`."""
    psf = _checked_psf(psf_sigma_px)
    noise = measure_noise(data, block_bytes)
    if not counted and NORMALISED_TOTAL[0] <= noise.mean_total <= NORMALISED_TOTAL[1] and not psf:
        return data, counted, None  # normalised (a simulation): counts.dose_record says so
    add_measurement(report, "camera_noise", noise.gain if noise.trusted else None, "counts per electron",
                    **{k: v for k, v in noise.record().items() if k != "gain"})
    restore = _decide(noise, counted, path)
    if restore is not None:
        pixels = data.shape[2] * data.shape[3]
        restore = replace(restore, per_pattern=(noise.mean_total - pixels * restore.dark) / restore.gain)
        add_warning(report, *_finding(noise, restore, hint=not psf))
    # the checks read the restored values as they are: a symmetric point spread that keeps each pattern's
    # total leaves the disc, the centre of mass and the dose where they were, and the checks' passes over
    # a large scan would each repeat the deconvolution; the blocks the model reads get it once
    checked = data if restore is None else RestoredData(data, restore)
    if psf:
        restore = replace(restore or CountsRestore(1.0, 0.0, counted, noise.mean_total), psf_sigma_px=psf)
        add_warning(report, "camera-psf", f"every pattern the model reads was deconvolved from the camera's point "
                                          f"spread (--detector-psf-px {psf:g}: Gaussian sigma in detector pixels; "
                                          f"Richardson-Lucy, {PSF_ITERATIONS} iterations)")
    return checked, counted if restore is None else restore.electrons, restore


def _checked_psf(psf_sigma_px: float | None) -> float:
    """The point spread to deconvolve (0: none); one-line refusal of a value no camera has."""
    if psf_sigma_px is None or psf_sigma_px == 0:
        return 0.0
    if not (0 < psf_sigma_px <= MAX_PSF_SIGMA_PX):
        raise ExperimentalInputError(f"--detector-psf-px {psf_sigma_px!r}: the camera's point spread must be a Gaussian "
                                     f"sigma of 0-{MAX_PSF_SIGMA_PX:g} detector pixels (not mrad, not a full width; "
                                     "FWHM = 2.355 sigma); 0 or leaving it out deconvolves nothing")
    return float(psf_sigma_px)


def _decide(noise: NoiseMeasurement, counted: bool, path: str) -> CountsRestore | None:
    """What to do with data of this noise (see the module docstring). The photon-transfer gain is
    reported, never applied: on a strong specimen the patterns' change between neighbouring probe
    positions outgrows shot noise from ~1e4 e/Angstrom^2 on and biases it (a counted GaAs [011] scan at
    1e4 read a gain of 39), and the maps do not need it (each tile is normalised to a total of 1)."""
    if counted:
        return CountsRestore(float(noise.value_gcd), 0.0, True) if noise.value_gcd > 1 else None
    offset = noise.read_noise > 0 and abs(noise.dark) > 3.0 * noise.read_noise  # a dark level kept in the file
    if noise.negative_fraction <= NEGATIVE_FRACTION and not offset:
        return None  # arbitrary units without read noise: counts.dose_record names them
    if noise.pairs < MIN_PAIRS:
        raise ExperimentalInputError(
            f"{path}: {100 * noise.negative_fraction:.2g}% of its pixels are negative (a camera's read noise "
            f"around a subtracted dark level), but its {noise.pairs} adjacent pattern pairs are too few to measure "
            "the camera's dark level; subtract the dark reference and divide by the gain (counts per electron) "
            "before saving, so the file holds electrons")
    return CountsRestore(1.0, noise.dark, False)


def _finding(noise: NoiseMeasurement, restore: CountsRestore, hint: bool) -> tuple[str, str]:
    """(code, one-line message) of what was measured and done; ``hint``: name the point-spread flag (an
    integrating camera's data, no point spread given)."""
    read = f"read noise {noise.read_noise:.3g} counts rms"
    negative = f"{100 * noise.negative_fraction:.2g}% of the pixels negative"
    if restore.electrons and noise.value_gcd > 1 and restore.gain == noise.value_gcd:
        return "camera-gain", (f"every value is a multiple of {noise.value_gcd}: a camera gain of {restore.gain:g} "
                               "counts per electron; the values were divided by it before the checks and the model "
                               "(the dose is read in electrons)")
    slope = (f"photon-transfer slope {noise.gain:.3g} counts per electron, not used: the specimen biases it"
             if noise.trusted else f"no gain measured: {noise.why}")
    psf = ("; if a scintillator's point spread blurs the patterns, give its sigma from the camera's MTF "
           "calibration as --detector-psf-px to deconvolve it" if hint else "")
    return "camera-noise", (f"the data are not counts: dark level {restore.dark:.3g} counts, {read}, {negative} "
                            f"({slope}); the dark level was subtracted and negatives set to 0 before the checks and "
                            f"the model; no dose can be estimated{psf}")
