"""A microscope's camera: what a 4D-STEM detector records of namsa's patterns (test data that look
like a microscope's, for `namsa reconstruct`).

`record(cbed, step_A, settings)` takes noise-free patterns as namsa simulates them ((scan_y, scan_x,
P, P), k = 0 at index P // 2, each carrying the incident probe's 1) and returns the frames a camera
of `CameraSettings` writes, (scan_y, scan_x, D, D) with k = 0 at D // 2 on a detector of D >= P
pixels, in this order:

1. **scan rotation**: the scan grid rotated by ``scan_rotation_deg`` against the detector, so every
   pattern is turned about k = 0: a (ky, kx) vector of the scan frame appears turned by
   R(-scan_rotation_deg) on the detector, R(t) = [[cos t, -sin t], [sin t, cos t]]. The angle is the
   one stage.microscope.autocal fits (`Rotation.angle_deg`), which maps the detector back.
2. **descan**: each pattern shifted by ``descan_px_per_A`` @ (y, x), its probe position in Angstrom
   ([[dky/dy, dky/dx], [dkx/dy, dkx/dx]], detector px per Angstrom): a shift linear in the scan position.
3. **dose**: dose (e/Angstrom^2) x |step_y| x |step_x| electrons are incident per pattern; the
   expected counts are the pattern times that number.
4. **MTF and counts**. ``mtf="counting"`` (a hybrid-pixel counting detector, Merlin, Arina): each
   electron is counted once, in one pixel, so the MTF acts on the expected intensity before the
   Poisson draw and the noise stays white; the MTF is the pixel aperture's,
   MTF(fy, fx) = sinc(fy) sinc(fx) with f in cycles per pixel (2 / pi at Nyquist; G. McMullan, S. Chen,
   R. Henderson, A. R. Faruqi, Ultramicroscopy 109 (2009) 1126, "Detective quantum efficiency of
   electron area detectors in electron microscopy"). namsa's pixel values already integrate the
   intensity over each pixel, so this is one pixel's more spread: an electron's charge shared with
   its neighbours; the sampled sinc rings below 0 by at most 2% of a bright neighbour, which is
   clipped (a count cannot be negative). ``mtf="scintillator"`` (an integrating camera): the Poisson electrons are turned
   into light that spreads in the scintillator, here a Gaussian point spread of
   ``scintillator_sigma_px``, MTF(f) = exp(-2 pi^2 sigma^2 |f|^2), which blurs the noise as well as the
   signal (the first term of the scintillator models of R. R. Meyer and A. I. Kirkland, Microsc. Res.
   Tech. 49 (2000) 269; measured MTFs have longer tails). ``mtf="none"``: Poisson counts as they fall.
5. **gain and dark noise**: counts = ``gain_counts_per_electron`` x electrons + Gaussian read (dark)
   noise of ``read_noise_counts`` per pixel and frame, zero-mean (a dark reference subtracted), so
   values below 0 occur.

A camera with gain 1, no read noise and no scintillator writes whole counts (uint16, uint32 above
65,535); any other writes float32. Every draw comes from the `SampleStream.CAMERA` stream of ``seed``
(namsa.random_streams): index 0 the electrons, index 1 the read noise, so turning the read noise on
leaves the electrons as they were. Arrays are [row = ky, col = kx] per pattern, (scan_y, scan_x) over the scan.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import ndimage

from .errors import UserError
from .random_streams import MAX_SEED, SampleStream, sample_rng

Mtf = Literal["none", "counting", "scintillator"]
MTFS: tuple[str, ...] = ("none", "counting", "scintillator")


class CameraSettingsError(UserError):
    """A camera setting out of its range (one line naming it)."""


@dataclass(frozen=True)
class CameraSettings:
    """What a camera makes of the patterns (see the module docstring for each step and its units)."""

    dose_e_per_A2: float
    gain_counts_per_electron: float = 1.0
    read_noise_counts: float = 0.0
    mtf: Mtf = "none"
    scintillator_sigma_px: float = 1.0
    descan_px_per_A: tuple[tuple[float, float], tuple[float, float]] = ((0.0, 0.0), (0.0, 0.0))
    scan_rotation_deg: float = 0.0
    detector_px: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [("dose_e_per_A2", self.dose_e_per_A2 > 0, "a positive dose (e/Angstrom^2)"),
                  ("gain_counts_per_electron", self.gain_counts_per_electron > 0, "a positive gain"),
                  ("read_noise_counts", self.read_noise_counts >= 0, "a read noise >= 0 (counts)"),
                  ("scintillator_sigma_px", self.scintillator_sigma_px >= 0, "a point spread >= 0 px"),
                  ("mtf", self.mtf in MTFS, f"one of {', '.join(MTFS)}"),
                  ("seed", isinstance(self.seed, int) and 0 <= self.seed <= MAX_SEED, f"an integer 0..{MAX_SEED}"),
                  ("detector_px", self.detector_px is None or self.detector_px > 0, "a positive pixel count"),
                  ("descan_px_per_A", np.shape(self.descan_px_per_A) == (2, 2), "a 2 x 2 matrix (px per Angstrom)")]
        for name, ok, what in checks:
            if not ok:
                raise CameraSettingsError(f"camera {name}={getattr(self, name)!r}: it must be {what}")
        numbers = [self.dose_e_per_A2, self.gain_counts_per_electron, self.read_noise_counts,
                   self.scintillator_sigma_px, self.scan_rotation_deg, *np.ravel(self.descan_px_per_A)]
        if not all(math.isfinite(float(v)) for v in numbers):
            raise CameraSettingsError(f"camera settings must be finite numbers, got {self}")

    @property
    def counted(self) -> bool:
        """Whether the camera writes whole counts (gain 1, no read noise, no scintillator)."""
        return self.gain_counts_per_electron == 1.0 and self.read_noise_counts == 0.0 and self.mtf != "scintillator"


def electrons_per_pattern(dose_e_per_A2: float, step_A: tuple[float, float]) -> float:
    """Electrons incident per pattern: dose (e/Angstrom^2) over one scan step's area (Angstrom^2)."""
    return dose_e_per_A2 * abs(step_A[0] * step_A[1])


