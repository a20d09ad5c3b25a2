"""The Simulation object: what all probe positions of one specimen share (probe, transmission
functions and propagators, or the periodic S-matrix exit waves), built by ``prepare_simulation``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .backend import Backend, cpu_threads, get_backend, single_threaded_blas
from .constants import interaction_constant, wavelength_A
from .errors import UserError
from .multislice import balanced_batch, cpu_batch_cap, fresnel_propagator, plan_batch, run_multislice
from .optics import band_limit_frequency, band_limit_mask, check_sampling, probe_fourier
from .periodic import PeriodicSimulation, build_periodic, estimated_cost, tile_atoms, tile_grid_for
from .potential import (CellError, Grid, SlicedPotential, build_potential, device_transmissions, make_grid,
                        transmission_functions)
from .sample_memory import bytes_per_probe


# --------------------------------------------------------------------------------------------
# structure adapters


@dataclass
class _Atoms:
    positions_A: np.ndarray  # (N, 3) [x, y, z]
    numbers: np.ndarray
    cell_A: tuple[float, float, float]  # (Lx, Ly, Lz)


def _as_atoms(structure: Any) -> _Atoms:
    """Accept a namsa Supercell (positions_A, numbers, cell_A) or an orthorhombic ase.Atoms."""
    if hasattr(structure, "positions_A") and hasattr(structure, "cell_A"):
        return _Atoms(np.asarray(structure.positions_A, float), np.asarray(structure.numbers, int),
                      tuple(float(c) for c in structure.cell_A))
    if hasattr(structure, "get_positions") and hasattr(structure, "cell"):
        cell = np.asarray(structure.cell[:], float)
        if np.abs(cell - np.diag(np.diag(cell))).max() > 1e-6:
            raise CellError("ase.Atoms must have an orthorhombic cell with z along the beam; orient it with "
                            "namsa.supercell.orient_supercell first")
        if (np.diag(cell) <= 0).any():
            raise CellError("ase.Atoms cell must have positive lengths along x, y and z (a right-handed, "
                            "orthorhombic cell with z along the beam)")
        return _Atoms(structure.get_positions(), structure.get_atomic_numbers(), tuple(np.diag(cell)))
    raise CellError(f"cannot simulate a {type(structure).__name__} as it is: pass zone_axis=(u, v, w) (and "
                    "lateral_A, thickness_A) to orient it into a supercell, or a namsa Supercell (from "
                    "orient_supercell) or an orthorhombic ase.Atoms")


# --------------------------------------------------------------------------------------------
# the simulation object: potential, transmission functions and probe, reused across positions


@dataclass
class Simulation:
    """Everything shared by all probe positions of one specimen.

    ``method`` is "multislice" (probe by probe through the supercell's transmission functions) or
    "periodic" (exact plane-wave S-matrix on one tile of a perfect crystal, :mod:`namsa.periodic`).
    ``potential`` (the supercell's sliced potential, used for the targets) is built on first use
    when the periodic path did not need it.
    """

    grid: Grid
    atoms: _Atoms
    slice_thickness_A: float
    energy_kv: float
    semiangle_mrad: float
    band_limit: float
    backend: Backend
    threads: int
    batch_size: int
    probe_k: Any   # (ny, nx) complex128, FFT order, on the backend
    method: str
    transmission_loss: float
    transmissions: Any = None
    propagators: list[Any] | None = None
    final_mask: Any = None
    periodic: PeriodicSimulation | None = None
    info: dict = field(default_factory=dict)
    _potential: SlicedPotential | None = None

    @property
    def potential(self) -> SlicedPotential:
        """The supercell's projected potential (one slice through the whole thickness) and species
        structure factors: all the targets need."""
        if self._potential is None:
            self._potential = build_potential(self.atoms.positions_A, self.atoms.numbers, self.atoms.cell_A,
                                              self.grid, float(self.atoms.cell_A[2]))
        return self._potential

    def run(self, positions_A: np.ndarray, reducer: Callable[[Any], Any],
            device_reducer: bool = False, out: np.ndarray | None = None) -> list[np.ndarray]:
        """Patterns for every position [y, x] (Angstrom); ``reducer`` maps each FFT-order batch of
        intensities: numpy ones, or with ``device_reducer`` the backend's arrays (then the reduction runs
        on the device and only its result comes home, e.g. :func:`namsa.detector.pattern_rebinner`
        given the backend). With ``out`` (numpy, (n, ...) of the reducer's per-probe shape) the batches are
        written into it and the returned list holds views of it."""
        positions_A = np.asarray(positions_A, float).reshape(-1, 2)
        with single_threaded_blas(), self.backend.device_scope():
            if self.periodic is not None:
                return self.periodic.run(positions_A, reducer, self.threads, self.batch_size, device_reducer, out)
            return run_multislice(self.probe_k, positions_A, self.grid.sampling, self.transmissions,
                                  self.propagators, self.final_mask, self.backend, self.batch_size, reducer,
                                  self.threads, device_reducer, out)


def _choose_periodic(atoms: _Atoms, structure: Any, grid: Grid, probe: Any, cutoff: float,
                     n_positions: int, method: str):
    """(tile atoms, tile grid) when the periodic path applies and pays off (or is forced), else None."""
    if method == "multislice":
        return None
    tile = tile_atoms(atoms.positions_A, atoms.numbers, atoms.cell_A, getattr(structure, "tiling", None))
    if tile is None:
        if method == "periodic":
            raise UserError("method='periodic' needs a perfect crystal supercell with its tiling (namsa "
                            "orient_supercell output, no frozen-phonon displacement); use method='auto'")
        return None
    tile_grid = tile_grid_for(atoms.cell_A, structure.tiling, cutoff, grid.gpts)
    direct, periodic = estimated_cost(n_positions, grid, tile_grid, int((abs(probe) > 0).sum()))
    if method == "auto" and periodic >= direct:
        return None
    return tile, tile_grid


def prepare_simulation(structure: Any, **kwargs) -> Simulation:
    """Build what all probe positions share (see :func:`_prepare`); BLAS pinned to one thread, the
    backend's GPU current in this thread for the build (a pool thread starts on device 0)."""
    backend = get_backend(kwargs.get("device", "cpu"), kwargs.get("fft", "auto"))
    with single_threaded_blas(), backend.device_scope():
        return _prepare(structure, **kwargs)


def _prepare(structure: Any, *, energy_kv: float, semiangle_mrad: float,
                       sampling_A: float | None = None, gpts: int | tuple[int, int] | None = None,
                       slice_thickness_A: float = 2.0, aberrations: dict[str, float] | None = None,
                       band_limit: float = 2.0 / 3.0, tilt_mrad: tuple[float, float] = (0.0, 0.0),
                       device: str = "cpu", memory_budget_gb: float = 2.0, workers: int | None = None,
                       n_positions: int = 1, max_batch: int | None = None, method: str = "auto",
                       fft: str = "auto", fft_friendly_grid: bool = False) -> Simulation:
    """Build what all probe positions share: probe, and transmission functions + propagators
    (multislice) or the exit waves of every aperture beam (periodic). ``method``: "auto" picks the
    cheaper exact path, "multislice" or "periodic" force one; ``fft`` picks the CPU FFT
    (:func:`namsa.backend.get_backend`). ``max_batch`` caps the probes per batch (default: the CPU's
    cache-sized cap, on a GPU only its free memory). ``fft_friendly_grid`` makes every grid side a
    2^a 3^b 5^c count (:func:`namsa.potential.make_grid`)."""
    if method not in ("auto", "multislice", "periodic"):
        raise UserError(f"method must be 'auto', 'multislice' or 'periodic', got {method!r}")
    atoms = _as_atoms(structure)
    grid = make_grid(atoms.cell_A, sampling_A, gpts, getattr(structure, "tiling", None), fft_friendly_grid)
    check_sampling(grid.sampling, energy_kv, semiangle_mrad, band_limit)
    ab = {"C1_A": 0.0, "C3_mm": 0.0, **(aberrations or {})}
    unknown = set(ab) - {"C1_A", "C3_mm"}
    if unknown:
        raise UserError(f"unknown aberrations {sorted(unknown)}; supported: C1_A (Angstrom), C3_mm (mm)")
    edges_n = max(1, int(round(atoms.cell_A[2] / slice_thickness_A)))
    threads = workers or (cpu_threads() if device == "cpu" else 1)
    backend = get_backend(device, fft)
    batch = _batch_size(backend, grid, edges_n, n_positions, memory_budget_gb * 1e9, threads, max_batch)
    probe = probe_fourier(grid.gpts, grid.sampling, energy_kv, semiangle_mrad, ab["C1_A"], ab["C3_mm"], band_limit,
                          backend if backend.on_device else None)
    sigma, lam = interaction_constant(energy_kv), wavelength_A(energy_kv)
    cutoff = band_limit_frequency(grid.sampling, band_limit)
    common = dict(grid=grid, atoms=atoms, slice_thickness_A=slice_thickness_A, energy_kv=energy_kv,
                  semiangle_mrad=semiangle_mrad, band_limit=band_limit, backend=backend, threads=threads,
                  batch_size=batch, probe_k=probe)
    info = {"gpts": list(grid.gpts), "sampling_A": list(grid.sampling), "n_slices": edges_n,
            "slice_thickness_A": float(atoms.cell_A[2] / edges_n), "batch_size": batch, "threads": threads,
            "device": backend.name}
    chosen = _choose_periodic(atoms, structure, grid, probe, cutoff, n_positions, method)
    if chosen is not None:
        (tile_pos, tile_num), tile_grid = chosen
        periodic = build_periodic(tile_pos, tile_num, atoms.cell_A, structure.tiling, grid,
                                  np.linspace(0.0, atoms.cell_A[2], edges_n + 1), backend.asnumpy(probe), sigma, lam, cutoff,
                                  tilt_mrad, backend, threads, tile_grid)
        # periodic batches: namsa.sample_memory.PERIODIC_BYTES_PER_PROBE_PIXEL per probe and pixel
        common["batch_size"] = _periodic_batch(backend, grid, n_positions, memory_budget_gb * 1e9, threads)
        info.update(method="periodic", tile_gpts=list(tile_grid.gpts), n_beams=periodic.n_beams,
                    transmission_bandlimit_loss=periodic.transmission_loss, batch_size=common["batch_size"])
        return Simulation(**common, method="periodic", transmission_loss=periodic.transmission_loss,
                          periodic=periodic, info=info)
    mask = band_limit_mask(grid.gpts, grid.sampling, band_limit)
    t, loss, dz_all, projected = _transmissions(atoms, grid, slice_thickness_A, sigma, band_limit, mask, backend)
    cache: dict[float, Any] = {}
    propagators = []
    for dz in dz_all:
        key = round(float(dz), 9)
        if key not in cache:
            cache[key] = backend.asarray(fresnel_propagator(grid.gpts, grid.sampling, float(dz), lam, mask, tilt_mrad))
        propagators.append(cache[key])
    info.update(method="multislice", transmission_bandlimit_loss=loss,
                potential_built_on="device" if backend.on_device else "host")
    return Simulation(**common, method="multislice", transmission_loss=loss, transmissions=t,
                      propagators=propagators, final_mask=backend.asarray(mask), info=info, _potential=projected)


def _transmissions(atoms: _Atoms, grid: Grid, slice_thickness_A: float, sigma: float, band_limit: float,
                   mask: np.ndarray, backend: Backend):
    """(transmission functions on the backend, worst band-limit loss, slice thicknesses, the targets'
    projection). On a GPU all of it is built there in complex64 (:func:`device_transmissions`); on
    CPU in complex128 as always, so CPU samples keep their numbers bit for bit."""
    if backend.on_device:
        built = device_transmissions(atoms.positions_A, atoms.numbers, atoms.cell_A, grid, slice_thickness_A,
                                     sigma, mask, backend)
        return built.transmissions, built.loss, np.diff(built.edges_A), built.projection
    potential = build_potential(atoms.positions_A, atoms.numbers, atoms.cell_A, grid, slice_thickness_A)
    t, loss = transmission_functions(potential, sigma, band_limit)
    # keep only the projection (targets) from here on: the per-slice coefficients are 2x the
    # transmission functions' memory and no longer needed
    projected = SlicedPotential(grid=grid, edges_A=np.array([0.0, float(atoms.cell_A[2])]),
                                slices_k=potential.projected_k()[None], species_sf=potential.species_sf)
    return backend.asarray(t), loss, potential.slice_thickness_A, projected


#: share of a GPU's free memory a simulation may plan for (the rest: cuFFT plans, the pools' slack)
GPU_MEMORY_SHARE = 0.8


def _batch_size(backend: Backend, grid: Grid, n_slices: int, n_positions: int, budget: float, threads: int,
                max_batch: int | None) -> int:
    """Probes per batch of the multislice path: on CPU the cache-sized cap (at most 64), on a GPU as
    many as its free memory (and memory_budget_gb) allows, so small grids are not launch-bound."""
    if backend.on_device:
        budget = min(budget, GPU_MEMORY_SHARE * backend.free_bytes())
        fixed = 8 * grid.gpts[0] * grid.gpts[1] * 8   # complex64 temporaries of building the potential
        cap = n_positions if max_batch is None else max_batch
    else:
        # complex128 slice coefficients are held while building: count them against the budget too
        fixed = n_slices * grid.gpts[0] * grid.gpts[1] * 16
        cap = min(64 if max_batch is None else max_batch, cpu_batch_cap(grid.gpts))
    batch = plan_batch(n_positions, grid.gpts, n_slices, budget / threads if threads > 1 else budget,
                       fixed_bytes=fixed / threads, max_batch=cap)
    return balanced_batch(n_positions, batch, threads)


def _periodic_batch(backend: Backend, grid: Grid, n_positions: int, budget: float, threads: int) -> int:
    """Probes per batch of the periodic path (`namsa.sample_memory.bytes_per_probe` of its path); at
    most 256 on CPU, as the free memory allows on a GPU."""
    per_probe = bytes_per_probe(grid.gpts, "periodic")
    if backend.on_device:
        return int(max(1, min(n_positions, min(budget, GPU_MEMORY_SHARE * backend.free_bytes()) / per_probe)))
    return int(max(1, min(256, n_positions, budget / (threads * per_probe))))
