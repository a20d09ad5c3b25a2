"""Exact fast path for perfect crystals: plane-wave (S-matrix) multislice on one tile.

A supercell that tiles an orthogonal unit cell (ax, by) tx x ty times has transmission functions
with the tile's periodicity. Multislice is linear in the incident wave, and the probe is a sum of
the grid's plane waves k_b inside the aperture, so

    Psi_p(k) = sum_b Psi0(k_b) exp(-2 pi i k_b . r_p) S_b(k),

where S_b is the exit wave for a unit plane wave k_b. A plane wave k_b = k0 + G_b (k0 one of the
tx * ty "Bloch classes" of the supercell grid, G_b a reciprocal-tile vector) stays in its class:
it is exp(2 pi i k0 . r) times a tile-periodic function, so it propagates on the small tile grid
with the class's propagator P(k0 + G). Each beam therefore costs a multislice on a grid tx * ty
times smaller, and every probe position is then a small matrix product per class. For the
benchmark case (Si [110], 6 x 4 tiles, ~1000 beams) this does ~25x less FFT work than running the
probes one by one, with the same grid frequencies, band limit, slices and probe; the only
difference is that exp(i sigma V) is sampled on the tile grid (its aliasing beyond the band limit
differs at the 1e-4 level, checked in tests/test_multislice.py).

Used automatically when the supercell carries ``tiling``/``unit_A`` and its atoms really are an
exact tiling (not after frozen-phonon displacements), and when it is cheaper than probe-by-probe
multislice. Units: Angstrom, 1/Angstrom; arrays [row = y, col = x]; FFT order.
"""
from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.fft

from .backend import Backend
from .optics import in_band
from .potential import (Grid, SlicedPotential, build_potential, device_transmissions, fast_fft_length,
                        fourier_series_to_real)


def tile_atoms(positions_A: np.ndarray, numbers: np.ndarray, cell_A, tiling,
               tolerance_A: float = 1e-4) -> tuple[np.ndarray, np.ndarray] | None:
    """Atoms of one (ax, by) tile if the supercell is an exact tx x ty tiling of it, else None.

    Every atom is assigned to a tile (an atom within round-off of a tile edge goes to the next
    tile, consistently) and moved into tile (0, 0); the supercell is an exact tiling when these
    reduced atoms coincide, element by element and within ``tolerance_A``, with the atoms that
    were in tile (0, 0) to begin with.
    """
    from scipy.spatial import cKDTree

    if tiling is None:
        return None
    tx, ty = int(tiling[0]), int(tiling[1])
    n = len(numbers)
    if tx * ty <= 1 or n % (tx * ty):
        return None
    ax, by = cell_A[0] / tx, cell_A[1] / ty
    ix = np.floor(positions_A[:, 0] / ax + 1e-7)
    iy = np.floor(positions_A[:, 1] / by + 1e-7)
    reduced = np.column_stack([positions_A[:, 0] - ix * ax, positions_A[:, 1] - iy * by, positions_A[:, 2]])
    home = (np.mod(ix, tx) == 0) & (np.mod(iy, ty) == 0)
    if home.sum() * tx * ty != n:
        return None
    tree = cKDTree(reduced[home])
    distance, nearest = tree.query(reduced, distance_upper_bound=tolerance_A)
    if not np.isfinite(distance).all() or (numbers[home][np.minimum(nearest, home.sum() - 1)] != numbers).any():
        return None
    if np.bincount(nearest, minlength=home.sum()).max() != tx * ty:
        return None
    return reduced[home], numbers[home]


def _signed(n: int) -> np.ndarray:
    """Signed integer frequencies of an n-point FFT (FFT order)."""
    return np.fft.fftfreq(n, 1.0 / n).round().astype(int)


@dataclass
class _BlochClass:
    beam_k: np.ndarray        # (B, 2) [ky, kx] of the class's beams (1/Angstrom)
    beam_amp: np.ndarray      # (B,) probe amplitude Psi0(k_b)
    exit: Any                 # (B, n_in) complex64 exit waves S_b at the in-band frequencies (/ M)
    target: Any               # (n_in,) flat supercell-grid index of each in-band frequency (on device)


