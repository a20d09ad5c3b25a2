"""Public simulation API: ``simulate_cbed``, ``simulate_sample`` and ``plan_samples``.

``simulate_cbed`` is the low-level call (any orthorhombic supercell, any probe positions, full
patterns on the simulation grid). ``simulate_sample`` turns one (structure, zone axis, variant)
and a :class:`~namsa.config.SimulationConfig` into a validated :class:`~namsa.sample.Sample`:
oriented supercell -> (optional frozen phonon / tilt / defocus draw) -> sliced potential ->
multislice over the scan -> patterns rebinned to P x P around k = 0 -> targets over the scanned
field of view. Conventions: positions are [y, x] in Angstrom, arrays [row = y, col = x], k = 0 at
index N // 2 of every pattern, each pattern normalised so the incident probe carries intensity 1.
"""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from . import __version__
from .backend import Backend, cpu_threads, get_backend, single_threaded_blas
from .config import SimulationConfig
from .constants import interaction_constant, wavelength_A
from .errors import UserError
from .multislice import balanced_batch, cpu_batch_cap, fresnel_propagator, plan_batch, run_multislice
from .optics import band_limit_frequency, band_limit_mask, check_sampling, probe_fourier, scan_positions
from .periodic import PeriodicSimulation, build_periodic, estimated_cost, tile_atoms, tile_grid_for
from .potential import CellError, Grid, SlicedPotential, build_potential, make_grid, transmission_functions
from .sample import Sample, sample_id
from .targets import projected_density_map, projected_potential_map


class ScanError(UserError):
    """Scan positions or field of view that do not fit the cell."""


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
                            "namsa.structures.orient_supercell first")
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
    probe_k: np.ndarray
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

    def run(self, positions_A: np.ndarray, reducer: Callable[[np.ndarray], np.ndarray]) -> list[np.ndarray]:
        """Patterns for every position [y, x] (Angstrom); ``reducer`` maps each FFT-order batch."""
        positions_A = np.asarray(positions_A, float).reshape(-1, 2)
        with single_threaded_blas():
            if self.periodic is not None:
                return self.periodic.run(positions_A, reducer, self.threads, self.batch_size)
            return run_multislice(self.probe_k, positions_A, self.grid.sampling, self.transmissions,
                                  self.propagators, self.final_mask, self.backend, self.batch_size, reducer,
                                  self.threads)


