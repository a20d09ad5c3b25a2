"""Undoing an integrating camera's point spread before the model sees the patterns.

A scintillator camera spreads each electron's light over neighbouring pixels (its MTF). The model was
trained on patterns without that spread (and, through `data.camera_augmentation`, on some with it), and a
blurred scan of a weakly scattering crystal still scores 1.5x worse than the same scan as counts (Si [001]:
benchmarks/bench_camera_noise.py; sigma 1.5 px on dev: 1.6x, benchmarks/psf_deconvolution_study.py). The spread cannot be read reliably from a specimen's scan: the
noise correlation the photon-transfer measurement reports (`NoiseMeasurement.psf_sigma_px`) is biased by
the specimen's own change between neighbouring probe positions (a counted Si [001] scan reads 1.3 px
of blur). It is a property of the camera, measured by its maker or the microscopist (a knife-edge or
noise-power MTF), so `namsa reconstruct --detector-psf-px SIGMA` takes it as a calibration.

The deconvolution is Richardson-Lucy (W. H. Richardson, J. Opt. Soc. Am. 62 (1972) 55; L. B. Lucy,
Astron. J. 79 (1974) 745), the maximum-likelihood iteration for Poisson counts, with a Gaussian point
spread of sigma ``psf_sigma_px`` detector pixels (zero light beyond the detector's edge). It keeps every
value >= 0 and, away from the edges, each pattern's total. Axis order: (..., ky, kx).
"""
from __future__ import annotations

import numpy as np
from scipy.ndimage import gaussian_filter

#: Richardson-Lucy iterations, chosen on the study's dev split through a scintillator
#: (benchmarks/psf_deconvolution_study.py; docs/experimental-data.md, "A camera's point spread"): 20 gain
#: 0.004 more at the true sigma, but a sigma given 30% too large then costs +0.035 where 10 cost +0.010
#: (not significant), and camera calibrations are no better than that
PSF_ITERATIONS = 10
#: the largest point spread taken (detector pixels): a wider blur leaves too little to restore, and a
#: value this large is more likely a unit mistake (mrad, or the full width)
MAX_PSF_SIGMA_PX = 5.0
#: the patterns deconvolved at once (bytes of float64): the iteration holds four copies of them, so a
#: reconstruction's block (sized to --memory-gb) needs only this much more, whatever its size
CHUNK_BYTES = 32 << 20
#: floor of the estimate and of its re-blurred values (electrons): no division by zero in the dark field,
#: where no electron fell, and no pixel held at 0 by the iteration's product
_FLOOR = 1e-6


def blur(block: np.ndarray, sigma_px: float) -> np.ndarray:
    """``block`` (..., ky, kx) seen through a Gaussian point spread of ``sigma_px`` pixels (zero beyond
    the edge)."""
    return gaussian_filter(block, sigma_px, axes=(-2, -1), mode="constant", truncate=4.0)


def deconvolve(block: np.ndarray, sigma_px: float, iterations: int = PSF_ITERATIONS, *,
               in_place: bool = False) -> np.ndarray:
    """Richardson-Lucy estimate of the patterns ``block`` (..., ky, kx), values >= 0, before a Gaussian
    point spread of ``sigma_px`` detector pixels; float64, in chunks of at most `CHUNK_BYTES`. ``in_place``:
    written into ``block`` itself (a float64 array the caller owns), so no second block is held."""
    # contiguous, so that the reshape below is a view and the chunks land in ``out`` (a strided float64 block
    # asked for in place is copied once: writing through a reshaped copy would lose the result)
    out = np.ascontiguousarray(block, dtype=np.float64) if in_place else np.array(block, dtype=np.float64, order="C")
    flat = out.reshape(-1, *out.shape[-2:])
    step = max(1, CHUNK_BYTES // max(1, flat[0].nbytes))
    for start in range(0, len(flat), step):
        flat[start:start + step] = _richardson_lucy(flat[start:start + step], sigma_px, iterations)
    return out


def _richardson_lucy(observed: np.ndarray, sigma_px: float, iterations: int) -> np.ndarray:
    """The iteration on (n, ky, kx) ``observed`` (module docstring). The spread is symmetric, so the
    iteration's adjoint blur is the blur itself."""
    estimate = np.maximum(observed, _FLOOR)  # a pixel at 0 would stay 0: the iteration is a product
    for _ in range(iterations):
        estimate *= blur(observed / np.maximum(blur(estimate, sigma_px), _FLOOR), sigma_px)
    return estimate