@dataclass
class PeriodicSimulation:
    """Exit waves of every aperture beam, computed once; patterns for any probe position."""

    gpts: tuple[int, int]
    classes: list[_BlochClass]
    backend: Backend
    tile_gpts: tuple[int, int]
    n_beams: int
    transmission_loss: float
    _stack: "_StackedClasses | None" = None   # the classes padded for batched GEMMs (GPU), made on first use

    def run(self, positions_A: np.ndarray, reducer, threads: int = 1, batch: int = 128,
            device_reducer: bool = False, out: np.ndarray | None = None) -> list:
        """Reducer outputs for batches of probe positions [y, x] (Angstrom), in order (see
        :func:`namsa.multislice.run_multislice` for ``device_reducer`` and ``out``)."""
        starts = range(0, len(positions_A), batch)

        def one(start: int):
            rows = None if out is None else out[start:start + batch]
            return self.backend.reduce(self.intensities(positions_A[start:start + batch]), reducer, device_reducer, rows)

        if threads > 1 and self.backend.xp is np and len(starts) > 1:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                return list(pool.map(one, starts))
        return [one(s) for s in starts]

    def intensities(self, positions_A: np.ndarray) -> np.ndarray:
        """(b, ny, nx) float32 intensities in FFT order, on the backend, for probe positions [y, x] (Angstrom)."""
        xp = self.backend.xp
        pos = np.asarray(positions_A, float).reshape(-1, 2)
        n_pixels = self.gpts[0] * self.gpts[1]
        if self.backend.on_device:
            return self._stacked().intensities(pos, self.backend).reshape(len(pos), *self.gpts)
        out = xp.zeros((len(pos), n_pixels), dtype=np.float32)
        for cls in self.classes:
            phase = np.exp(-2j * np.pi * (pos @ cls.beam_k.T)) * cls.beam_amp[None, :]
            waves = self.backend.asarray(phase.astype(np.complex64)) @ cls.exit
            out[:, cls.target] = (waves.real ** 2 + waves.imag ** 2) * np.float32(1.0 / n_pixels)
        return out.reshape(len(pos), *self.gpts)

    def _stacked(self) -> "_StackedClasses":
        if self._stack is None:
            self._stack = _StackedClasses.of(self.classes, self.gpts[0] * self.gpts[1], self.backend)
        return self._stack


@dataclass
class _StackedClasses:
    """The Bloch classes padded to one shape, so that a batch of probes costs one batched GEMM and one
    scatter on a GPU instead of a few calls per class. Padding beams have amplitude 0 and padding
    frequencies scatter into a spare column past the last pixel, which is dropped."""

    beam_k: Any           # (C, 2, B) float64 on the device: each class's beam frequencies [ky; kx]
    beam_amp: Any         # (C, 1, B) complex128 on the device
    exit: Any             # (C, B, N) complex64 on the device
    target: Any           # (C * N,) flat pixel index (n_pixels for padding) on the device
    n_pixels: int

    @classmethod
    def of(cls, classes: list[_BlochClass], n_pixels: int, backend: Backend) -> "_StackedClasses":
        xp = backend.xp
        n_cls = len(classes)
        beams = max(len(c.beam_k) for c in classes)
        width = max(int(c.exit.shape[1]) for c in classes)
        beam_k = np.zeros((n_cls, beams, 2))
        beam_amp = np.zeros((n_cls, beams), dtype=np.complex128)
        exit_waves = xp.zeros((n_cls, beams, width), dtype=np.complex64)
        target = np.full((n_cls, width), n_pixels, dtype=np.int64)
        for i, c in enumerate(classes):
            b, w = len(c.beam_k), int(c.exit.shape[1])
            beam_k[i, :b], beam_amp[i, :b] = c.beam_k, c.beam_amp
            exit_waves[i, :b, :w] = c.exit
            target[i, :w] = backend.asnumpy(c.target)
        return cls(backend.asarray(beam_k.transpose(0, 2, 1).copy()), backend.asarray(beam_amp[:, None, :]),
                   exit_waves, backend.asarray(target.reshape(-1)), n_pixels)

    def intensities(self, pos: np.ndarray, backend: Backend) -> Any:
        """(b, n_pixels) float32 intensities on the device for probe positions ``pos`` (b, 2) [y, x]."""
        xp = backend.xp
        # the probes' beam phases (C, b, B) are made on the device: made on the host (an einsum and a complex128
        # exp, then a transfer) they were the largest host step of a study sample, 20-70 ms on the thread
        # driving the GPU (benchmarks/bench_simulate.py --study-host)
        arg = backend.asarray(np.ascontiguousarray(pos, dtype=np.float64))[None] @ self.beam_k   # (C, b, B)
        phase = xp.exp(arg * (-2j * np.pi)) * self.beam_amp
        waves = phase.astype(np.complex64) @ self.exit                             # (C, b, N)
        power = (waves.real ** 2 + waves.imag ** 2) * np.float32(1.0 / self.n_pixels)
        out = xp.zeros((len(pos), self.n_pixels + 1), dtype=np.float32)
        out[:, self.target] = xp.ascontiguousarray(power.transpose(1, 0, 2)).reshape(len(pos), -1)
        return out[:, : self.n_pixels]