def _choose_periodic(atoms: _Atoms, structure: Any, grid: Grid, probe: np.ndarray, cutoff: float,
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
    direct, periodic = estimated_cost(n_positions, grid, tile_grid, int((np.abs(probe) > 0).sum()))
    if method == "auto" and periodic >= direct:
        return None
    return tile, tile_grid


def prepare_simulation(structure: Any, **kwargs) -> Simulation:
    """Build what all probe positions share (see :func:`_prepare`); BLAS pinned to one thread."""
    with single_threaded_blas():
        return _prepare(structure, **kwargs)


def _prepare(structure: Any, *, energy_kv: float, semiangle_mrad: float,
                       sampling_A: float | None = None, gpts: int | tuple[int, int] | None = None,
                       slice_thickness_A: float = 2.0, aberrations: dict[str, float] | None = None,
                       band_limit: float = 2.0 / 3.0, tilt_mrad: tuple[float, float] = (0.0, 0.0),
                       device: str = "cpu", memory_budget_gb: float = 2.0, workers: int | None = None,
                       n_positions: int = 1, max_batch: int = 64, method: str = "auto",
                       fft: str = "auto") -> Simulation:
    """Build what all probe positions share: probe, and transmission functions + propagators
    (multislice) or the exit waves of every aperture beam (periodic). ``method``: "auto" picks the
    cheaper exact path, "multislice" or "periodic" force one; ``fft`` picks the CPU FFT
    (:func:`namsa.backend.get_backend`)."""
    if method not in ("auto", "multislice", "periodic"):
        raise UserError(f"method must be 'auto', 'multislice' or 'periodic', got {method!r}")
    atoms = _as_atoms(structure)
    grid = make_grid(atoms.cell_A, sampling_A, gpts, getattr(structure, "tiling", None))
    check_sampling(grid.sampling, energy_kv, semiangle_mrad, band_limit)
    ab = {"C1_A": 0.0, "C3_mm": 0.0, **(aberrations or {})}
    unknown = set(ab) - {"C1_A", "C3_mm"}
    if unknown:
        raise UserError(f"unknown aberrations {sorted(unknown)}; supported: C1_A (Angstrom), C3_mm (mm)")
    edges_n = max(1, int(round(atoms.cell_A[2] / slice_thickness_A)))
    threads = workers or (cpu_threads() if device == "cpu" else 1)
    budget = memory_budget_gb * 1e9
    # complex128 slice coefficients are held while building: count them against the budget too
    potential_bytes = edges_n * grid.gpts[0] * grid.gpts[1] * 16
    if device == "cpu":
        max_batch = min(max_batch, cpu_batch_cap(grid.gpts))
    batch = plan_batch(n_positions, grid.gpts, edges_n, budget / threads if threads > 1 else budget,
                       fixed_bytes=potential_bytes / threads, max_batch=max_batch)
    backend = get_backend(device, fft)
    batch = balanced_batch(n_positions, batch, threads)
    probe = probe_fourier(grid.gpts, grid.sampling, energy_kv, semiangle_mrad, ab["C1_A"], ab["C3_mm"], band_limit)
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
                                  np.linspace(0.0, atoms.cell_A[2], edges_n + 1), probe, sigma, lam, cutoff,
                                  tilt_mrad, backend, threads, tile_grid)
        # periodic batches: per probe one float32 pattern plus the reducer's copy (12 bytes/pixel)
        common["batch_size"] = int(max(1, min(256, n_positions, budget / (threads * 12 * grid.gpts[0] * grid.gpts[1]))))
        info.update(method="periodic", tile_gpts=list(tile_grid.gpts), n_beams=periodic.n_beams,
                    transmission_bandlimit_loss=periodic.transmission_loss, batch_size=common["batch_size"])
        return Simulation(**common, method="periodic", transmission_loss=periodic.transmission_loss,
                          periodic=periodic, info=info)
    potential = build_potential(atoms.positions_A, atoms.numbers, atoms.cell_A, grid, slice_thickness_A)
    t, loss = transmission_functions(potential, sigma, band_limit)
    mask = band_limit_mask(grid.gpts, grid.sampling, band_limit)
    cache: dict[float, Any] = {}
    propagators = []
    for dz in potential.slice_thickness_A:
        key = round(float(dz), 9)
        if key not in cache:
            cache[key] = backend.asarray(fresnel_propagator(grid.gpts, grid.sampling, float(dz), lam, mask, tilt_mrad))
        propagators.append(cache[key])
    info.update(method="multislice", transmission_bandlimit_loss=loss)
    # keep only the projection (targets) from here on: the per-slice coefficients are 2x the
    # transmission functions' memory and no longer needed
    projected = SlicedPotential(grid=grid, edges_A=np.array([0.0, float(atoms.cell_A[2])]),
                                slices_k=potential.projected_k()[None], species_sf=potential.species_sf)
    return Simulation(**common, method="multislice", transmission_loss=loss, transmissions=backend.asarray(t),
                      propagators=propagators, final_mask=backend.asarray(mask), info=info, _potential=projected)


def _check_positions(positions_A: np.ndarray, grid: Grid) -> np.ndarray:
    pos = np.asarray(positions_A, dtype=float)
    if pos.ndim != 2 or pos.shape[1] != 2 or len(pos) == 0:
        raise ScanError(f"positions_A must be an (n, 2) array of [y, x] in Angstrom, got shape {pos.shape}")
    ly, lx = grid.extent
    if pos.min() < 0 or (pos[:, 0] > ly).any() or (pos[:, 1] > lx).any():
        raise ScanError(f"probe positions must lie inside the cell (0..{ly:.2f} x 0..{lx:.2f} Angstrom, [y, x]); "
                        "move the scan or use a larger cell")
    return pos


