"""The references `models.scan_fit.thickness` matches a scan's PACBED against: for each material of a
set, the radial tail profile of its position-averaged pattern at every depth from 10 to 300 Angstrom,
simulated with a model's own physics (its card's ``expects_input.simulation_config()``).

One multislice pass per material gives every depth: the probe is propagated through namsa's own
transmission functions and propagators (`namsa.scan_simulation.prepare_simulation`, forced onto the
multislice path) and the pattern is recorded, rebinned to the model's detector by namsa's rebinner
(`namsa.detector.pattern_rebinner`), at the first slice boundary at or below each depth. Probes sit on a
grid of at most `POSITION_STEP_A` over one orthorhombic unit cell of the supercell (a PACBED needs the
positions of one period, finely: on GaAs [011] steps of 0.6 and 0.3 Angstrom gave the same tail to
1e-3, while a 1.2-2.5 Angstrom grid over the supercell misread it by up to 2x). Each material carries one
frozen-phonon configuration (namsa.thermal, Debye-Waller displacements, seed `PHONON_SEED`): thermal
diffuse scattering is what grows with thickness, and real specimens always have it.

Built once by ``scripts/build_thickness_reference.py`` (about 5 minutes on 2 busy CPU cores) and stored beside
the model; tests/test_thickness_estimate.py rebuilds one material and compares.

A specimen the microscopist names (`KnownSpecimen`: ``namsa reconstruct --specimen --zone-axis``) gets a
reference of its own, the same series for that one material and axis, simulated when the scan is
reconstructed (5-10 s on a CPU core): matching a PACBED against its own material's series is the
classical PACBED thickness measurement (J. M. LeBeau et al., Ultramicroscopy 110 (2010) 118), free of the
doubt between a thin heavy and a thick light crystal.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import scipy.fft

from namsa.constants import mrad_per_inv_A

from .thickness import RADII_MRAD, REFERENCE_VERSION, ThicknessReference, tail_profile

#: the depths (Angstrom) recorded: the shipped models' 10-150 and as far again beyond
DEPTHS_A = np.arange(10.0, 301.0, 10.0)
#: the largest probe step (Angstrom) over the unit cell (see the module docstring)
POSITION_STEP_A = 0.6
#: the frozen-phonon configuration's seed
PHONON_SEED = 0
#: the reference set: library structures of the training families from light to heavy, each on its first
#: automatic zone axis (`namsa.zone_axes.auto_zone_axes`). NiO and cuprite (Cu2O) are left out on purpose:
#: the validation (docs) measures the estimate on materials the set does not hold
MATERIALS = ("C-diamond", "BN-hexagonal", "LiF-rocksalt", "MgO-rocksalt", "Al2O3-corundum", "SiC-zincblende",
             "AlN-wurtzite", "Si-diamond", "MgAl2O4-spinel", "TiO2-rutile", "NaCl-rocksalt", "CaF2-fluorite",
             "ZnO-wurtzite", "GaAs-zincblende", "SrTiO3-perovskite", "Fe2O3-corundum", "Cu-fcc", "MoS2-2H",
             "CdTe-zincblende", "BaZrO3-perovskite", "CeO2-fluorite", "PbTe-rocksalt",
             "W-bcc", "Pt-fcc", "Au-fcc")


def first_axis(material: str) -> tuple[int, int, int]:
    """The material's first automatic zone axis (the one namsa's plans give it first)."""
    from namsa.structure_io import load_structure
    from namsa.zone_axes import auto_zone_axes

    return tuple(int(v) for v in auto_zone_axes(load_structure(material), 1)[0])


def depth_series(material: str, axis: Sequence[int], cfg: Any, depths_A: np.ndarray = DEPTHS_A,
                 step_A: float = POSITION_STEP_A, phonon_seed: int | None = PHONON_SEED
                 ) -> tuple[np.ndarray, np.ndarray, float]:
    """((D,) depths reached (Angstrom), (D, P, P) PACBEDs there, detector pixel 1/Angstrom) of ``material``
    down ``axis`` with the `namsa.SimulationConfig` ``cfg``'s beam, grid and detector (C1 = 0, no tilt)."""
    from namsa.detector import pattern_rebinner
    from namsa.optics import shift_phases
    from namsa.scan_simulation import prepare_simulation
    from namsa.supercell import orient_supercell
    from namsa.thermal import thermal_displace

    cell = orient_supercell(material, axis, cfg.cell_lateral_A, float(depths_A[-1]))
    if phonon_seed is not None:
        cell = thermal_displace(cell, np.random.default_rng(phonon_seed))
    sim = prepare_simulation(cell, energy_kv=cfg.energy_kv, semiangle_mrad=cfg.semiangle_mrad,
                             sampling_A=cfg.sampling_A, gpts=cfg.gpts, slice_thickness_A=cfg.slice_thickness_A,
                             band_limit=cfg.band_limit, method="multislice", workers=1)
    rebin, dk = pattern_rebinner(sim.grid, cfg.band_limit, cfg.pattern_px)
    positions = _unit_cell_grid(cell.unit_A, step_A)
    phase_y, phase_x = shift_phases(positions, sim.grid.gpts, sim.grid.sampling, np.complex64)
    psi = scipy.fft.ifft2(np.asarray(sim.probe_k, np.complex64)[None] * phase_y[:, :, None] * phase_x[:, None, :])
    transmissions = np.asarray(sim.transmissions, np.complex64)
    dz, pixels = float(cell.cell_A[2]) / len(transmissions), psi.shape[1] * psi.shape[2]
    reached, patterns = [], []
    for s in range(len(transmissions)):
        psi *= transmissions[s]
        wave_k = scipy.fft.fft2(psi)
        if len(reached) < len(depths_A) and (s + 1) * dz >= depths_A[len(reached)] - 1e-6:
            intensity = (np.abs(wave_k * sim.final_mask) ** 2 / pixels).astype(np.float32)
            patterns.append(rebin(intensity).mean(axis=0))
            reached.append((s + 1) * dz)
        wave_k *= np.asarray(sim.propagators[s], np.complex64)
        psi = scipy.fft.ifft2(wave_k)
    return np.array(reached), np.array(patterns, np.float64), float(dk)