def record(cbed: np.ndarray, step_A: tuple[float, float], settings: CameraSettings) -> np.ndarray:
    """The frames a camera of ``settings`` records of ``cbed`` (scan_y, scan_x, P, P), noise-free and
    normalised, scanned at ``step_A`` (y, x) Angstrom: (scan_y, scan_x, D, D), k = 0 at D // 2."""
    cbed = np.asarray(cbed, dtype=np.float64)
    if cbed.ndim != 4 or cbed.shape[2] != cbed.shape[3]:
        raise CameraSettingsError(f"the patterns must be (scan_y, scan_x, P, P), got shape {cbed.shape}")
    sy, sx, p, _ = cbed.shape
    d = settings.detector_px or p
    if d < p:
        raise CameraSettingsError(f"camera detector_px={d} is smaller than the {p} px patterns; give at least {p}")
    frames = np.empty((sy, sx, d, d))
    for i in range(sy):
        for j in range(sx):
            frames[i, j] = _place(cbed[i, j], d, settings, (i * step_A[0], j * step_A[1]))
    expected = np.clip(frames, 0.0, None) * electrons_per_pattern(settings.dose_e_per_A2, step_A)
    if settings.mtf == "counting":
        expected = np.clip(_filter(expected, _sinc_mtf(d)), 0.0, None)
    electrons = sample_rng(settings.seed, SampleStream.CAMERA, 0).poisson(expected).astype(np.float64)
    if settings.mtf == "scintillator":
        electrons = _filter(electrons, _gaussian_mtf(d, settings.scintillator_sigma_px))
    counts = settings.gain_counts_per_electron * electrons
    if settings.read_noise_counts > 0:
        counts += sample_rng(settings.seed, SampleStream.CAMERA, 1).normal(0.0, settings.read_noise_counts, counts.shape)
    if not settings.counted:
        return counts.astype(np.float32)
    return counts.astype(np.uint16 if counts.max() <= np.iinfo(np.uint16).max else np.uint32)


def _place(pattern: np.ndarray, d: int, s: CameraSettings, position_A: tuple[float, float]) -> np.ndarray:
    """One pattern on the D x D detector: centred (k = 0 at D // 2), turned by the scan rotation about
    k = 0, shifted by the descan at its probe position (y, x) Angstrom; linear interpolation."""
    p = pattern.shape[0]
    out = np.zeros((d, d))
    lo = d // 2 - p // 2
    out[lo: lo + p, lo: lo + p] = pattern
    t = math.radians(s.scan_rotation_deg)
    shift = np.asarray(s.descan_px_per_A, dtype=np.float64) @ np.asarray(position_A, dtype=np.float64)
    if t == 0.0 and not shift.any():
        return out
    centre = np.array([d // 2, d // 2], dtype=np.float64)
    turn = np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])  # R(t): the map back to the scan
    # output pixel k shows input R(t) (k - centre - shift) + centre: vectors turned by R(-t), then shifted
    offset = centre - turn @ (centre + shift)
    return ndimage.affine_transform(out, turn, offset=offset, order=1, mode="constant", cval=0.0)


def _frequencies(d: int) -> tuple[np.ndarray, np.ndarray]:
    """(fy, fx) in cycles per pixel on the grid of `numpy.fft.rfft2` of a D x D pattern."""
    return np.fft.fftfreq(d)[:, None], np.fft.rfftfreq(d)[None, :]


def _sinc_mtf(d: int) -> np.ndarray:
    fy, fx = _frequencies(d)
    return np.sinc(fy) * np.sinc(fx)


def _gaussian_mtf(d: int, sigma_px: float) -> np.ndarray:
    fy, fx = _frequencies(d)
    return np.exp(-2.0 * math.pi ** 2 * sigma_px ** 2 * (fy ** 2 + fx ** 2))


def _filter(frames: np.ndarray, mtf: np.ndarray) -> np.ndarray:
    """Each (.., D, D) frame multiplied by ``mtf`` in Fourier space (MTF(0) = 1: counts are kept)."""
    return np.fft.irfft2(np.fft.rfft2(frames) * mtf, s=frames.shape[-2:])