def _oriented(structure: Any, zone_axis: Sequence[int] | None, lateral_A: float | Sequence[float] | None,
              thickness_A: float | None) -> Any:
    """What simulate_cbed simulates: ``structure`` oriented and tiled along ``zone_axis`` (as
    simulate_sample does, default sizes from SimulationConfig), or as given without a zone axis."""
    if zone_axis is None:
        if lateral_A is not None or thickness_A is not None:
            raise UserError("lateral_A and thickness_A size the supercell built along zone_axis; pass "
                            "zone_axis=(u, v, w) too, or leave them out for a ready supercell")
        return structure
    from .structures import orient_supercell

    fields = SimulationConfig.model_fields
    lateral = fields["cell_lateral_A"].default if lateral_A is None else lateral_A
    thickness = fields["thickness_A"].default if thickness_A is None else thickness_A
    return orient_supercell(structure, zone_axis, lateral, thickness)


def simulate_cbed(structure: Any, positions_A: np.ndarray, *, energy_kv: float, semiangle_mrad: float,
                  zone_axis: Sequence[int] | None = None, lateral_A: float | Sequence[float] | None = None,
                  thickness_A: float | None = None,
                  sampling_A: float | None = None, gpts: int | tuple[int, int] | None = None,
                  slice_thickness_A: float = 2.0, aberrations: dict[str, float] | None = None,
                  device: str = "cpu", band_limit: float = 2.0 / 3.0,
                  tilt_mrad: tuple[float, float] = (0.0, 0.0), memory_budget_gb: float = 2.0,
                  workers: int | None = None, max_batch: int = 64, method: str = "auto", fft: str = "auto",
                  return_info: bool = False):
    """CBED intensities for every probe position, on the full simulation grid.

    structure: with ``zone_axis`` = (u, v, w), anything :func:`namsa.load_structure` accepts (a
    pymatgen Structure, ase Atoms, library id or CIF path), oriented and tiled into a supercell of
    at least ``lateral_A`` (x, y) by ``thickness_A`` (Angstrom; defaults those of SimulationConfig)
    as simulate_sample does; without ``zone_axis``, a ready namsa Supercell (from
    orient_supercell) or an orthorhombic ase.Atoms, z along the beam, periodic in x and y.
    positions_A: (n, 2) probe positions [y, x] in Angstrom inside the supercell (its size is in the
    info, ``cell_A`` = (Lx, Ly, Lz)). energy_kv (kV), semiangle_mrad (mrad),
    sampling_A (Angstrom/pixel) or gpts, slice_thickness_A (Angstrom), aberrations
    {"C1_A": Angstrom, "C3_mm": mm}, tilt_mrad (ty, tx). Probes run in batches of at most
    ``max_batch`` per worker thread, fewer when ``memory_budget_gb`` requires. ``method``: "auto"
    (default) uses the exact periodic S-matrix path for perfect tiled crystals when it is cheaper,
    "multislice" / "periodic" force one (see namsa.periodic). ``fft``: the CPU FFT
    (namsa.backend.get_backend; "auto" = pyFFTW with this machine's shared PATIENT wisdom).

    Returns (n, ny, nx) float32 intensities with k = 0 at (ny // 2, nx // 2), each pattern's sum
    being the fraction of the incident probe (total 1) that stays inside the band limit. With
    ``return_info`` also a dict (grid, cell, slices, batch size, intensity kept).
    """
    structure = _oriented(structure, zone_axis, lateral_A, thickness_A)
    sim = prepare_simulation(structure, energy_kv=energy_kv, semiangle_mrad=semiangle_mrad, sampling_A=sampling_A,
                             gpts=gpts, slice_thickness_A=slice_thickness_A, aberrations=aberrations,
                             band_limit=band_limit, tilt_mrad=tilt_mrad, device=device,
                             memory_budget_gb=memory_budget_gb, workers=workers,
                             n_positions=len(np.asarray(positions_A).reshape(-1, 2)), max_batch=max_batch,
                             method=method, fft=fft)
    pos = _check_positions(positions_A, sim.grid)
    parts = sim.run(pos, lambda a: np.fft.fftshift(a, axes=(-2, -1)))
    out = np.concatenate(parts, axis=0)
    if not return_info:
        return out
    kept = out.sum(axis=(-2, -1))
    info = dict(sim.info, cell_A=list(sim.atoms.cell_A), intensity_kept_min=float(kept.min()),
                intensity_kept_mean=float(kept.mean()))
    return out, info


