"""Training targets over exactly the scanned field of view, on a T x T grid [row = y, col = x].

- Projected potential (V * Angstrom): the total projected potential of the supercell,
  sum over slices of the Fourier series of :mod:`namsa.potential`.
- Projected electron density (electrons / Angstrom^2): the Fourier series
  rho(k) = 1/(Lx Ly) sum_j f_x(Z_j, |k|) exp(-2 pi i k . r_j), with the X-ray form factor f_x from
  the Kirkland electron factors by the Mott-Bethe relation (:func:`namsa.kirkland.xray_form_factor`).
  Its k = 0 term is sum(Z) / area, so the density integrates to the number of electrons per cell.

Both maps are the true maps convolved with a normalised 2-D Gaussian of full width at half maximum
:func:`target_fwhm_A` (multiplied in Fourier space by exp(-2 pi^2 sigma^2 k^2)), then evaluated
exactly (trigonometric interpolation, no resampling error) at the points (y0 + i h / T,
x0 + j w / T), the same endpoint-exclusive convention as the scan grid. A Gaussian, unlike a hard
Fourier cutoff, keeps a non-negative map non-negative (no ringing) and leaves the k = 0 term, the
integral, exactly as it was. Its width is the coarsest of three resolutions (docs/physics.md):
the probe's (0.61 lambda / alpha), two target pixels (so the T x T samples represent the map),
and what the simulation grid can carry (the Gaussian is below 1e-9 at the grid's Nyquist
frequency, so truncating there leaves no visible ring).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import kirkland
from .constants import wavelength_A
from .optics import spatial_frequencies
from .potential import Grid, SlicedPotential

#: data version of the targets: 2 = Gaussian low-pass of stated FWHM (1 = hard Fourier cutoff);
#: part of stage.manifest.code_version, so stores written with other targets are told apart
TARGETS_VERSION = 2

#: FWHM / sigma of a Gaussian
FWHM_PER_SIGMA = 2.0 * math.sqrt(2.0 * math.log(2.0))
#: the Gaussian's largest value at the simulation grid's Nyquist frequency
GRID_EDGE_ATTENUATION = 1e-9


def probe_resolution_A(energy_kv: float, semiangle_mrad: float) -> float:
    """Rayleigh resolution 0.61 lambda / alpha (Angstrom) of a probe of ``semiangle_mrad``."""
    return 0.61 * wavelength_A(energy_kv) / (semiangle_mrad * 1e-3)


def grid_resolution_A(grid: Grid) -> float:
    """Smallest FWHM (Angstrom) whose Gaussian is at most GRID_EDGE_ATTENUATION at the grid's
    (coarser) Nyquist frequency 1 / (2 max(sampling)): exp(-2 pi^2 sigma^2 k^2) = attenuation."""
    k_nyquist = 1.0 / (2.0 * max(grid.sampling))
    sigma = math.sqrt(math.log(1.0 / GRID_EDGE_ATTENUATION) / (2.0 * math.pi ** 2)) / k_nyquist
    return FWHM_PER_SIGMA * sigma


def target_fwhm_A(grid: Grid, fov_A: tuple[float, float, float, float], target_px: int,
                  energy_kv: float, semiangle_mrad: float) -> float:
    """FWHM (Angstrom) of the targets' Gaussian resolution: the coarsest of the probe's
    resolution, two target pixels and the simulation grid's resolution."""
    target_pixel = max(fov_A[2], fov_A[3]) / target_px
    return max(probe_resolution_A(energy_kv, semiangle_mrad), 2.0 * target_pixel, grid_resolution_A(grid))


def gaussian_filter_k(grid: Grid, fwhm_A: float) -> np.ndarray:
    """exp(-2 pi^2 sigma^2 |k|^2) on the grid (FFT order): the Fourier transform of a Gaussian of
    unit integral and FWHM ``fwhm_A``; exactly 1 at k = 0, so integrals are unchanged."""
    ky, kx = spatial_frequencies(grid.gpts, grid.sampling)
    sigma = fwhm_A / FWHM_PER_SIGMA
    return np.exp(-2.0 * math.pi ** 2 * sigma ** 2 * (ky[:, None] ** 2 + kx[None, :] ** 2))


def to_target_resolution(image: np.ndarray, fov_A, fwhm_A: float) -> np.ndarray:
    """``image`` (T, T) [row = y, col = x] sampled over the field of view ``fov_A`` (y0, x0, height,
    width; Angstrom), convolved with the targets' Gaussian of FWHM ``fwhm_A`` (Angstrom), periodic
    over the field as the targets are: a reconstruction sharper than the targets (ptychography) is
    compared with them at their own resolution. Float64."""
    sigma = fwhm_A / FWHM_PER_SIGMA
    qy = np.fft.fftfreq(image.shape[0], d=float(fov_A[2]) / image.shape[0])[:, None]
    qx = np.fft.fftfreq(image.shape[1], d=float(fov_A[3]) / image.shape[1])[None, :]
    kernel = np.exp(-2.0 * math.pi ** 2 * sigma ** 2 * (qy ** 2 + qx ** 2))
    return np.fft.ifft2(np.fft.fft2(np.asarray(image, dtype=np.float64)) * kernel).real


