"""The element pool: the elements a generated material may hold and a template may be built of.

Li (Z=3) to Bi (Z=83), without the noble gases and the radioactive elements Tc and Pm (no stable
isotope; nobody images their crystals routinely). One owner for the generator's substitutions
(namsa.generator) and the template checks (namsa.prototypes).

The light pool is the pool's elements with Z <= `namsa.kirkland.LIGHT_MAX_Z` (Li, Be, B, C, N, O, F,
Na, Mg, Al, Si): what ``generator.light_fraction`` draws from. Hydrogen is not in it, as it is not in
the pool (namsa.prototypes' first check refuses the H-bearing templates).
"""
from __future__ import annotations

from pymatgen.core import Element

from .kirkland import LIGHT_MAX_Z

_LEFT_OUT = frozenset({"Ne", "Ar", "Kr", "Xe", "Tc", "Pm"})

#: the pool, in order of atomic number
DEFAULT_ELEMENTS: tuple[str, ...] = tuple(
    Element.from_Z(z).symbol for z in range(3, 84) if Element.from_Z(z).symbol not in _LEFT_OUT)

#: the pool in words, for messages
POOL_IN_WORDS = "Li to Bi, no noble gases, Tc or Pm"

#: the light pool: every element of `DEFAULT_ELEMENTS` with Z <= LIGHT_MAX_Z, in order of atomic number
LIGHT_ELEMENTS: tuple[str, ...] = tuple(s for s in DEFAULT_ELEMENTS if Element(s).Z <= LIGHT_MAX_Z)
