"""Chemically plausible element substitutions on a structure template (``generator.substitution: oxidation``).

The rule: pymatgen's most likely oxidation states of the template's formula
(`namsa.prototypes.oxidation_states`) give every distinct element a charge q; its replacement must
take that charge, i.e. q is one of the replacement's common oxidation states
(``Element.common_oxidation_states``; for a mixed-valence q such as Fe 8/3 in Fe3O4, q lies between
two of them; an anion's charge must be the replacement's most negative common state, its own anion
charge: C-4 takes a carbide's carbon site, never a halide's -1 or an oxide's -2), and a metal or
metalloid replaces a metal or metalloid, a non-metal a non-metal (so no Se2+ on calcium's site in
CaO). Since every replacement carries its predecessor's charge on the same sites, the substituted
formula stays charge balanced. Templates without an oxidation-state guess (metals, intermetallics,
borides, covalent networks) are neutral: a metal's site takes a metal, and a non-metal's or
metalloid's site only a non-metal or metalloid of its own group (isovalent: carbon's site in graphite
keeps four bonds, boron's in MgB2 stays boron; no O or F network on a carbon site).

The lattice is scaled so that the template's closest contacts keep their length relative to the
atoms' radii (Shannon radii of the charged ions, Slater atomic radii for q = 0 or where pymatgen has
no Shannon radius), and the result is checked again (`namsa.prototypes.bond_problem`): a recipe whose
bonds come out implausible is not used.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
from pymatgen.core import Element, Species, Structure

from .prototypes import oxidation_states


def template_charges(structure: Structure) -> dict[str, float]:
    """Charge per distinct element of a template (all 0 when pymatgen finds no balanced guess)."""
    states = oxidation_states(structure.composition.reduced_formula)
    return states or {s.symbol: 0.0 for s in structure.composition}


def can_take(candidate: str, old: str, charge: float) -> bool:
    """Whether ``candidate`` can sit on ``old``'s sites carrying ``charge`` (the module's rule)."""
    element = Element(candidate)
    if _metallic(element) != _metallic(Element(old)):   # a metal's site takes a metal, a non-metal's a non-metal
        return False
    if charge == 0:   # no guess: a metal's site takes a metal; a covalent network's atom only its own group
        before = Element(old)
        if before.is_metal:
            return bool(element.is_metal)
        return element.group == before.group and bool(element.is_metalloid) == bool(before.is_metalloid)
    common = [float(q) for q in element.common_oxidation_states]
    if charge < 0:   # an anion takes its own anion charge only: C-4 of a carbide, never C-1 on a halide's site
        return float(charge) == min(common)
    if float(charge).is_integer():
        return float(charge) in common
    return any(0 < lo < charge < hi for lo in common for hi in common)   # mixed valence between two cation states


def _metallic(element: Element) -> bool:
    return bool(element.is_metal or element.is_metalloid)


def draw_elements(charges: dict[str, float], old: Sequence[str], pool: Sequence[str],
                  rng: np.random.Generator) -> list[str] | None:
    """Distinct replacements for ``old`` (in order), each drawn uniformly among the pool elements
    that can take its charge; None when some element has no candidate left."""
    new: list[str] = []
    for symbol in old:
        candidates = [s for s in pool if s not in new and can_take(s, symbol, charges[symbol])]
        if not candidates:
            return None
        new.append(str(candidates[int(rng.integers(len(candidates)))]))
    return new


def is_charge_balanced(structure: Structure, charges: dict[str, float], rename: dict[str, str]) -> bool:
    """True when the substituted structure, each new element carrying its predecessor's charge,
    is neutral and every new element can carry that charge."""
    total = sum(charges[old] * structure.composition[old] for old in rename)
    return abs(total) < 1e-6 and all(can_take(new, old, charges[old]) for old, new in rename.items())


def radius(symbol: str, charge: float) -> float:
    """Shannon radius of the ion (Angstrom), else the Slater atomic radius."""
    if charge != 0 and float(charge).is_integer():
        with warnings.catch_warnings():   # pymatgen warns, then falls back or returns None: both handled here
            warnings.simplefilter("ignore")
            try:
                value = Species(symbol, int(charge)).ionic_radius
            except ValueError:
                value = None
        if value is not None:
            return float(value)
    return float(Element(symbol).atomic_radius or Element(symbol).atomic_radius_calculated)


def lattice_scale(structure: Structure, charges: dict[str, float], rename: dict[str, str]) -> float:
    """Largest (r_a' + r_b') / (r_a + r_b) over the element pairs in contact (within 20% of the
    shortest distance): the scale that keeps the tightest contact as tight relative to the radii."""
    distances = structure.distance_matrix + np.diag(np.full(len(structure), np.inf))
    shortest = float(distances.min())
    symbols = [site.specie.symbol for site in structure]
    pairs = {(symbols[i], symbols[j]) for i, j in zip(*np.nonzero(distances <= 1.2 * shortest))}
    return max((radius(rename[a], charges[a]) + radius(rename[b], charges[b])) /
               (radius(a, charges[a]) + radius(b, charges[b])) for a, b in pairs)