def density_coefficients(potential: SlicedPotential) -> np.ndarray:
    """Fourier coefficients (FFT order) of the projected electron density (electrons / Angstrom^2)."""
    grid = potential.grid
    ky, kx = spatial_frequencies(grid.gpts, grid.sampling)
    k = np.sqrt(ky[:, None] ** 2 + kx[None, :] ** 2)
    total = np.zeros(grid.gpts, dtype=np.complex128)
    for z, sf in potential.species_sf.items():
        total += kirkland.xray_form_factor(z, k) * sf
    return total / grid.area


def evaluate_fourier_series(coeffs: np.ndarray, grid: Grid, fov_A: tuple[float, float, float, float],
                            target_px: int) -> np.ndarray:
    """(T, T) float32 values of the Fourier series ``coeffs`` (FFT order) at the fov points."""
    ky, kx = spatial_frequencies(grid.gpts, grid.sampling)
    y0, x0, h, w = fov_A
    ys = y0 + np.arange(target_px) * (h / target_px)
    xs = x0 + np.arange(target_px) * (w / target_px)
    ey = np.exp(2j * np.pi * ys[:, None] * ky[None, :])
    ex = np.exp(2j * np.pi * kx[:, None] * xs[None, :])
    return (ey @ coeffs @ ex).real.astype(np.float32)


def _device_smoothed_map(coeffs: np.ndarray, grid: Grid, fov_A, target_px: int, fwhm_A: float,
                         backend: Any) -> np.ndarray:
    """:func:`smoothed_map` on a GPU backend: the Gaussian and the two complex128 GEMMs (the targets'
    bulk, ~0.7 s of host time at paper size) run there, the same formulas in the same precision."""
    # the caller may be a pool thread (namsa.pipelined), whose current CUDA device is still device 0
    with backend.device_scope():
        return _device_gemms(coeffs, grid, fov_A, target_px, fwhm_A, backend)


def _device_gemms(coeffs: np.ndarray, grid: Grid, fov_A, target_px: int, fwhm_A: float, backend: Any) -> np.ndarray:
    xp = backend.xp
    ky, kx = (xp.asarray(k) for k in spatial_frequencies(grid.gpts, grid.sampling))
    sigma = fwhm_A / FWHM_PER_SIGMA
    filtered = xp.asarray(coeffs) * xp.exp(-2.0 * math.pi ** 2 * sigma ** 2 * (ky[:, None] ** 2 + kx[None, :] ** 2))
    y0, x0, h, w = fov_A
    ys = y0 + xp.arange(target_px) * (h / target_px)
    xs = x0 + xp.arange(target_px) * (w / target_px)
    ey = xp.exp(2j * np.pi * ys[:, None] * ky[None, :])
    ex = xp.exp(2j * np.pi * kx[:, None] * xs[None, :])
    return backend.asnumpy((ey @ filtered @ ex).real.astype(xp.float32))


def smoothed_map(coeffs: np.ndarray, grid: Grid, fov_A, target_px: int, fwhm_A: float,
                 backend: Any = None) -> np.ndarray:
    """The series ``coeffs`` convolved with the Gaussian of ``fwhm_A``, (T, T) float32 over the fov;
    on a GPU ``backend`` computed there (:func:`_device_smoothed_map`), else on the host as always."""
    if backend is not None and backend.on_device:
        return _device_smoothed_map(coeffs, grid, fov_A, target_px, fwhm_A, backend)
    return evaluate_fourier_series(coeffs * gaussian_filter_k(grid, fwhm_A), grid, fov_A, target_px)


def projected_potential_map(potential: SlicedPotential, fov_A, target_px: int, fwhm_A: float,
                            backend: Any = None) -> np.ndarray:
    """Projected potential (V * Angstrom) at resolution ``fwhm_A`` over the fov, (T, T) float32
    (computed on ``backend`` when it is a GPU)."""
    return smoothed_map(potential.projected_k(), potential.grid, fov_A, target_px, fwhm_A, backend)


def projected_density_map(potential: SlicedPotential, fov_A, target_px: int, fwhm_A: float,
                          backend: Any = None) -> np.ndarray:
    """Projected electron density (electrons / Angstrom^2) at resolution ``fwhm_A`` over the fov
    (the form factors on the host, the smoothing and evaluation on ``backend`` when it is a GPU)."""
    return smoothed_map(density_coefficients(potential), potential.grid, fov_A, target_px, fwhm_A, backend)
