"""Projected potentials and transmission functions from Kirkland parameters, periodic in-plane.

Integration route (documented in docs/physics.md): each slice's projected potential is built in
Fourier space as the exact Fourier series of the periodic cell,

    V_s(k) = 1/(Lx Ly) sum_{atoms j in slice s} 2 pi a0 e f_e(Z_j, |k|) exp(-2 pi i k . r_j),

for every grid frequency up to Nyquist, and transformed to real space. Atoms keep their exact
(sub-pixel) positions, the cell is periodic in x and y, and each atom's full projected potential
goes to the slice that holds its centre. The structure-factor sum is separable in x and y, so it
runs as one complex matrix product per slice and species. Units: V in V * Angstrom (projected),
positions [x, y, z] in Angstrom, arrays [row = y, col = x].
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.fft

from . import kirkland
from .constants import FE_TO_POTENTIAL_V_A2
from .errors import UserError
from .optics import band_limit_mask, plane_wave_rows, spatial_frequencies


class CellError(UserError):
    """The supercell or grid cannot be simulated as given."""


@dataclass(frozen=True)
class Grid:
    """A periodic simulation grid: ``gpts = (ny, nx)``, ``sampling = (dy, dx)`` Angstrom, ``extent = (Ly, Lx)``."""

    gpts: tuple[int, int]
    sampling: tuple[float, float]

    @property
    def extent(self) -> tuple[float, float]:
        return (self.gpts[0] * self.sampling[0], self.gpts[1] * self.sampling[1])

    @property
    def area(self) -> float:
        return self.extent[0] * self.extent[1]


def fast_fft_length(n: int) -> int:
    """Smallest m >= n of the form 2^a 3^b: FFTW is 2-3x faster on these than on sizes with
    factors 5 or 7 (measured: 64 x 48 at 4.7 ns/pixel vs 63 x 45 at 15.6 ns/pixel)."""
    best = 1 << max(0, int(n - 1).bit_length())
    power3 = 1
    while power3 < best:
        m = power3
        while m < n:
            m *= 2
        best = min(best, m)
        power3 *= 3
    return best


def smooth_fft_length(n: int) -> int:
    """Smallest m >= n of the form 2^a 3^b 5^c (cuFFT and FFTW run these in their fastest kernels;
    a factor 13 or 19 falls back to slower generic code)."""
    m = max(1, n)
    while True:
        rest = m
        for p in (2, 3, 5):
            while rest % p == 0:
                rest //= p
        if rest == 1:
            return m
        m += 1


#: `make_grid` rounds a grid side up to whole pixels per unit cell and then to a 2^a 3^b (or 5-smooth)
#: count, so its pixel is finer than ``sampling_A`` by less than this factor (e.g. 36.01 pixels per
#: tile -> 48: 1.333) for tiles of at least 5 pixels (every unit cell at a sampling of 0.5 Angstrom or finer)
GRID_REFINEMENT_MAX = 4.0 / 3.0


def grid_spacing_range_A(sampling_A: float) -> tuple[float, float]:
    """(finest, coarsest) grid pixel (Angstrom) `make_grid` gives for ``sampling_A``: its rounding bound."""
    return sampling_A / GRID_REFINEMENT_MAX, sampling_A


def make_grid(cell_A: tuple[float, float, float] | np.ndarray, sampling_A: float | None = None,
              gpts: int | tuple[int, int] | None = None, tiling: tuple[int, ...] | None = None,
              fft_friendly: bool = False) -> Grid:
    """Grid covering the cell (Lx, Ly, Lz) exactly: ``gpts`` wins, else the smallest pixel count
    with pixels no larger than ``sampling_A``, made a multiple of the supercell's ``tiling``
    (nx, ny, ...) when given (so each tile holds a whole number of pixels), with a per-tile count
    that is a product of 2s and 3s (:func:`fast_fft_length`); the pixel is then at most
    `GRID_REFINEMENT_MAX` times finer than ``sampling_A`` (:func:`grid_spacing_range_A`).

    ``fft_friendly``: every side a 2^a 3^b 5^c count (:func:`smooth_fft_length`), for GPUs: still a
    multiple of the tiling when the tile count itself is 5-smooth; a tiling of 13 or 19 repeats
    gives up whole tiles (the periodic path then samples its tile on a grid of its own)."""
    lx, ly = float(cell_A[0]), float(cell_A[1])
    if gpts is not None:
        ny, nx = (gpts, gpts) if np.isscalar(gpts) else (int(gpts[0]), int(gpts[1]))
    elif sampling_A is not None:
        reps = (1, 1) if tiling is None else (int(tiling[1]), int(tiling[0]))
        ny, nx = (_side(length, sampling_A, rep, fft_friendly) for length, rep in zip((ly, lx), reps))
    else:
        raise CellError("give sampling_A (Angstrom/pixel) or gpts (pixels per side)")
    if min(ny, nx) < 8:
        raise CellError(f"grid {ny}x{nx} is too small; use at least 8 pixels per side (smaller sampling_A)")
    return Grid(gpts=(int(ny), int(nx)), sampling=(ly / ny, lx / nx))


def _side(length: float, sampling_A: float, rep: int, fft_friendly: bool) -> int:
    """Pixels along one side of ``length`` Angstrom tiled ``rep`` times (see :func:`make_grid`)."""
    per_tile = int(np.ceil(length / (sampling_A * rep) - 1e-9))
    if not fft_friendly:
        return rep * fast_fft_length(per_tile)
    if smooth_fft_length(rep) == rep:
        return rep * smooth_fft_length(per_tile)
    return smooth_fft_length(int(np.ceil(length / sampling_A - 1e-9)))


def slice_edges_A(thickness_A: float, slice_thickness_A: float) -> np.ndarray:
    """Edges (Angstrom) of equal slices through ``thickness_A``, each as close to the requested thickness."""
    n = max(1, int(round(thickness_A / slice_thickness_A)))
    return np.linspace(0.0, thickness_A, n + 1)


def assign_slices(z_A: np.ndarray, edges_A: np.ndarray) -> np.ndarray:
    """Slice index of each atom (by its centre; periodic along z within the cell thickness).

    Crystal planes often sit exactly on slice edges; a 1e-6 Angstrom nudge downstream makes
    symmetry-equivalent atoms (equal z up to round-off) land in the same slice.
    """
    z = np.mod(np.asarray(z_A, dtype=float) + 1e-6, edges_A[-1])
    return np.clip(np.searchsorted(edges_A, z, side="right") - 1, 0, len(edges_A) - 2)


def structure_factor(xy_A: np.ndarray, grid: Grid) -> np.ndarray:
    """sum_j exp(-2 pi i k . r_j) on the grid (ny, nx), FFT order; ``xy_A`` rows are [x, y]."""
    ky, kx = spatial_frequencies(grid.gpts, grid.sampling)
    if len(xy_A) == 0:
        return np.zeros(grid.gpts, dtype=np.complex128)
    ey = np.exp(-2j * np.pi * xy_A[:, 1:2] * ky[None, :])
    ex = np.exp(-2j * np.pi * xy_A[:, 0:1] * kx[None, :])
    return ey.T @ ex


def _species_factor_cache(numbers: np.ndarray, grid: Grid, func) -> dict[int, np.ndarray]:
    ky, kx = spatial_frequencies(grid.gpts, grid.sampling)
    k = np.sqrt(ky[:, None] ** 2 + kx[None, :] ** 2)
    return {int(z): func(int(z), k) for z in np.unique(numbers)}


def check_elements(numbers: np.ndarray) -> None:
    """UserError naming any atomic number the Kirkland table lacks."""
    bad = sorted({int(z) for z in np.unique(numbers) if not 1 <= int(z) <= kirkland.MAX_Z})
    if bad:
        raise CellError(f"atomic numbers {bad} have no Kirkland parameters (Z must be 1..{kirkland.MAX_Z}); "
                        "remove those atoms or replace the structure")


@dataclass
class SlicedPotential:
    """Per-slice Fourier coefficients of the projected potential plus per-species totals.

    ``slices_k``: (n_slices, ny, nx) complex128, FFT order, V * Angstrom (Fourier-series
    coefficients: real-space value = sum_k V(k) exp(2 pi i k.r)). ``species_sf``: total structure
    factor per atomic number, summed over slices (for the density target).
    """

    grid: Grid
    edges_A: np.ndarray
    slices_k: np.ndarray
    species_sf: dict[int, np.ndarray]

    @property
    def n_slices(self) -> int:
        return len(self.edges_A) - 1

    @property
    def slice_thickness_A(self) -> np.ndarray:
        return np.diff(self.edges_A)

    def projected_k(self) -> np.ndarray:
        """Fourier coefficients of the total projected potential (V * Angstrom)."""
        return self.slices_k.sum(axis=0)

    def slice_real(self, index: int) -> np.ndarray:
        """Real-space projected potential of slice ``index`` (V * Angstrom), (ny, nx) float64."""
        return fourier_series_to_real(self.slices_k[index])

    def projected_real(self) -> np.ndarray:
        """Real-space total projected potential (V * Angstrom), (ny, nx) float64."""
        return fourier_series_to_real(self.projected_k())


def fourier_series_to_real(coeffs: np.ndarray) -> np.ndarray:
    """Evaluate a Fourier series given by FFT-ordered coefficients at the grid points (real part)."""
    n = coeffs.shape[-1] * coeffs.shape[-2]
    return scipy.fft.ifft2(coeffs, axes=(-2, -1)).real * n


def build_potential(positions_A: np.ndarray, numbers: np.ndarray, cell_A, grid: Grid,
                    slice_thickness_A: float) -> SlicedPotential:
    """Slice the supercell (positions [x, y, z], Angstrom; cell (Lx, Ly, Lz)) into projected potentials."""
    positions_A = np.asarray(positions_A, dtype=float)
    numbers = np.asarray(numbers, dtype=int)
    check_elements(numbers)
    edges = slice_edges_A(float(cell_A[2]), slice_thickness_A)
    slice_of = assign_slices(positions_A[:, 2], edges)
    factors = _species_factor_cache(numbers, grid, kirkland.potential_fourier_coefficient)
    slices_k = np.zeros((len(edges) - 1, *grid.gpts), dtype=np.complex128)
    species_sf = {z: np.zeros(grid.gpts, dtype=np.complex128) for z in factors}
    for s in range(len(edges) - 1):
        in_slice = slice_of == s
        for z, factor in factors.items():
            atoms = in_slice & (numbers == z)
            if not atoms.any():
                continue
            sf = structure_factor(positions_A[atoms, :2], grid)
            species_sf[z] += sf
            slices_k[s] += factor * sf
    slices_k /= grid.area
    return SlicedPotential(grid=grid, edges_A=edges, slices_k=slices_k, species_sf=species_sf)


def transmission_functions(potential: SlicedPotential, sigma: float, band_limit: float,
                           dtype=np.complex64) -> tuple[np.ndarray, float]:
    """exp(i sigma V_s) per slice, band-limited to ``band_limit`` x Nyquist; (n_slices, ny, nx).

    Also returns the largest fraction of |t|^2 removed by the band limit in any slice (the
    antialiasing loss on the transmission function; small when the sampling is adequate).
    """
    mask = band_limit_mask(potential.grid.gpts, potential.grid.sampling, band_limit)
    out = np.empty((potential.n_slices, *potential.grid.gpts), dtype=dtype)
    worst_loss = 0.0
    for s in range(potential.n_slices):
        t = np.exp(1j * sigma * potential.slice_real(s))
        t_k = scipy.fft.fft2(t)
        total = float((np.abs(t_k) ** 2).sum())
        t_k *= mask
        worst_loss = max(worst_loss, 1.0 - float((np.abs(t_k) ** 2).sum()) / total)
        out[s] = scipy.fft.ifft2(t_k)
    return out, worst_loss


# --------------------------------------------------------------------------------------------
# the same potential and transmission functions built on a device (CUDA: cupy, complex64)


@dataclass
class DeviceSlices:
    """Transmission functions built on the backend: (n_slices, ny, nx) complex64 ``transmissions``
    there, the slice ``edges_A``, the worst band-limit ``loss`` and the host ``projection`` (one slice
    through the whole thickness plus the species structure factors, for the targets)."""

    transmissions: object
    edges_A: np.ndarray
    loss: float
    projection: SlicedPotential


def _species_factors_on(numbers: np.ndarray, grid: Grid, backend) -> dict:
    """Each species' Kirkland potential coefficient / cell area on the grid, evaluated on the backend
    (float64 there, float32 kept): at 1080^2 the host took ~0.5 s per species."""
    xp = backend.xp
    ky, kx = spatial_frequencies(grid.gpts, grid.sampling)
    q2 = backend.asarray(ky ** 2)[:, None] + backend.asarray(kx ** 2)[None, :]
    factors = {}
    for z in np.unique(numbers):
        a, b, c, d = kirkland.parameters(int(z))
        f = xp.zeros(grid.gpts, dtype=np.float64)
        for i in range(len(a)):
            f += float(a[i]) / (q2 + float(b[i])) + float(c[i]) * xp.exp(-float(d[i]) * q2)
        factors[int(z)] = (f * (FE_TO_POTENTIAL_V_A2 / grid.area)).astype(np.float32)
    return factors


def _slice_coefficients(positions_A: np.ndarray, numbers: np.ndarray, grid: Grid, factors: dict, backend):
    """V_s(k) of one slice's atoms on the backend (complex64, / area) and each species' structure factor."""
    xp = backend.xp
    ly, lx = grid.extent
    v_k = xp.zeros(grid.gpts, dtype=np.complex64)
    sfs = {}
    for z, factor in factors.items():
        mine = numbers == z
        if not mine.any():
            continue
        # the separable structure factor as one complex GEMM on the device (cuBLAS on CUDA)
        sf = plane_wave_rows(positions_A[mine, 1] / ly, grid.gpts[0], backend).T @ \
            plane_wave_rows(positions_A[mine, 0] / lx, grid.gpts[1], backend)
        sfs[z] = sf
        v_k += factor * sf
    return v_k, sfs


def device_transmissions(positions_A: np.ndarray, numbers: np.ndarray, cell_A, grid: Grid,
                         slice_thickness_A: float, sigma: float, mask: np.ndarray, backend) -> DeviceSlices:
    """exp(i sigma V_s) per slice, band-limited by ``mask`` (FFT order), built on ``backend`` in
    complex64/float32: structure factors, potential slices and transmission functions never touch
    the host, one CPU core only sorts atoms into slices. The same physics as
    :func:`build_potential` + :func:`transmission_functions` (complex128 on the host) to float32
    round-off; used where the backend is a GPU, so the CPU path keeps its numbers."""
    xp = backend.xp
    positions_A = np.asarray(positions_A, dtype=float)
    numbers = np.asarray(numbers, dtype=int)
    check_elements(numbers)
    edges = slice_edges_A(float(cell_A[2]), slice_thickness_A)
    slice_of = assign_slices(positions_A[:, 2], edges)
    factors = _species_factors_on(numbers, grid, backend)
    band = backend.asarray(np.asarray(mask, dtype=np.float32))
    n_slices, n = len(edges) - 1, grid.gpts[0] * grid.gpts[1]
    out = xp.empty((n_slices, *grid.gpts), dtype=np.complex64)
    losses = xp.zeros(n_slices, dtype=np.float32)
    projected = xp.zeros(grid.gpts, dtype=np.complex64)
    species_sf = {z: xp.zeros(grid.gpts, dtype=np.complex64) for z in factors}
    for s in range(n_slices):
        here = slice_of == s
        v_k, sfs = _slice_coefficients(positions_A[here], numbers[here], grid, factors, backend)
        projected += v_k
        for z, sf in sfs.items():
            species_sf[z] += sf
        phase = backend.fft.ifft2(v_k).real * np.float32(n * sigma)
        t_k = backend.fft.fft2(xp.exp(phase.astype(np.complex64) * np.complex64(1j)), overwrite_x=True)
        total = (t_k.real ** 2 + t_k.imag ** 2).sum()
        t_k *= band
        losses[s] = 1.0 - (t_k.real ** 2 + t_k.imag ** 2).sum() / total
        out[s] = backend.fft.ifft2(t_k, overwrite_x=True)
    # one transfer home for the losses and the targets' projection, not one per slice
    projection = SlicedPotential(grid=grid, edges_A=np.array([0.0, float(cell_A[2])]),
                                 slices_k=backend.asnumpy(projected).astype(np.complex128)[None],
                                 species_sf={z: backend.asnumpy(sf).astype(np.complex128) for z, sf in species_sf.items()})
    return DeviceSlices(transmissions=out, edges_A=edges, loss=max(0.0, float(backend.asnumpy(losses).max(initial=0.0))),
                        projection=projection)