# --------------------------------------------------------------------------------------------
# pattern rebinning


def overlap_matrix(source_edges: np.ndarray, target_edges: np.ndarray) -> np.ndarray:
    """(n_target, n_source) fraction of each source bin that falls in each target bin.

    Intensity-conserving rebinning of a histogram assuming uniform intensity within a source pixel.
    """
    lo = np.maximum(target_edges[:-1, None], source_edges[None, :-1])
    hi = np.minimum(target_edges[1:, None], source_edges[None, 1:])
    width = np.diff(source_edges)[None, :]
    return np.clip(hi - lo, 0.0, None) / width


def pattern_rebinner(grid: Grid, band_limit: float, pattern_px: int) -> tuple[Callable[[np.ndarray], np.ndarray], float]:
    """Reducer mapping (b, ny, nx) FFT-order intensities to (b, P, P) around k = 0 at index P // 2.

    The P x P pattern spans the band-limited disc: pixel size dk = 2 k_max / P (1/Angstrom),
    pixel p covering [(p - P//2 - 1/2) dk, (p - P//2 + 1/2) dk). Returns the reducer and dk.
    """
    k_max = band_limit_frequency(grid.sampling, band_limit)
    dk_out = 2.0 * k_max / pattern_px
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

    def reduce(intensity: np.ndarray) -> np.ndarray:
        return np.matmul(np.matmul(wy, intensity), wx.T)

    return reduce, dk_out


# --------------------------------------------------------------------------------------------
# samples


def _sample_seed(cfg: SimulationConfig, material_id: str, zone_axis: Sequence[int], variant: int) -> int:
    text = f"{cfg.seed}|{material_id}|{'_'.join(str(int(i)) for i in zone_axis)}|{int(variant)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


def _material(structure_or_id: Any) -> tuple[Any, str | None]:
    """(structure, material id or None) for a library id, a CIF path or a structure object."""
    if isinstance(structure_or_id, (str, os.PathLike)):
        from .structures import load_structure

        text = str(structure_or_id)
        material_id = Path(text).stem if (os.sep in text or text.lower().endswith(".cif")) else text
        return load_structure(structure_or_id), material_id
    return structure_or_id, None


def _thickness_A(cfg: SimulationConfig, seed: int) -> float:
    """The requested specimen thickness (Angstrom): ``thickness_A``, or a uniform draw from
    ``variations.thickness_range_A`` on a stream of its own (the other draws stay as they were)."""
    lo_hi = cfg.variations.thickness_range_A
    if lo_hi is None:
        return cfg.thickness_A
    return float(np.random.default_rng([seed, 1]).uniform(*lo_hi))


def _poisson_noise(cbed: np.ndarray, electrons_per_pattern: float, seed: int) -> np.ndarray:
    """Shot noise of a finite dose: each pattern (intensities summing to ~1) becomes Poisson counts
    of ``electrons_per_pattern`` incident electrons, divided by that number again, so noisy and
    noise-free stacks share one intensity scale. Its own random stream (see `_thickness_A`)."""
    rng = np.random.default_rng([seed, 2])
    counts = rng.poisson(np.clip(cbed, 0.0, None).astype(np.float64) * electrons_per_pattern)
    return (counts / electrons_per_pattern).astype(np.float32)


