"""Physical constants and relativistic electron-optical quantities.

Units: energies in eV (beam energy in kV where named so), lengths in Angstrom, potentials in
volts, the interaction constant in rad / (V * Angstrom). Constants are CODATA 2018.
"""
from __future__ import annotations

import math

#: electron rest energy m0 c^2 (eV), CODATA 2018
ELECTRON_REST_ENERGY_EV: float = 510_998.950
#: Planck constant times speed of light (eV * Angstrom), CODATA 2018
HC_EV_A: float = 12_398.419843320026
#: Bohr radius (Angstrom), CODATA 2018
BOHR_RADIUS_A: float = 0.529177210903
#: e / (4 pi eps0) (V * Angstrom): the Coulomb potential of one elementary charge at 1 Angstrom
COULOMB_V_A: float = 14.399645478425668
#: 2 pi a0 e/(4 pi eps0) (V * Angstrom^2): maps the electron scattering factor f_e (Angstrom) to the
#: Fourier coefficient of the projected potential (V * Angstrom^3); Kirkland (2010) eq. 5.9.
FE_TO_POTENTIAL_V_A2: float = 2.0 * math.pi * BOHR_RADIUS_A * COULOMB_V_A
#: the lowest electron dose (electrons/Angstrom^2) a model may be trained at or a card may state: below
#: it a pattern holds less than one electron at any probe step up to 1 Angstrom (0.14 at the study's
#: 0.375 A); low-dose 4D-STEM and cryo-ptychography work at tens of e/Angstrom^2. A card's range below it
#: would silence the low-dose check of every scan (models.scan_fit.card_checks)
MIN_DOSE_E_PER_A2: float = 1.0


def wavelength_A(energy_kv: float) -> float:
    """Relativistic electron wavelength (Angstrom) at beam energy ``energy_kv`` (kV).

    lambda = h c / sqrt(E (2 m0 c^2 + E)); 200 kV gives 0.02508 Angstrom (Kirkland 2010, Table 2.2).
    """
    energy_ev = 1e3 * float(energy_kv)
    return HC_EV_A / math.sqrt(energy_ev * (2.0 * ELECTRON_REST_ENERGY_EV + energy_ev))


def mrad_per_inv_A(energy_kv: float) -> float:
    """The scattering angle (mrad) of a spatial frequency of 1 / Angstrom at ``energy_kv`` (kV):
    theta = lambda k (small angles; 20 mrad at 200 kV is 0.80 / Angstrom). The one conversion between a
    detector's angles and its spatial frequencies."""
    return wavelength_A(energy_kv) * 1e3


def interaction_constant(energy_kv: float) -> float:
    """Relativistic interaction constant sigma (rad / (V * Angstrom)) at ``energy_kv`` (kV).

    sigma = 2 pi / (lambda V) * (m0 c^2 + e V) / (2 m0 c^2 + e V)  (Kirkland 2010, eq. 5.6);
    200 kV gives 7.288e-4 rad / (V * Angstrom).
    """
    energy_ev = 1e3 * float(energy_kv)
    ratio = (ELECTRON_REST_ENERGY_EV + energy_ev) / (2.0 * ELECTRON_REST_ENERGY_EV + energy_ev)
    return 2.0 * math.pi / (wavelength_A(energy_kv) * energy_ev) * ratio