def tile_grid_for(cell_A, tiling, cutoff: float, gpts: tuple[int, int] | None = None) -> Grid:
    """Grid for one tile.

    When the supercell grid ``gpts`` divides into the tiling, the tile grid is exactly that grid
    cut into tiles: same pixels, same wrap-around, so the periodic path reproduces probe-by-probe
    multislice to float32 round-off. Otherwise the tile grid's Nyquist frequency is made >= 1.5 x
    the band limit (plus one class offset), so products of band-limited waves and transmission
    functions cannot alias into the band.
    """
    tx, ty = int(tiling[0]), int(tiling[1])
    ax, by = cell_A[0] / tx, cell_A[1] / ty
    if gpts is not None and gpts[0] % ty == 0 and gpts[1] % tx == 0:
        my, mx = gpts[0] // ty, gpts[1] // tx
        return Grid(gpts=(my, mx), sampling=(by / my, ax / mx))
    need = 1.5 * cutoff + 1.0 / min(cell_A[0], cell_A[1])
    my = fast_fft_length(int(math.ceil(2 * by * need)) + 1)
    mx = fast_fft_length(int(math.ceil(2 * ax * need)) + 1)
    return Grid(gpts=(my, mx), sampling=(by / my, ax / mx))


def estimated_cost(n_positions: int, grid: Grid, tile: Grid, n_beams: int) -> tuple[float, float]:
    """Rough FFT work (pixel * log pixel units) of probe-by-probe vs beam-by-beam multislice,
    plus the per-probe matrix product of the periodic path."""
    n, m = grid.gpts[0] * grid.gpts[1], tile.gpts[0] * tile.gpts[1]
    direct = n_positions * n * math.log2(n)
    periodic = n_beams * m * math.log2(m) + n_positions * n * 0.35 * n_beams / max(1, n / m) / 8
    return direct, periodic


def build_periodic(tile_positions: np.ndarray, tile_numbers: np.ndarray, cell_A, tiling, grid: Grid,
                   edges_A: np.ndarray, probe_k: np.ndarray, sigma: float, wavelength: float, cutoff: float,
                   tilt_mrad: tuple[float, float], backend: Backend, threads: int, tile: Grid) -> PeriodicSimulation:
    """Propagate every aperture beam through the tile's slices (see module docstring). On CPU the
    Bloch classes run one by one on ``threads`` threads; on a GPU they run together, one batch per
    slice (4 device calls a slice instead of 4 per class and slice: at the study's size a class is
    microseconds of GPU work, so launches, not arithmetic, would bound it)."""
    slice_dz = float(edges_A[1] - edges_A[0]) if len(edges_A) > 1 else float(edges_A[-1])
    t_tile, loss, dz = _tile_transmissions_on(backend, tile_positions, tile_numbers,
                                              (tile.extent[1], tile.extent[0], cell_A[2]), tile, slice_dz, sigma, cutoff)
    beams = np.argwhere(np.abs(probe_k) > 0)
    setups = _class_setups(beams, probe_k, tiling, grid, tile, cutoff, wavelength, tilt_mrad, dz)
    if backend.on_device:
        done = _run_classes_batched(setups, t_tile, dz, backend, tile)
    else:
        local = threading.local()
        max_beams = max(len(c.beam_k) for c in setups)

        def run_one(setup: _ClassSetup) -> _BlochClass:
            if not hasattr(local, "ws"):
                local.ws = backend.workspace((max_beams, *tile.gpts))
            return _run_class(setup, local.ws, t_tile, dz, backend, tile)

        if threads > 1:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                done = list(pool.map(run_one, setups))
        else:
            done = [run_one(c) for c in setups]
    return PeriodicSimulation(gpts=grid.gpts, classes=done, backend=backend, tile_gpts=tile.gpts,
                              n_beams=len(beams), transmission_loss=loss)