def resolve_fov(cfg: SimulationConfig, cell_A: Sequence[float]) -> tuple[float, float, float, float]:
    """Scanned field of view [y0, x0, height, width] (Angstrom) inside the cell (Lx, Ly, ...)."""
    lx, ly = float(cell_A[0]), float(cell_A[1])
    if cfg.scan_fov_A is not None:
        y0, x0, h, w = (float(v) for v in cfg.scan_fov_A)
        if min(y0, x0) < 0 or h <= 0 or w <= 0 or y0 + h > ly + 1e-6 or x0 + w > lx + 1e-6:
            raise ScanError(f"scan_fov_A={list(cfg.scan_fov_A)} lies outside the {ly:.2f} x {lx:.2f} Angstrom "
                            "supercell ([y0, x0, height, width]); shrink the fov or raise cell_lateral_A")
        return (y0, x0, h, w)
    f = cfg.scan_fov_fraction
    return ((1 - f) * ly / 2, (1 - f) * lx / 2, f * ly, f * lx)


def phonon_configurations(supercell: Any, cfg: SimulationConfig, rng: np.random.Generator, seed: int) -> list:
    """The atomic configurations one sample averages over: ``[supercell]`` without frozen phonons,
    else ``cfg.phonon_configs`` thermal displacements of it (Angstrom RMS per axis from
    ``cfg.variations.thermal_sigma_A``). The first is drawn from the sample's own ``rng``, exactly
    as when each sample was one snapshot (so phonon_configs = 1 keeps those samples and ids); the
    others from generators seeded (seed, k), which leaves ``rng``'s later draws (tilt, defocus)
    independent of how many configurations are averaged."""
    if not cfg.variations.frozen_phonon:
        return [supercell]
    from .kirkland import symbol
    from .structures import thermal_displace

    sigma = cfg.variations.thermal_sigma_A
    if isinstance(sigma, (int, float)):
        sigma = {symbol(int(z)): float(sigma) for z in np.unique(supercell.numbers)}
    first = thermal_displace(supercell, rng, sigma)
    return [first] + [thermal_displace(supercell, np.random.default_rng([seed, k]), sigma)
                      for k in range(1, cfg.phonon_configs)]


def _configuration_mean(configurations: list, cfg: SimulationConfig, positions: np.ndarray,
                        fov: Sequence[float], tilt: tuple[float, float], aberrations: dict[str, float]):
    """Mean (S, P, P) patterns and (T, T) projected potential and density over ``configurations``
    (incoherent frozen-phonon average of intensities), the last Simulation, and the worst
    intensity kept / band-limit loss over all of them. One configuration is returned unchanged."""
    sums: list[np.ndarray] = []
    kept: list[np.ndarray] = []
    loss = 0.0
    for supercell in configurations:
        sim = prepare_simulation(supercell, energy_kv=cfg.energy_kv, semiangle_mrad=cfg.semiangle_mrad,
                                 sampling_A=cfg.sampling_A, gpts=cfg.gpts, slice_thickness_A=cfg.slice_thickness_A,
                                 aberrations=aberrations, band_limit=cfg.band_limit, tilt_mrad=tilt,
                                 device=cfg.device, memory_budget_gb=cfg.memory_budget_gb, workers=cfg.workers,
                                 n_positions=len(positions))
        reducer, dk_out = pattern_rebinner(sim.grid, cfg.band_limit, cfg.pattern_px)

        def reduce_and_count(intensity: np.ndarray) -> np.ndarray:
            kept.append(intensity.sum(axis=(-2, -1)))
            return reducer(intensity)

        # float64 sums: float32 -> float64 -> / 1 -> float32 is exact, so one configuration is unchanged
        parts = (np.concatenate(sim.run(positions, reduce_and_count), axis=0).astype(np.float32),
                 projected_potential_map(sim.potential, fov, cfg.target_px, cfg.band_limit),
                 projected_density_map(sim.potential, fov, cfg.target_px, cfg.band_limit))
        sums = [p.astype(np.float64) + (sums[i] if sums else 0.0) for i, p in enumerate(parts)]
        loss = max(loss, float(sim.transmission_loss))
    cbed, potential, density = ((a / len(configurations)).astype(np.float32) for a in sums)
    stats = {"intensity_kept_min": float(np.concatenate(kept).min()), "transmission_bandlimit_loss": loss,
             "pattern_dk_inv_A": float(dk_out)}
    return cbed, potential, density, sim, stats


