"""Kirkland (2010) 12-parameter electron scattering factors and the quantities derived from them.

The parameter table is data: ``namsa/data/kirkland2010.txt`` (Z = 1..103), cited in its header
(E. J. Kirkland, Advanced Computing in Electron Microscopy, 2nd ed., Springer 2010, Appendix C).

    f_e(q) = sum_i a_i / (q^2 + b_i) + sum_i c_i exp(-d_i q^2)     q in 1/Angstrom, f_e in Angstrom

Derived here:
- the Fourier coefficient of one atom's projected potential, ``2 pi a0 e f_e(q)`` (V * Angstrom^3);
- the X-ray form factor via the Mott-Bethe relation, ``f_x(q) = Z - 2 pi^2 a0 q^2 f_e(q)``
  (electrons), whose q = 0 value is exactly Z;
- the real-space projected potential v_z(r) (V * Angstrom), Kirkland eq. C.20, used by tests.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

import numpy as np
from scipy.special import k0

from .constants import BOHR_RADIUS_A, COULOMB_V_A, FE_TO_POTENTIAL_V_A2
from .errors import UserError

MAX_Z = 103
#: a "light" material has every element at or below this Z (B, C, N, O, F, Mg, Al, Si, ...): the
#: weak-phase regime where iCoM and ptychography are nearly exact; the evaluation's element classes
#: and the loader's light oversampling (``data.light_oversample``) both use it
LIGHT_MAX_Z = 14


@lru_cache(maxsize=1)
def _table() -> tuple[np.ndarray, tuple[str, ...]]:
    """(104, 4, 3) parameters [a, b, c, d] indexed by Z (row 0 unused), and the element symbols."""
    text = resources.files("namsa").joinpath("data/kirkland2010.txt").read_text()
    params = np.zeros((MAX_Z + 1, 4, 3))
    symbols = [""] * (MAX_Z + 1)
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split()
        z = int(fields[0])
        symbols[z] = fields[1]
        params[z] = np.asarray(fields[2:14], dtype=float).reshape(4, 3)
    return params, tuple(symbols)


def parameters(z: int) -> np.ndarray:
    """The (4, 3) array [a, b, c, d] of element ``z``; UserError for an unknown element."""
    z = int(z)
    if not 1 <= z <= MAX_Z:
        raise UserError(f"atomic number {z} has no Kirkland parameters (Z must be 1..{MAX_Z}); "
                        "remove or replace that element in the structure")
    return _table()[0][z]


def symbol(z: int) -> str:
    """Element symbol of atomic number ``z``."""
    parameters(z)
    return _table()[1][int(z)]


def atomic_number(element: str) -> int:
    """Atomic number of the element symbol ``element`` (ase's table, as the evaluation reads it);
    UserError for an unknown symbol."""
    from ase.data import atomic_numbers

    if element not in atomic_numbers or atomic_numbers[element] == 0:   # ase maps "X" (a dummy atom) to 0
        raise UserError(f"{element!r} is not an element symbol (H..Lr)")
    return atomic_numbers[element]


def is_light(elements: list[str] | tuple[str, ...]) -> bool:
    """True when there are elements and every one has Z <= `LIGHT_MAX_Z`."""
    return bool(elements) and max(atomic_number(e) for e in elements) <= LIGHT_MAX_Z


def electron_scattering_factor(z: int, q: np.ndarray) -> np.ndarray:
    """f_e(q) in Angstrom for spatial frequency ``q`` (1/Angstrom, not 4 pi sin(theta)/lambda)."""
    a, b, c, d = parameters(z)
    q2 = np.asarray(q, dtype=float)[..., None] ** 2
    return (a / (q2 + b) + c * np.exp(-d * q2)).sum(-1)


def potential_fourier_coefficient(z: int, q: np.ndarray) -> np.ndarray:
    """Fourier transform of one atom's projected potential at frequency ``q`` (V * Angstrom^3)."""
    return FE_TO_POTENTIAL_V_A2 * electron_scattering_factor(z, q)


def xray_form_factor(z: int, q: np.ndarray) -> np.ndarray:
    """X-ray form factor (electrons) by Mott-Bethe: f_x = Z - 2 pi^2 a0 q^2 f_e(q); f_x(0) = Z."""
    q = np.asarray(q, dtype=float)
    return z - 2.0 * np.pi ** 2 * BOHR_RADIUS_A * q ** 2 * electron_scattering_factor(z, q)


def projected_potential_real(z: int, r_A: np.ndarray) -> np.ndarray:
    """Real-space projected potential v_z(r) (V * Angstrom) of one atom at radius ``r_A``.

    Kirkland (2010) eq. C.20: 4 pi^2 a0 e sum a_i K0(2 pi r sqrt(b_i)) + 2 pi^2 a0 e sum c_i/d_i
    exp(-pi^2 r^2 / d_i). Diverges logarithmically at r = 0 (callers pass r > 0).
    """
    a, b, c, d = parameters(z)
    r = np.asarray(r_A, dtype=float)[..., None]
    a0e = BOHR_RADIUS_A * COULOMB_V_A
    lorentz = 4.0 * np.pi ** 2 * a0e * (a * k0(2.0 * np.pi * r * np.sqrt(b))).sum(-1)
    gauss = 2.0 * np.pi ** 2 * a0e * (c / d * np.exp(-np.pi ** 2 * r ** 2 / d)).sum(-1)
    return lorentz + gauss
