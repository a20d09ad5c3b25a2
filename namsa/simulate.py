"""Public simulation API: ``simulate_cbed`` and ``simulate_sample`` (planning: :mod:`namsa.plan`).

``simulate_cbed`` is the low-level call (any orthorhombic supercell, any probe positions, full
patterns on the simulation grid). ``simulate_sample`` turns one (structure, zone axis, variant)
and a :class:`~namsa.config.SimulationConfig` into a validated :class:`~namsa.sample.Sample`:
oriented supercell -> (optional frozen phonon / tilt / defocus draw) -> sliced potential ->
multislice over the scan -> patterns rebinned to P x P around k = 0 -> targets over the scanned
field of view. Conventions: positions are [y, x] in Angstrom, arrays [row = y, col = x], k = 0 at
index N // 2 of every pattern, each pattern normalised so the incident probe carries intensity 1.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .version import __version__
from .backend import single_threaded_blas
from .config import SimulationConfig
from .constants import wavelength_A
from .detector import pattern_rebinner, poisson_noise
from .errors import UserError
from .optics import scan_positions
from .potential import Grid
from .material_id import sample_id
from .sample import Sample, SampleMeta
from .scan_simulation import prepare_simulation
from .targets import projected_density_map, projected_potential_map, target_fwhm_A
from .variations import (phonon_configurations, sample_seed, specimen_thickness_A, tilt_and_aberrations,
                         uses_frozen_phonon)


class ScanError(UserError):
    """Scan positions or field of view that do not fit the cell."""


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
    from .supercell import orient_supercell

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
# samples


def _material(structure_or_id: Any) -> tuple[Any, str | None]:
    """(structure, material id or None) for a library id, a CIF path or a structure object."""
    if isinstance(structure_or_id, (str, os.PathLike)):
        from .structure_io import load_structure

        text = str(structure_or_id)
        material_id = Path(text).stem if (os.sep in text or text.lower().endswith(".cif")) else text
        return load_structure(structure_or_id), material_id
    return structure_or_id, None


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

@dataclass
class PreparedConfiguration:
    """One phonon configuration ready for the device: its Simulation, the rebinner, the targets (a
    Future while another thread computes them, else the (potential, density) maps) and the sample's
    output stack (pre-faulted on a GPU, so the host copies batches into mapped memory)."""

    sim: Any
    reducer: Any
    dk_out: float
    fwhm: float
    maps: Any
    cbed: np.ndarray


def prepare_configuration(supercell: Any, cfg: SimulationConfig, positions: np.ndarray, fov: Sequence[float],
                          tilt: tuple[float, float], aberrations: dict[str, float],
                          targets_pool: Any = None) -> PreparedConfiguration:
    """Everything of one configuration but the probes' run: Simulation (on a GPU its potential and
    transmissions are built there), rebinner, targets (submitted to ``targets_pool`` when given, so
    they overlap the run) and the output stack."""
    sim = prepare_simulation(supercell, energy_kv=cfg.energy_kv, semiangle_mrad=cfg.semiangle_mrad,
                             sampling_A=cfg.sampling_A, gpts=cfg.gpts, slice_thickness_A=cfg.slice_thickness_A,
                             aberrations=aberrations, band_limit=cfg.band_limit, tilt_mrad=tilt,
                             device=cfg.device, memory_budget_gb=cfg.memory_budget_gb, workers=cfg.workers,
                             n_positions=len(positions), fft_friendly_grid=cfg.fft_friendly_grid)
    # rebinning and the kept-sum run where the intensities are (the GPU on CUDA): only the
    # (b, P, P) patterns and b sums come home; made on the backend's GPU, whichever thread prepares
    with sim.backend.device_scope():
        reducer, dk_out = pattern_rebinner(sim.grid, cfg.band_limit, cfg.pattern_px, sim.backend)
    fwhm = target_fwhm_A(sim.grid, fov, cfg.target_px, cfg.energy_kv, cfg.semiangle_mrad)
    backend = sim.backend if sim.backend.on_device else None   # the CPU keeps its host targets bit for bit

    def targets():
        return (projected_potential_map(sim.potential, fov, cfg.target_px, fwhm, backend),
                projected_density_map(sim.potential, fov, cfg.target_px, fwhm, backend))

    cbed = np.empty((len(positions), cfg.pattern_px, cfg.pattern_px), np.float32)
    if sim.backend.on_device:
        cbed.fill(0.0)   # first touches of a 1 GiB stack cost ~0.3 s: paid here, off the device's path
    maps = targets_pool.submit(targets) if targets_pool is not None else targets()
    return PreparedConfiguration(sim, reducer, float(dk_out), fwhm, maps, cbed)


def _run_configuration(prep: PreparedConfiguration, positions: np.ndarray, kept: list) -> tuple:
    """(patterns, potential, density) of one prepared configuration; the kept sums appended to ``kept``."""
    sim = prep.sim

    def reduce_and_count(intensity):
        kept.append(sim.backend.asnumpy(intensity.sum(axis=(-2, -1))))
        return prep.reducer(intensity)

    sim.run(positions, reduce_and_count, device_reducer=True, out=prep.cbed)   # batches written in place
    maps = prep.maps.result() if isinstance(prep.maps, Future) else prep.maps
    return (prep.cbed, *maps)


def _configuration_mean(prepared: PreparedSample, cfg: SimulationConfig, pool: Any = None):
    """Mean (S, P, P) patterns and (T, T) projected potential and density over the sample's
    configurations (incoherent frozen-phonon average of intensities), the last Simulation, and the
    worst intensity kept / band-limit loss over all of them. One configuration is returned unchanged.
    With ``pool`` configuration c + 1 is prepared there while c runs."""
    sums: list[np.ndarray] = []
    kept: list[np.ndarray] = []
    loss = 0.0
    configurations = prepared.configurations
    prep = prepared.first
    for c in range(len(configurations)):
        following = None
        if c + 1 < len(configurations):
            args = (configurations[c + 1], cfg, prepared.positions, prepared.fov, prepared.tilt, prepared.aberrations)
            following = pool.submit(prepare_configuration, *args) if pool is not None else None
        parts = _run_configuration(prep, prepared.positions, kept)
        sums = parts if len(configurations) == 1 else \
            [p.astype(np.float64) + (sums[i] if sums else 0.0) for i, p in enumerate(parts)]
        loss = max(loss, float(prep.sim.transmission_loss))
        last = prep
        if c + 1 < len(configurations):
            prep = following.result() if following is not None else prepare_configuration(*args)
    if len(configurations) == 1:
        # equal to the float64 round trip below bit for bit (x -> float64, + 0.0, / 1 -> float32 is exact
        # but turns -0 into +0, as x + 0 does), without four passes over a 1 GiB paper-size stack: the
        # patterns are sums of products of non-negative numbers, never -0, so they need no pass at all
        cbed = sums[0]
        potential, density = (np.add(a, a.dtype.type(0), out=a).astype(np.float32, copy=False) for a in sums[1:])
    else:
        cbed, potential, density = ((a / len(configurations)).astype(np.float32) for a in sums)
    stats = {"intensity_kept_min": float(np.concatenate(kept).min()), "transmission_bandlimit_loss": loss,
             "pattern_dk_inv_A": last.dk_out, "target_fwhm_A": last.fwhm}
    return cbed, potential, density, last.sim, stats


@dataclass
class PreparedSample:
    """The host phase of one sample (:func:`prepare_sample`): all :func:`run_prepared` needs."""

    structure: Any
    material_id: str
    axis: list[int]
    variant: int
    seed: int
    configurations: list
    tilt: tuple[float, float]
    aberrations: dict[str, float]
    fov: tuple[float, float, float, float]
    positions: np.ndarray
    first: PreparedConfiguration


def prepare_sample(structure_or_id: Any, zone_axis: Sequence[int], cfg: SimulationConfig, variant: int = 0,
                   targets_pool: Any = None) -> PreparedSample:
    """Host phase of :func:`simulate_sample`: structure, orientation, supercell, phonon
    configurations, variations, scan positions and the first configuration prepared
    (:func:`prepare_configuration`; its targets go to ``targets_pool`` when given)."""
    from .structure_io import load_structure
    from .supercell import normalize_zone_axis, orient_supercell

    structure, material_id = _material(structure_or_id)
    structure = load_structure(structure)
    material_id = material_id or structure.properties["material_id"]
    axis = list(normalize_zone_axis(zone_axis))
    seed = sample_seed(cfg, material_id, axis, variant)
    rng = np.random.default_rng(seed)
    supercell = orient_supercell(structure, axis, cfg.cell_lateral_A, specimen_thickness_A(cfg, seed),
                                 material_id=material_id)
    configurations = phonon_configurations(supercell, cfg, rng, seed)
    tilt, aberrations = tilt_and_aberrations(cfg, rng)
    fov = resolve_fov(cfg, tuple(float(c) for c in configurations[0].cell_A))
    positions = scan_positions(fov, cfg.scan_shape)
    first = prepare_configuration(configurations[0], cfg, positions, fov, tilt, aberrations, targets_pool)
    return PreparedSample(structure, material_id, axis, int(variant), seed, configurations, tilt, aberrations,
                          fov, positions, first)


def simulate_sample(structure_or_id: Any, zone_axis: Sequence[int], cfg: SimulationConfig,
                    variant: int = 0) -> Sample:
    """Simulate one sample: (S, P, P) CBED stack plus (T, T) projected potential and density.

    structure_or_id: library id, CIF path, pymatgen Structure / ase Atoms (any load_structure input).
    Raises UserError (one line) for bad input. Deterministic for a given (material, axis, variant,
    cfg.physics_hash()).
    """
    if not cfg.device.startswith("cuda"):
        return run_prepared(prepare_sample(structure_or_id, zone_axis, cfg, variant), cfg)
    # on a GPU the host computes the targets (and the next configuration) while the device runs the
    # probes; BLAS held on one thread over both threads' work, as in namsa.pipelined
    with single_threaded_blas(), ThreadPoolExecutor(max_workers=1) as pool:
        return run_prepared(prepare_sample(structure_or_id, zone_axis, cfg, variant, targets_pool=pool), cfg, pool)


def run_prepared(prepared: PreparedSample, cfg: SimulationConfig, pool: Any = None) -> Sample:
    """Device phase of :func:`simulate_sample`: the probes of every configuration run, averaged,
    noised and wrapped in a validated Sample. With ``pool`` the next configuration is prepared there."""
    structure, material_id, axis, variant, seed = (prepared.structure, prepared.material_id, prepared.axis,
                                                   prepared.variant, prepared.seed)
    configurations, tilt, aberrations = prepared.configurations, prepared.tilt, prepared.aberrations
    fov, positions, supercell = prepared.fov, prepared.positions, prepared.configurations[0]
    var = cfg.variations
    cell = tuple(float(c) for c in supercell.cell_A)
    cbed, potential, density, sim, stats = _configuration_mean(prepared, cfg, pool)
    if var.dose_e_per_A2 is not None:
        cbed = poisson_noise(cbed, var.dose_e_per_A2 * fov[2] * fov[3] / len(positions), seed)
    config_hash = cfg.physics_hash()
    numbers = np.asarray(supercell.numbers)
    from .kirkland import symbol
    from .structure_type import cheap_label, remember

    lam = wavelength_A(cfg.energy_kv)
    prototype = cheap_label(material_id)
    if prototype is None:  # a CIF: matched only if a split by structure type asks (namsa.structure_type)
        remember(material_id, structure)
    meta = SampleMeta(
        sample_id=sample_id(material_id, axis, variant, config_hash),
        material_id=material_id,
        formula=structure.composition.reduced_formula,
        # its structure type, for splits that hold out whole prototypes (stage.splits.split_key); None
        # for a CIF, whose AFLOW label is matched when a split asks for it
        prototype=prototype,
        elements=tuple(sorted({symbol(int(z)) for z in numbers})),
        zone_axis=tuple(axis),
        variant=int(variant),
        thickness_A=float(cell[2]),
        energy_kv=float(cfg.energy_kv),
        semiangle_mrad=float(cfg.semiangle_mrad),
        aberrations=aberrations,
        sampling_A=tuple(float(s) for s in sim.grid.sampling),
        scan_shape=tuple(int(s) for s in cfg.scan_shape),
        scan_positions_A=tuple(tuple(p) for p in positions.tolist()),
        fov_A=tuple(float(v) for v in fov),
        seed=int(seed),
        code_version=__version__,
        config_hash=config_hash,
        # beyond the required fields: what a reader needs to interpret the arrays
        cell_A=tuple(float(c) for c in cell),
        gpts=tuple(int(g) for g in sim.grid.gpts),
        n_slices=int(sim.info["n_slices"]),
        slice_thickness_A=float(sim.info["slice_thickness_A"]),
        tilt_mrad=tuple(float(t) for t in tilt),
        frozen_phonon=uses_frozen_phonon(cfg, seed),
        dose_e_per_A2=var.dose_e_per_A2,
        pattern_dk_inv_A=stats["pattern_dk_inv_A"],
        pattern_mrad_per_px=stats["pattern_dk_inv_A"] * lam * 1e3,
        target_sampling_A=(float(fov[2]) / cfg.target_px, float(fov[3]) / cfg.target_px),
        # the targets' resolution: FWHM of the Gaussian they are convolved with (namsa.targets)
        target_fwhm_A=stats["target_fwhm_A"],
        phonon_configs=len(configurations),
        intensity_kept_min=stats["intensity_kept_min"],
        transmission_bandlimit_loss=stats["transmission_bandlimit_loss"],
        method=sim.method,
        strain=float(getattr(supercell, "strain", 0.0)),
    )
    return Sample(cbed=cbed, potential=potential, density=density, meta=meta).validate()