def simulate_sample(structure_or_id: Any, zone_axis: Sequence[int], cfg: SimulationConfig,
                    variant: int = 0) -> Sample:
    """Simulate one sample: (S, P, P) CBED stack plus (T, T) projected potential and density.

    structure_or_id: library id, CIF path, pymatgen Structure / ase Atoms (any load_structure input).
    Raises UserError (one line) for bad input. Deterministic for a given (material, axis, variant,
    cfg.physics_hash()).
    """
    from .structures import load_structure, normalize_zone_axis, orient_supercell

    structure, material_id = _material(structure_or_id)
    structure = load_structure(structure)
    material_id = material_id or structure.properties["material_id"]
    axis = list(normalize_zone_axis(zone_axis))
    seed = _sample_seed(cfg, material_id, axis, variant)
    rng = np.random.default_rng(seed)
    supercell = orient_supercell(structure, axis, cfg.cell_lateral_A, _thickness_A(cfg, seed),
                                 material_id=material_id)
    configurations = phonon_configurations(supercell, cfg, rng, seed)
    supercell = configurations[0]
    var = cfg.variations
    tilt = (0.0, 0.0)
    if var.tilt_mrad > 0:
        radius, angle = var.tilt_mrad * math.sqrt(rng.uniform()), rng.uniform(0, 2 * math.pi)
        tilt = (radius * math.sin(angle), radius * math.cos(angle))
    c1 = cfg.aberrations.C1_A + (rng.uniform(*var.defocus_range_A) if var.defocus_range_A[0] != var.defocus_range_A[1]
                                 else 0.0)
    aberrations = {"C1_A": float(c1), "C3_mm": float(cfg.aberrations.C3_mm)}
    cell = tuple(float(c) for c in supercell.cell_A)
    fov = resolve_fov(cfg, cell)
    positions = scan_positions(fov, cfg.scan_shape)
    cbed, potential, density, sim, stats = _configuration_mean(configurations, cfg, positions, fov, tilt, aberrations)
    if var.dose_e_per_A2 is not None:
        cbed = _poisson_noise(cbed, var.dose_e_per_A2 * fov[2] * fov[3] / len(positions), seed)
    config_hash = cfg.physics_hash()
    numbers = np.asarray(supercell.numbers)
    from .kirkland import symbol

    lam = wavelength_A(cfg.energy_kv)
    meta = {
        "sample_id": sample_id(material_id, axis, variant, config_hash),
        "material_id": material_id,
        "formula": structure.composition.reduced_formula,
        "elements": sorted({symbol(int(z)) for z in numbers}),
        "zone_axis": axis,
        "variant": int(variant),
        "thickness_A": float(cell[2]),
        "energy_kv": float(cfg.energy_kv),
        "semiangle_mrad": float(cfg.semiangle_mrad),
        "aberrations": aberrations,
        "sampling_A": [float(s) for s in sim.grid.sampling],
        "scan_shape": [int(s) for s in cfg.scan_shape],
        "scan_positions_A": positions.tolist(),
        "fov_A": [float(v) for v in fov],
        "seed": int(seed),
        "code_version": __version__,
        "config_hash": config_hash,
        # beyond the required keys: what a reader needs to interpret the arrays
        "cell_A": [float(c) for c in cell],
        "gpts": [int(g) for g in sim.grid.gpts],
        "n_slices": int(sim.info["n_slices"]),
        "slice_thickness_A": float(sim.info["slice_thickness_A"]),
        "tilt_mrad": [float(t) for t in tilt],
        "frozen_phonon": bool(var.frozen_phonon),
        "dose_e_per_A2": var.dose_e_per_A2,
        "pattern_dk_inv_A": stats["pattern_dk_inv_A"],
        "pattern_mrad_per_px": stats["pattern_dk_inv_A"] * lam * 1e3,
        "target_sampling_A": [float(fov[2]) / cfg.target_px, float(fov[3]) / cfg.target_px],
        "phonon_configs": len(configurations),
        "intensity_kept_min": stats["intensity_kept_min"],
        "transmission_bandlimit_loss": stats["transmission_bandlimit_loss"],
        "method": sim.method,
        "strain": float(getattr(supercell, "strain", 0.0)),
    }
    return Sample(cbed=cbed, potential=potential, density=density, meta=meta).validate()


