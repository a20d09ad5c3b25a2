"""The detector model: intensity-conserving rebinning of FFT-order patterns to P x P around k = 0,
and the Poisson shot noise of a finite dose."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .backend import Backend
from .potential import Grid
from .random_streams import SampleStream, sample_rng
from .sampling import detector_pixel_inv_A


def overlap_matrix(source_edges: np.ndarray, target_edges: np.ndarray) -> np.ndarray:
    """(n_target, n_source) fraction of each source bin that falls in each target bin.

    Intensity-conserving rebinning of a histogram assuming uniform intensity within a source pixel.
    """
    lo = np.maximum(target_edges[:-1, None], source_edges[None, :-1])
    hi = np.minimum(target_edges[1:, None], source_edges[None, 1:])
    width = np.diff(source_edges)[None, :]
    return np.clip(hi - lo, 0.0, None) / width


def pattern_rebinner(grid: Grid, band_limit: float, pattern_px: int,
                     backend: Backend | None = None) -> tuple[Callable[[Any], Any], float]:
    """Reducer mapping (b, ny, nx) FFT-order intensities to (b, P, P) around k = 0 at index P // 2.

    The P x P pattern spans the band-limited disc: pixel size dk = 2 k_max / P (1/Angstrom),
    pixel p covering [(p - P//2 - 1/2) dk, (p - P//2 + 1/2) dk). Returns the reducer and dk.
    With ``backend`` the reducer takes and returns that backend's arrays (the rebinning matrices
    live on its device, so a GPU batch is rebinned there); on CPU the numbers are the same either way.
    """
    dk_out = detector_pixel_inv_A(grid.sampling, band_limit, pattern_px)
    target = (np.arange(pattern_px + 1) - pattern_px // 2 - 0.5) * dk_out
    mats = []
    for n, length in zip(grid.gpts, grid.extent):
        dk = 1.0 / length
        source = (np.arange(n + 1) - n // 2 - 0.5) * dk
        # fold the fftshift into the matrix: column i of the shifted array is FFT index (i - n//2) % n
        shifted = overlap_matrix(source, target)
        fft_order = np.empty_like(shifted)
        fft_order[:, (np.arange(n) - n // 2) % n] = shifted
        mats.append(fft_order.astype(np.float32))
    wy, wx = mats
    xp = np if backend is None else backend.xp
    if backend is not None:
        wy, wx = backend.asarray(wy), backend.asarray(wx)
    wx_t = wx.T

    def reduce(intensity: Any) -> Any:
        return xp.matmul(xp.matmul(wy, intensity), wx_t)

    return reduce, dk_out


def poisson_noise(cbed: np.ndarray, electrons_per_pattern: float, seed: int) -> np.ndarray:
    """Shot noise of a finite dose: each pattern (intensities summing to ~1) becomes Poisson counts
    of ``electrons_per_pattern`` incident electrons, divided by that number again, so noisy and
    noise-free stacks share one intensity scale. Its own random stream (namsa.random_streams)."""
    rng = sample_rng(seed, SampleStream.SHOT_NOISE)
    counts = rng.poisson(np.clip(cbed, 0.0, None).astype(np.float64) * electrons_per_pattern)
    return (counts / electrons_per_pattern).astype(np.float32)