@dataclass
class _ClassSetup:
    """Host-side description of one Bloch class: its beams, in-band tile frequencies and propagators."""

    beam_k: np.ndarray                  # (B, 2) [ky, kx] of the class's beams (1/Angstrom)
    beam_amp: np.ndarray                # (B,) probe amplitude Psi0(k_b)
    start: tuple[np.ndarray, np.ndarray]  # (sy, sx) tile-grid Fourier pixel of each beam's unit plane wave
    props: dict[float, np.ndarray]      # slice thickness -> (my, mx) complex64 propagator (/ M)
    flat_in: np.ndarray                 # flat tile-grid index of each in-band frequency
    target: np.ndarray                  # flat supercell-grid index of each in-band frequency


def _class_setups(beams: np.ndarray, probe_k: np.ndarray, tiling, grid: Grid, tile: Grid, cutoff: float,
                  wavelength: float, tilt_mrad: tuple[float, float], dz: np.ndarray) -> list[_ClassSetup]:
    """The Bloch classes of the aperture's beams, in a fixed (sorted) order."""
    tx, ty = int(tiling[0]), int(tiling[1])
    ny, nx = grid.gpts
    my_int, mx_int = _signed(ny), _signed(nx)
    ly, lx = grid.extent
    classes: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for iy, ix in beams:
        classes.setdefault((my_int[iy] % ty, mx_int[ix] % tx), []).append((iy, ix))
    gy_tile, gx_tile = _signed(tile.gpts[0]), _signed(tile.gpts[1])
    ty_, tx_ = (math.tan(t * 1e-3) for t in tilt_mrad)
    m_pixels = tile.gpts[0] * tile.gpts[1]
    setups = []
    for (cy, cx), members in sorted(classes.items()):
        # absolute frequencies of this class on the tile grid: k = (c + t g) / L
        ky = (cy + ty * gy_tile) / ly
        kx = (cx + tx * gx_tile) / lx
        k2 = ky[:, None] ** 2 + kx[None, :] ** 2
        inside = in_band(k2, cutoff)
        props = {}
        for d in np.unique(np.round(dz, 9)):
            phase = np.exp(-1j * np.pi * wavelength * d * k2 + 2j * np.pi * d * (ky[:, None] * ty_ + kx[None, :] * tx_))
            props[float(d)] = (phase * inside / m_pixels).astype(np.complex64)
        sy = np.array([(my_int[iy] - cy) // ty for iy, _ in members]) % tile.gpts[0]
        sx = np.array([(mx_int[ix] - cx) // tx for _, ix in members]) % tile.gpts[1]
        flat_in = np.flatnonzero(inside)
        gy_in, gx_in = np.unravel_index(flat_in, tile.gpts)
        target = ((cy + ty * gy_tile[gy_in]) % ny) * nx + (cx + tx * gx_tile[gx_in]) % nx
        setups.append(_ClassSetup(beam_k=np.array([[my_int[iy] / ly, mx_int[ix] / lx] for iy, ix in members]),
                                  beam_amp=np.array([probe_k[iy, ix] for iy, ix in members]), start=(sy, sx),
                                  props=props, flat_in=flat_in, target=target))
    return setups


def _propagate(psi: Any, ws: Any, t_tile: Any, props: dict[float, Any], dz: np.ndarray, xp: Any) -> Any:
    """Unit plane waves (Fourier space, last two axes the tile grid; any leading batch axes) through
    every slice; returns the exit waves in Fourier space (unnormalised FFTs: the 1/M is in ``props``)."""
    psi = ws.backward(psi)
    for s in range(len(dz)):
        xp.multiply(psi, t_tile[s], out=psi)
        psi = ws.forward(psi)
        if s == len(dz) - 1:
            break
        xp.multiply(psi, props[float(np.round(dz[s], 9))], out=psi)
        psi = ws.backward(psi)
    return psi


def _run_class(setup: _ClassSetup, ws: Any, t_tile: Any, dz: np.ndarray, backend: Backend, tile: Grid) -> _BlochClass:
    """One Bloch class on the host (the CPU path)."""
    xp, m_pixels, n = backend.xp, tile.gpts[0] * tile.gpts[1], len(setup.beam_k)
    psi = ws.buffer
    psi[...] = 0
    psi[np.arange(n), setup.start[0], setup.start[1]] = 1.0
    psi = _propagate(psi, ws, t_tile, setup.props, dz, xp)
    exit_waves = psi[:n].reshape(n, -1)[:, setup.flat_in] / np.float32(m_pixels)
    return _BlochClass(beam_k=setup.beam_k, beam_amp=setup.beam_amp, target=setup.target,
                       exit=xp.ascontiguousarray(exit_waves.astype(np.complex64)))


def _run_classes_batched(setups: list[_ClassSetup], t_tile: Any, dz: np.ndarray, backend: Backend,
                         tile: Grid) -> list[_BlochClass]:
    """Every Bloch class at once on the device: a (classes, beams, my, mx) batch, each class padded to
    the largest class's beam count (the padding rows stay zero), one multiply and one FFT per step."""
    xp, m_pixels = backend.xp, tile.gpts[0] * tile.gpts[1]
    n_cls, max_beams = len(setups), max(len(c.beam_k) for c in setups)
    ws = backend.workspace((n_cls * max_beams, *tile.gpts))
    psi = ws.buffer.reshape(n_cls, max_beams, *tile.gpts)
    cls_index = np.concatenate([np.full(len(c.beam_k), i) for i, c in enumerate(setups)])
    row_index = np.concatenate([np.arange(len(c.beam_k)) for c in setups])
    sy, sx = (np.concatenate([c.start[k] for c in setups]) for k in (0, 1))
    psi[tuple(backend.asarray(a) for a in (cls_index, row_index, sy, sx))] = 1.0
    props = {d: backend.asarray(np.stack([c.props[d] for c in setups])[:, None]) for d in setups[0].props}
    psi = _propagate(psi, ws, t_tile, props, dz, xp).reshape(n_cls, max_beams, m_pixels)
    done = []
    for i, c in enumerate(setups):   # once per class, not per slice
        exit_waves = psi[i, :len(c.beam_k)][:, backend.asarray(c.flat_in)] / np.float32(m_pixels)
        done.append(_BlochClass(beam_k=c.beam_k, beam_amp=c.beam_amp, target=backend.asarray(c.target),
                                exit=xp.ascontiguousarray(exit_waves.astype(np.complex64))))
    return done


def _tile_transmissions_on(backend: Backend, positions_A: np.ndarray, numbers: np.ndarray, tile_cell_A, tile: Grid,
                           slice_dz: float, sigma: float, cutoff: float) -> tuple[Any, float, np.ndarray]:
    """(transmission functions on the backend, worst band-limit loss, slice thicknesses) of the tile:
    built on a GPU in complex64 (:func:`namsa.potential.device_transmissions`), on CPU in complex128."""
    if backend.on_device:
        ky, kx = (np.fft.fftfreq(n, d) for n, d in zip(tile.gpts, tile.sampling))
        mask = in_band(ky[:, None] ** 2 + kx[None, :] ** 2, cutoff)
        built = device_transmissions(positions_A, numbers, tile_cell_A, tile, slice_dz, sigma, mask, backend)
        return built.transmissions, built.loss, np.diff(built.edges_A)
    tile_pot = build_potential(positions_A, numbers, tile_cell_A, tile, slice_dz)
    t_host, loss = _tile_transmissions(tile_pot, sigma, cutoff)
    return backend.asarray(t_host), loss, np.diff(tile_pot.edges_A)


def _tile_transmissions(potential: SlicedPotential, sigma: float, cutoff: float) -> tuple[np.ndarray, float]:
    """exp(i sigma V_s) on the tile grid, band-limited at the absolute frequency ``cutoff``, and the
    largest fraction of |t|^2 the band limit removed from any slice."""
    ky, kx = (np.fft.fftfreq(n, d) for n, d in zip(potential.grid.gpts, potential.grid.sampling))
    mask = in_band(ky[:, None] ** 2 + kx[None, :] ** 2, cutoff)
    out = np.empty((potential.n_slices, *potential.grid.gpts), dtype=np.complex64)
    worst = 0.0
    for s in range(potential.n_slices):
        t_k = scipy.fft.fft2(np.exp(1j * sigma * fourier_series_to_real(potential.slices_k[s])))
        total = float((np.abs(t_k) ** 2).sum())
        t_k *= mask
        worst = max(worst, 1.0 - float((np.abs(t_k) ** 2).sum()) / total)
        out[s] = scipy.fft.ifft2(t_k)
    return out, worst