# --------------------------------------------------------------------------------------------
# planning


@dataclass(frozen=True)
class SampleSpec:
    """One planned sample: material id, zone axis [u, v, w], variant index."""

    material_id: str
    zone_axis: tuple[int, int, int]
    variant: int

    def sample_id(self, cfg: SimulationConfig) -> str:
        return sample_id(self.material_id, self.zone_axis, self.variant, cfg.physics_hash())


@dataclass
class Plan:
    """Every sample a config asks for, and the structures that could not be planned (with why)."""

    specs: list[SampleSpec] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    #: material id -> what ``simulate_sample`` should load (library id or CIF path)
    sources: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.specs)


def _plan_sources(cfg: SimulationConfig, plan: Plan) -> dict[str, Any]:
    from . import generator, library
    from .structures import load_cif_dir

    structures: dict[str, Any] = {}
    ids = library.list_ids() if cfg.materials == "library" else list(cfg.materials)
    for material_id in ids + generator.generated_ids(cfg.generator):
        try:
            structures[material_id] = (generator.build(material_id) if generator.is_generated_id(material_id)
                                       else library.get(material_id))
            plan.sources[material_id] = material_id
        except library.UnknownStructureIdError:   # advice a config file can follow
            plan.failures.append((material_id, f"unknown structure id {material_id!r}; "
                                               f"{library.suggest_ids(material_id, library.CONFIG_ADVICE)}"))
        except UserError as exc:
            plan.failures.append((material_id, str(exc)))
    if cfg.cif_dir:
        loaded, failures = load_cif_dir(cfg.cif_dir)
        plan.failures.extend(failures)
        for stem, structure in loaded.items():
            structures[stem] = structure
            plan.sources[stem] = str(Path(cfg.cif_dir) / f"{stem}.cif")
    return structures


def plan_samples(cfg: SimulationConfig) -> Plan:
    """Expand the config's dataset plan into SampleSpecs; a bad structure is recorded, never fatal."""
    from .structures import auto_zone_axes, normalize_zone_axis

    plan = Plan()
    variants = cfg.variants if cfg.variations.any else 1
    for material_id, structure in _plan_sources(cfg, plan).items():
        try:
            if cfg.zone_axes == "auto":
                axes = auto_zone_axes(structure, max_axes=cfg.max_zone_axes)
            else:
                axes = [normalize_zone_axis(a) for a in cfg.zone_axes][: cfg.max_zone_axes]
        except UserError as exc:
            plan.failures.append((material_id, str(exc)))
            continue
        except Exception as exc:  # a structure the library cannot orient must not stop the plan
            plan.failures.append((material_id, f"{type(exc).__name__}: {' '.join(str(exc).split())}"))
            continue
        for axis in axes:
            for variant in range(variants):
                plan.specs.append(SampleSpec(material_id, tuple(int(i) for i in axis), variant))
    return plan
