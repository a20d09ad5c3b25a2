"""Material families: what kind of compound a structure is (oxide, nitride, carbonate, ...) and whether
it is layered, so a generator can weight its templates towards what microscopists image and a plan can
say what it holds.

The chemical family comes from pymatgen's most likely oxidation-state guess of the formula
(`namsa.prototypes.oxidation_states`), first rule that holds:

=============  ==================================================================================
carbonate      C carries a positive charge and O a negative one (CaCO3, Li2CO3)
silicate       Si positive, O negative (Mg2SiO4, MgSiO3; silica SiO2 too: a Si-O framework)
oxide          O negative
nitride        N negative
carbide        C negative
boride         B with other elements and no anion (pymatgen has no negative B state: MgB2, AlB2)
halide         F, Cl, Br or I negative
chalcogenide   S, Se or Te negative
intermetallic  two or more elements, every one a metal or metalloid, none an anion (GaAs is other)
element        one element
other          anything else (phosphides, covalent non-metal compounds)
=============  ==================================================================================

Layered (a tag beside the family): the bonded network is two-dimensional, i.e. van der Waals layers
(graphite, h-BN, MoS2, CdI2, Bi2Te3), by Larsen's method (P. M. Larsen et al., Phys. Rev. Materials 3,
034003 (2019), pymatgen ``get_dimensionality_larsen``) with a bond between atoms closer than
`LAYER_BOND_TOLERANCE` x the sum of their covalent radii (Cordero et al. 2008, pymatgen
``CovalentRadius``). Ionic layered oxides with 3-D bonding (LiCoO2) are not layered by this rule.
"""
from __future__ import annotations

import warnings
from typing import Literal

from pymatgen.core import Element, Structure

from .prototypes import oxidation_states

#: the chemical families, in the order their rules are tried
ChemicalFamily = Literal["carbonate", "silicate", "oxide", "nitride", "carbide", "boride", "halide",
                         "chalcogenide", "intermetallic", "element", "other"]
#: a family a generator may weight: a chemical family or the layered tag
Family = Literal[ChemicalFamily, "layered"]
LAYERED: Family = "layered"
#: atoms closer than this x their covalent-radius sum are bonded (the layered test): wide enough for
#: ionic bonds (Na-Cl 2.82 A against 1.25 x 2.68 A), short of van der Waals gaps (graphite 3.35 A)
LAYER_BOND_TOLERANCE = 1.25

_HALOGENS = frozenset({"F", "Cl", "Br", "I"})
_CHALCOGENS = frozenset({"S", "Se", "Te"})


def chemical_family(structure: Structure) -> ChemicalFamily:
    """The chemical family of ``structure`` by the rules of the module docstring."""
    elements = [e.symbol for e in structure.composition]
    # only a non-metal or metalloid can be an anion: an alloy of metals needs no guess (seconds on a large one)
    anion_possible = any(not Element(e).is_metal for e in elements)
    states = (oxidation_states(structure.composition.reduced_formula) if anion_possible else None) or {}
    negative = {e for e, q in states.items() if q < 0}
    positive = {e for e, q in states.items() if q > 0}
    if "O" in negative and "C" in positive:
        return "carbonate"
    if "O" in negative and "Si" in positive:
        return "silicate"
    for anion, family in (("O", "oxide"), ("N", "nitride"), ("C", "carbide")):
        if anion in negative:
            return family
    if "B" in elements and len(elements) > 1 and not negative:
        return "boride"
    if negative & _HALOGENS:
        return "halide"
    if negative & _CHALCOGENS:
        return "chalcogenide"
    if len(elements) == 1:
        return "element"
    if not negative and all(Element(e).is_metal or Element(e).is_metalloid for e in elements):
        return "intermetallic"
    return "other"


def is_layered(structure: Structure) -> bool:
    """True when the bonded network of ``structure`` is two-dimensional (van der Waals layers)."""
    from pymatgen.analysis.dimensionality import get_dimensionality_larsen
    from pymatgen.analysis.graphs import StructureGraph
    from pymatgen.analysis.local_env import CutOffDictNN
    from pymatgen.analysis.molecule_structure_comparator import CovalentRadius

    symbols = sorted({e.symbol for e in structure.composition})
    cutoffs = {(a, b): LAYER_BOND_TOLERANCE * (CovalentRadius.radius[a] + CovalentRadius.radius[b])
               for a in symbols for b in symbols}
    with warnings.catch_warnings():   # pymatgen warns about its graph library's optional parts
        warnings.simplefilter("ignore")
        graph = StructureGraph.from_local_env_strategy(structure, CutOffDictNN(cut_off_dict=cutoffs))
        return int(get_dimensionality_larsen(graph)) == 2


def families(structure: Structure) -> frozenset[str]:
    """The chemical family of ``structure``, with ``"layered"`` beside it when it is layered."""
    return frozenset({chemical_family(structure), *([LAYERED] if is_layered(structure) else [])})
