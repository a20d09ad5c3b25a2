"""Probe-forming optics on a periodic grid: frequencies, band limit, aperture, aberrations, scan.

Conventions: grids are [row = y, col = x]; ``gpts = (ny, nx)``, ``sampling = (dy, dx)`` in
Angstrom. Fourier-space arrays are kept in FFT order (``numpy.fft.fftfreq``) internally and
shifted so that k = 0 sits at index N // 2 only for output. A real-space wave is normalised so
that sum |psi|^2 = 1; its FFT (numpy "backward" norm) therefore has sum |Psi|^2 = ny * nx.
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from .constants import mrad_per_inv_A, wavelength_A
from .errors import UserError


class SamplingError(UserError):
    """The grid is too coarse for the requested optics."""


def spatial_frequencies(gpts: tuple[int, int], sampling: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """(ky, kx) 1-D spatial frequencies (1/Angstrom) in FFT order."""
    return (np.fft.fftfreq(gpts[0], d=sampling[0]), np.fft.fftfreq(gpts[1], d=sampling[1]))


def frequency_grid(gpts: tuple[int, int], sampling: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """(ky^2 + kx^2) as a (ny, nx) array and the two 1-D axes, FFT order (1/Angstrom)."""
    ky, kx = spatial_frequencies(gpts, sampling)
    return ky[:, None] ** 2 + kx[None, :] ** 2, (ky, kx)


def band_limit_frequency(sampling: tuple[float, float], band_limit: float) -> float:
    """Cutoff |k| (1/Angstrom) of the antialiasing aperture: ``band_limit`` x the coarser Nyquist."""
    return band_limit / (2.0 * max(sampling))


def in_band(k2: np.ndarray, cutoff: float) -> np.ndarray:
    """|k| < cutoff, with frequencies within 1e-9 (relative) of the cutoff counted as outside, so
    that grids that compute the same frequency with different round-off agree on the edge."""
    return k2 < cutoff ** 2 * (1.0 - 1e-9)


def band_limit_mask(gpts: tuple[int, int], sampling: tuple[float, float], band_limit: float) -> np.ndarray:
    """(ny, nx) float32 disc mask, 1 where |k| < band_limit * k_Nyquist (FFT order)."""
    k2, _ = frequency_grid(gpts, sampling)
    return in_band(k2, band_limit_frequency(sampling, band_limit)).astype(np.float32)


def required_sampling_A(energy_kv: float, semiangle_mrad: float, band_limit: float) -> float:
    """Coarsest sampling (Angstrom) whose band limit still contains the probe aperture."""
    return band_limit * wavelength_A(energy_kv) / (2.0 * semiangle_mrad * 1e-3)


def check_sampling(sampling: tuple[float, float], energy_kv: float, semiangle_mrad: float,
                   band_limit: float) -> None:
    """UserError when the aperture does not fit inside the band limit of this grid."""
    need = required_sampling_A(energy_kv, semiangle_mrad, band_limit)
    if max(sampling) > need:
        raise SamplingError(
            f"sampling {max(sampling):.4f} Angstrom is too coarse for semiangle_mrad={semiangle_mrad} at "
            f"{energy_kv} kV: the aperture (k = {semiangle_mrad / mrad_per_inv_A(energy_kv):.3f} 1/Angstrom) "
            f"must lie inside the band limit ({band_limit:.3g} x Nyquist); use sampling_A <= {need:.4f} "
            f"(adequate for intensity >= 0.99: about 0.05-0.1 Angstrom) or more gpts")


def aberration_phase(alpha: np.ndarray, wavelength: float, C1_A: float = 0.0, C3_mm: float = 0.0) -> np.ndarray:
    """chi(alpha) = 2 pi / lambda (C1 alpha^2 / 2 + C3 alpha^4 / 4) (rad); alpha in rad, C1 in Angstrom."""
    c3_A = C3_mm * 1e7
    return 2.0 * np.pi / wavelength * (0.5 * C1_A * alpha ** 2 + 0.25 * c3_A * alpha ** 4)


def probe_fourier(gpts: tuple[int, int], sampling: tuple[float, float], energy_kv: float,
                  semiangle_mrad: float, C1_A: float = 0.0, C3_mm: float = 0.0,
                  band_limit: float = 2.0 / 3.0, backend=None):
    """Probe at the origin in Fourier space, (ny, nx) complex128, FFT order, sum |Psi|^2 = ny * nx.

    Soft-edged aperture: the transmission falls linearly from 1 to 0 across one pixel, measured
    along the radial direction (sqrt((cos(phi) dkx)^2 + (sin(phi) dky)^2) for rectangular k-pixels),
    centred on the cutoff, so the disc area does not jump by whole pixels as the grid changes.
    Band-limited. With a GPU ``backend`` it is computed (in float64) on that device and stays there
    (the host took ~0.3 s at 1080^2); without, on the host as always.
    """
    xp = np if backend is None else backend.xp
    wavelength = wavelength_A(energy_kv)
    ky, kx = spatial_frequencies(gpts, sampling)
    if backend is not None:
        ky, kx = backend.asarray(ky), backend.asarray(kx)
    k2 = ky[:, None] ** 2 + kx[None, :] ** 2
    alpha = wavelength * xp.sqrt(k2)
    dky, dkx = 1.0 / (gpts[0] * sampling[0]), 1.0 / (gpts[1] * sampling[1])
    phi = xp.arctan2(ky[:, None], kx[None, :])
    radial_pixel = wavelength * xp.hypot(xp.cos(phi) * dkx, xp.sin(phi) * dky)
    cutoff = semiangle_mrad * 1e-3
    aperture = xp.clip((cutoff - alpha) / radial_pixel + 0.5, 0.0, 1.0)
    aperture *= in_band(k2, band_limit_frequency(sampling, band_limit)).astype(np.float32)
    psi = aperture * xp.exp(-1j * aberration_phase(alpha, wavelength, C1_A, C3_mm))
    norm = float(xp.sqrt((xp.abs(psi) ** 2).sum() / (gpts[0] * gpts[1])))
    if norm == 0:
        raise SamplingError(f"the {semiangle_mrad} mrad aperture contains no grid frequency; use a larger cell "
                            "or a larger semiangle_mrad")
    return psi / norm


def scan_step_A(fov_A: Sequence[float], scan_shape: Sequence[int]) -> tuple[float, float]:
    """(step_y, step_x) Angstrom of a scan of ``scan_shape`` positions over ``fov_A`` = [y0, x0, height,
    width]: endpoint-exclusive, so a field of view of one period tiles seamlessly."""
    return float(fov_A[2]) / int(scan_shape[0]), float(fov_A[3]) / int(scan_shape[1])


def scan_positions(fov_A: tuple[float, float, float, float], scan_shape: tuple[int, int]) -> np.ndarray:
    """(sy * sx, 2) probe positions [y, x] (Angstrom), row-major, endpoint-exclusive over the fov.

    ``fov_A`` = [y0, x0, height, width]; position (i, j) = (y0 + i h / sy, x0 + j w / sx), so a
    fov of one full period tiles seamlessly.
    """
    step_y, step_x = scan_step_A(fov_A, scan_shape)
    yy = fov_A[0] + np.arange(scan_shape[0]) * step_y
    xx = fov_A[1] + np.arange(scan_shape[1]) * step_x
    grid = np.stack(np.meshgrid(yy, xx, indexing="ij"), axis=-1)
    return grid.reshape(-1, 2)


def shift_phases(positions_A: np.ndarray, gpts: tuple[int, int], sampling: tuple[float, float],
                 dtype=np.complex64) -> tuple[np.ndarray, np.ndarray]:
    """Separable Fourier phase ramps exp(-2 pi i k.r0): (B, ny) and (B, nx) for positions [y, x]."""
    ky, kx = spatial_frequencies(gpts, sampling)
    pos = np.asarray(positions_A, dtype=float).reshape(-1, 2)
    phase_y = np.exp(-2j * np.pi * pos[:, :1] * ky[None, :]).astype(dtype)
    phase_x = np.exp(-2j * np.pi * pos[:, 1:] * kx[None, :]).astype(dtype)
    return phase_y, phase_x


def plane_wave_rows(fraction: np.ndarray, n: int, backend) -> object:
    """exp(-2 pi i m u) for each fractional coordinate u (position / cell length) and signed frequency
    m of an n-point grid, (len(u), n) complex64, built on ``backend`` (a GPU's array module): the
    structure factors' and the probe shifts' phase rows. m u is reduced modulo 1 in float64 before
    the float32 exponential: it reaches ~10^3 turns in a 100 Angstrom cell, whose float32 phase would
    be off by ~1e-4 rad."""
    xp = backend.xp
    m = backend.asarray(_signed_frequencies(n))
    turns = backend.asarray(np.asarray(fraction, dtype=float))[:, None] * m[None, :]
    turns -= xp.floor(turns)
    return xp.exp((turns * (-2.0 * np.pi)).astype(np.float32).astype(np.complex64) * np.complex64(1j))


@functools.lru_cache(maxsize=64)
def _signed_frequencies(n: int) -> np.ndarray:
    """Signed integer frequencies of an n-point FFT (FFT order), float64; cached (read-only)."""
    m = np.fft.fftfreq(n, 1.0 / n).round()
    m.flags.writeable = False
    return m