def _unit_cell_grid(unit_A: Sequence[float], step_A: float) -> np.ndarray:
    """(n, 2) probe positions [y, x] (Angstrom): cell-centred grid of at most ``step_A`` over one unit cell."""
    ux, uy = float(unit_A[0]), float(unit_A[1])
    ny, nx = int(np.ceil(uy / step_A)), int(np.ceil(ux / step_A))
    yy, xx = np.meshgrid((np.arange(ny) + 0.5) / ny * uy, (np.arange(nx) + 0.5) / nx * ux, indexing="ij")
    return np.stack([yy.ravel(), xx.ravel()], axis=1)


def material_profiles(material: str, cfg: Any, axis: Sequence[int] | None = None,
                      depths_A: np.ndarray = DEPTHS_A) -> np.ndarray:
    """(D, R) `tail_profile` of ``material`` at ``depths_A`` (its first zone axis unless ``axis``)."""
    _, patterns, dk = depth_series(material, axis or first_axis(material), cfg, depths_A)
    return np.array([tail_profile(p, dk * mrad_per_inv_A(cfg.energy_kv)) for p in patterns])


@dataclass(frozen=True)
class KnownSpecimen:
    """What the microscopist knows of the specimen: ``material`` (a library id, a generated material id or a
    CIF file: `namsa.load_structure`) viewed down ``zone_axis`` [u, v, w] (direct-lattice indices)."""

    material: str
    zone_axis: tuple[int, int, int]

    @classmethod
    def checked(cls, material: str, zone_axis: Sequence[int]) -> "KnownSpecimen":
        """The specimen, its structure loaded and its axis checked now (before a scan is read); a one-line
        `namsa.errors.UserError` naming the flag otherwise."""
        from namsa.errors import UserError
        from namsa.structure_io import load_structure
        from namsa.supercell import ZoneAxisError, normalize_zone_axis

        try:
            axis = normalize_zone_axis(zone_axis)
        except ZoneAxisError:   # its own line offers 'auto', which a scan's axis cannot be
            raise UserError(f"--zone-axis {','.join(map(str, zone_axis))}: give three integers u,v,w, not all 0, the "
                            "direct-lattice direction the crystal was tilted to, e.g. 0,1,1") from None
        try:
            load_structure(material)
        except UserError as exc:
            raise UserError(f"--specimen {material}: {exc}") from None
        return cls(str(material), axis)

    @property
    def name(self) -> str:
        """"material [uvw]", as findings name it."""
        return f"{self.material} [{''.join(str(v) for v in self.zone_axis)}]"

    def reference(self, cfg: Any, depths_A: np.ndarray = DEPTHS_A) -> ThicknessReference:
        """This specimen's own series (a one-material `ThicknessReference`) with the physics of ``cfg``."""
        profiles = material_profiles(self.material, cfg, self.zone_axis, depths_A)
        return ThicknessReference([self.name], np.asarray(depths_A, np.float64), profiles[None], _physics(cfg))


def build_reference(cfg: Any, materials: Sequence[str] = MATERIALS, depths_A: np.ndarray = DEPTHS_A,
                    progress: Any = None) -> ThicknessReference:
    """The reference of ``materials`` at ``depths_A`` with the physics of ``cfg`` (a `namsa.SimulationConfig`,
    e.g. a card's ``expects_input.simulation_config()``); ``progress(name)`` is called after each."""
    names, profiles = [], []
    for material in materials:
        axis = first_axis(material)
        profiles.append(material_profiles(material, cfg, axis, depths_A))
        names.append(f"{material}|{''.join(str(v) for v in axis)}")
        if progress is not None:
            progress(names[-1])
    return ThicknessReference(names, np.asarray(depths_A, np.float64), np.array(profiles), _physics(cfg))


def _physics(cfg: Any) -> dict[str, Any]:
    """The simulation fields a reference records (`ThicknessReference.physics`)."""
    physics = {name: getattr(cfg, name) for name in ("energy_kv", "semiangle_mrad", "sampling_A", "band_limit",
                                                     "pattern_px", "cell_lateral_A", "slice_thickness_A")}
    physics.update(position_step_A=POSITION_STEP_A, phonon_seed=PHONON_SEED)
    return physics


def save_reference(reference: ThicknessReference, path: str | Path) -> None:
    """Write ``reference`` as safetensors (float32 profiles, JSON metadata), what `load_reference` reads."""
    from safetensors.numpy import save_file

    meta = {"names": json.dumps(reference.names), "physics": json.dumps(reference.physics),
            "radii_mrad": json.dumps([float(r) for r in RADII_MRAD]), "version": str(REFERENCE_VERSION)}
    save_file({"depths_A": np.asarray(reference.depths_A, np.float32),
               "profiles": np.asarray(reference.profiles, np.float32)}, str(path), metadata=meta)
