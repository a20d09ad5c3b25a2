"""Frozen-phonon thermal displacements: per-element Debye-Waller RMS displacements and one
displaced configuration of a supercell (the model: docs/structures.md)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
from pymatgen.core import Element

from .errors import UserError
from .supercell import Supercell, wrap_positions


#: Isotropic Debye-Waller factors B (A^2) near 300 K, rounded to two figures, after
#: L.-M. Peng, G. Ren, S. L. Dudarev and M. J. Whelan, Acta Cryst. A52, 456-470 (1996)
#: (elemental crystals) and H. X. Gao and L.-M. Peng, Acta Cryst. A55, 926-932 (1999).
#: Values for light elements in compounds (O, N, F, S, ...) are typical of oxides/nitrides.
DEBYE_WALLER_B_300K: dict[str, float] = {
    "Li": 2.7, "Be": 0.40, "B": 0.35, "C": 0.15, "N": 0.40, "O": 0.50, "F": 0.80, "Na": 1.8,
    "Mg": 1.6, "Al": 0.86, "Si": 0.46, "P": 0.45, "S": 0.60, "Cl": 1.3, "K": 1.9, "Ca": 0.70,
    "Ti": 0.60, "V": 0.49, "Cr": 0.25, "Mn": 0.40, "Fe": 0.35, "Co": 0.34, "Ni": 0.38, "Cu": 0.55,
    "Zn": 1.0, "Ga": 0.70, "Ge": 0.57, "As": 0.60, "Se": 0.80, "Sr": 0.80, "Zr": 0.45, "Nb": 0.45,
    "Mo": 0.20, "Ru": 0.30, "Pd": 0.47, "Ag": 0.66, "Cd": 1.2, "In": 1.0, "Sn": 0.80, "Sb": 1.0,
    "Te": 1.0, "Ba": 0.70, "Ce": 0.40, "Ta": 0.24, "W": 0.16, "Pt": 0.32, "Au": 0.62, "Pb": 2.0,
    "Bi": 1.3, "Th": 0.40, "U": 0.40,
}
#: B (A^2) for elements not in the table: a mid-range value for room-temperature solids.
DEFAULT_B_A2 = 0.5


def debye_waller_sigma_A(symbol: str) -> float:
    """RMS displacement per axis (Angstrom) at ~300 K: sigma = sqrt(B / (8 pi^2))."""
    b = DEBYE_WALLER_B_300K.get(symbol, DEFAULT_B_A2)
    return math.sqrt(b / (8.0 * math.pi ** 2))


def thermal_displace(supercell: Supercell, rng: np.random.Generator,
                     sigma_A: dict[str, float] | None = None) -> Supercell:
    """One frozen-phonon configuration of ``supercell``.

    Each atom moves by independent Gaussian displacements along x, y and z with per-element RMS
    ``sigma_A[symbol]`` (Angstrom, per axis); elements missing from ``sigma_A`` use the
    Debye-Waller default :func:`debye_waller_sigma_A`. x and y are wrapped into the periodic
    box; z is clipped into [0, Lz) so every atom stays inside the slab. Returns a new Supercell.
    """
    if not isinstance(rng, np.random.Generator):
        raise UserError(f"rng must be a numpy.random.Generator (got {type(rng).__name__}); "
                        "use numpy.random.default_rng(seed)")
    sigma_of_z = _sigma_per_element(supercell, sigma_A or {})
    sigma = sigma_of_z[supercell.numbers]
    moved = supercell.positions_A + rng.standard_normal(supercell.positions_A.shape) * sigma[:, None]
    lx, ly, lz = supercell.cell_A
    moved[:, :2] = wrap_positions(moved[:, :2], (lx, ly))
    moved[:, 2] = np.clip(moved[:, 2], 0.0, np.nextafter(lz, 0.0))
    return dataclasses.replace(supercell, positions_A=moved)


def _sigma_per_element(supercell: Supercell, overrides: dict[str, float]) -> np.ndarray:
    for symbol, value in overrides.items():
        if not Element.is_valid_symbol(symbol):
            raise UserError(f"sigma_A key {symbol!r} is not an element symbol; use e.g. {{'Si': 0.076}}")
        if not (math.isfinite(float(value)) and float(value) >= 0):
            raise UserError(f"sigma_A[{symbol!r}]={value!r} must be a non-negative RMS displacement in Angstrom")
    table = np.zeros(int(supercell.numbers.max()) + 1)
    for z in np.unique(supercell.numbers):
        symbol = Element.from_Z(int(z)).symbol
        table[z] = float(overrides[symbol]) if symbol in overrides else debye_waller_sigma_A(symbol)
    return table
