"""Training targets over exactly the scanned field of view, on a T x T grid [row = y, col = x].

- Projected potential (V * Angstrom): the total projected potential of the supercell,
  sum over slices of the Fourier series of :mod:`namsa.potential`.
- Projected electron density (electrons / Angstrom^2): the Fourier series
  rho(k) = 1/(Lx Ly) sum_j f_x(Z_j, |k|) exp(-2 pi i k . r_j), with the X-ray form factor f_x from
  the Kirkland electron factors by the Mott-Bethe relation (:func:`namsa.kirkland.xray_form_factor`).
  Its k = 0 term is sum(Z) / area, so the density integrates to the number of electrons per cell.

Both maps are evaluated exactly (trigonometric interpolation, no resampling error) at the points
(y0 + i h / T, x0 + j w / T), the same endpoint-exclusive convention as the scan grid, after a
low-pass at the smaller of the simulation band limit and the target grid's own Nyquist
frequency, so a coarse target grid does not alias.
"""
from __future__ import annotations

import numpy as np

from . import kirkland
from .optics import band_limit_frequency, spatial_frequencies
from .potential import Grid, SlicedPotential


def density_coefficients(potential: SlicedPotential) -> np.ndarray:
    """Fourier coefficients (FFT order) of the projected electron density (electrons / Angstrom^2)."""
    grid = potential.grid
    ky, kx = spatial_frequencies(grid.gpts, grid.sampling)
    k = np.sqrt(ky[:, None] ** 2 + kx[None, :] ** 2)
    total = np.zeros(grid.gpts, dtype=np.complex128)
    for z, sf in potential.species_sf.items():
        total += kirkland.xray_form_factor(z, k) * sf
    return total / grid.area


def target_cutoff(grid: Grid, fov_A: tuple[float, float, float, float], target_px: int, band_limit: float) -> float:
    """Low-pass cutoff |k| (1/Angstrom) for a T x T target over ``fov_A``."""
    target_pixel = max(fov_A[2], fov_A[3]) / target_px
    return min(band_limit_frequency(grid.sampling, band_limit), 1.0 / (2.0 * target_pixel))


def evaluate_fourier_series(coeffs: np.ndarray, grid: Grid, fov_A: tuple[float, float, float, float],
                            target_px: int, cutoff: float) -> np.ndarray:
    """(T, T) float32 values of the series at the fov points, frequencies |k| >= cutoff removed."""
    ky, kx = spatial_frequencies(grid.gpts, grid.sampling)
    kept = coeffs * ((ky[:, None] ** 2 + kx[None, :] ** 2) < cutoff ** 2)
    y0, x0, h, w = fov_A
    ys = y0 + np.arange(target_px) * (h / target_px)
    xs = x0 + np.arange(target_px) * (w / target_px)
    ey = np.exp(2j * np.pi * ys[:, None] * ky[None, :])
    ex = np.exp(2j * np.pi * kx[:, None] * xs[None, :])
    return (ey @ kept @ ex).real.astype(np.float32)


def projected_potential_map(potential: SlicedPotential, fov_A, target_px: int, band_limit: float) -> np.ndarray:
    """Projected potential (V * Angstrom) over the fov, (T, T) float32."""
    cutoff = target_cutoff(potential.grid, fov_A, target_px, band_limit)
    return evaluate_fourier_series(potential.projected_k(), potential.grid, fov_A, target_px, cutoff)


def projected_density_map(potential: SlicedPotential, fov_A, target_px: int, band_limit: float) -> np.ndarray:
    """Projected electron density (electrons / Angstrom^2) over the fov, (T, T) float32."""
    cutoff = target_cutoff(potential.grid, fov_A, target_px, band_limit)
    return evaluate_fourier_series(density_coefficients(potential), potential.grid, fov_A, target_px, cutoff)
