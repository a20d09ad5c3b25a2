"""Structure templates from the AFLOW Library of Crystallographic Prototypes, each checked before use.

Source: the 288 prototypes pymatgen ships (``pymatgen.analysis.prototypes.AFLOW_PROTOTYPE_LIBRARY``,
a list of ``{"snl": StructureNL, "tags": {"aflow", "mineral", "pearson", "strukturbericht"}}``;
M. J. Mehl et al., Comput. Mater. Sci. 136, S1 (2017)). A template id is its AFLOW label
(``"AB_cF8_225_a_b"``); the 9 labels pymatgen holds twice get ``"~2"`` on the later entry, and
`aflow_label` strips it, so splits by prototype (`namsa.structure_type`) hold both out together.

pymatgen's copy has wrong entries (its anatase has 4-coordinated Ti at 2.05 A, its tenorite Cu-O at
1.67 A), so every entry passes `check_template` before it is used, and `template_report` lists
every entry with its verdict and reason (docs/structures.md prints it). The checks, in order:

1. elements: only the generator's element pool (Li to Bi, no noble gases, Tc or Pm): no H,
   no actinides, no molecular noble-gas crystals;
2. density within `DENSITY_LIMITS_G_CM3` (the lightest and densest solids at room temperature);
3. no clash: every interatomic distance at least `COVALENT_TOLERANCE` x the sum of the two
   atoms' covalent radii (B. Cordero et al., Dalton Trans. 2008, 2832, as pymatgen's
   ``CovalentRadius`` holds them);
4. ionic bonds, for templates with an anion (O, N, F, S, Se, Te, Cl, Br, I) and an
   oxidation-state guess: every metal or metalloid cation's shortest bond to an anion at least `IONIC_TOLERANCE` x
   the sum of their Shannon radii (pymatgen ``Species.ionic_radius``) -- this refuses tenorite;
5. bond valence, for oxides: every metal or metalloid cation's bond-valence sum (pymatgen ``calculate_bv_sum``)
   within `BOND_VALENCE_TOLERANCE` of its guessed oxidation state -- this refuses anatase
   (Ti's four 2.05 A bonds sum to ~2 valence units, not 4).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from pymatgen.core import Composition, Species, Structure

from .element_pool import DEFAULT_ELEMENTS, POOL_IN_WORDS
from .errors import UserError

#: suffix that tells apart two pymatgen entries with the same AFLOW label
DUPLICATE_MARK = "~"
#: shortest allowed distance as a fraction of the covalent-radius sum (a clash below it)
COVALENT_TOLERANCE = 0.80
#: shortest allowed cation-anion bond as a fraction of the Shannon-radius sum
IONIC_TOLERANCE = 0.85
#: largest allowed |bond-valence sum - oxidation state| / oxidation state of an oxide's cation
BOND_VALENCE_TOLERANCE = 0.45
#: plausible densities of a solid at room temperature (g/cm^3): lithium 0.53 to osmium 22.6
DENSITY_LIMITS_G_CM3: tuple[float, float] = (0.5, 23.0)
#: anions of the ionic-bond check
ANIONS: frozenset[str] = frozenset({"O", "N", "F", "S", "Se", "Te", "Cl", "Br", "I"})
#: neighbours searched for a cation's bonds (Angstrom)
BOND_SEARCH_A = 3.5


class UnknownTemplateError(UserError):
    """An AFLOW template id that pymatgen's library does not hold, or one that failed its checks."""


@dataclass(frozen=True)
class TemplateVerdict:
    """One library entry: its id, AFLOW label, mineral name, formula, and why it is refused ('' = accepted)."""

    template_id: str
    aflow: str
    mineral: str
    formula: str
    reason: str

    @property
    def accepted(self) -> bool:
        return not self.reason


@lru_cache(maxsize=1)
def _entries() -> dict[str, tuple[dict, Structure]]:
    """template id -> (tags, structure), in pymatgen's order."""
    from pymatgen.analysis.prototypes import AFLOW_PROTOTYPE_LIBRARY

    entries: dict[str, tuple[dict, Structure]] = {}
    for entry in AFLOW_PROTOTYPE_LIBRARY:
        label = str(entry["tags"]["aflow"])
        template_id, n = label, 1
        while template_id in entries:   # a repeated label: the n-th entry is "<label>~n"
            n += 1
            template_id = f"{label}{DUPLICATE_MARK}{n}"
        entries[template_id] = (dict(entry["tags"]), entry["snl"].structure)
    return entries


def all_ids() -> list[str]:
    """Every template id in pymatgen's AFLOW library, accepted or not (stable order)."""
    return list(_entries())


def is_template_id(template_id: str) -> bool:
    """True when ``template_id`` names an entry of pymatgen's AFLOW library (accepted or not)."""
    return isinstance(template_id, str) and template_id in _entries()


def aflow_label(template_id: str) -> str:
    """The AFLOW prototype label of a template id (the id without its duplicate mark)."""
    return template_id.split(DUPLICATE_MARK, 1)[0]


def template(template_id: str) -> Structure:
    """The structure of an accepted template (a fresh copy, no oxidation states, Angstrom).

    Raises `UnknownTemplateError` (one line) for an unknown or refused id.
    """
    # one entry's verdict, not the whole list: a worker rebuilding one material checks one template
    verdict = _verdict(str(template_id)) if is_template_id(str(template_id)) else None
    if verdict is None:
        raise UnknownTemplateError(f"{template_id!r} is not an AFLOW prototype label pymatgen ships; "
                                   "namsa.prototypes.accepted_ids() lists the usable ones")
    if not verdict.accepted:
        raise UnknownTemplateError(f"AFLOW template {template_id} ({verdict.mineral or verdict.formula}) is refused: "
                                   f"{verdict.reason}; use one of namsa.prototypes.accepted_ids()")
    return _structure(template_id)


def _structure(template_id: str) -> Structure:
    structure = _entries()[template_id][1].copy()
    structure.remove_oxidation_states()
    structure.properties["material_id"] = template_id
    return structure


def accepted_ids() -> list[str]:
    """Template ids that pass every check of `check_template` (stable order)."""
    return [v.template_id for v in _verdicts().values() if v.accepted]


def template_report() -> list[TemplateVerdict]:
    """Every entry of pymatgen's AFLOW library with its verdict (the list docs/structures.md shows)."""
    return list(_verdicts().values())


def _verdicts() -> dict[str, TemplateVerdict]:
    return {template_id: _verdict(template_id) for template_id in _entries()}


def refused_markdown() -> str:
    """The refused entries as a markdown table (docs/structures.md holds this text; a test keeps it current)."""
    rows = [f"| `{v.template_id}` | {v.mineral or ''} | {v.formula} | {v.reason} |"
            for v in template_report() if not v.accepted]
    return "\n".join(["| template | mineral | formula | refused because |", "|---|---|---|---|", *rows])


@lru_cache(maxsize=None)
def _verdict(template_id: str) -> TemplateVerdict:
    tags, structure = _entries()[template_id][0], _structure(template_id)
    return TemplateVerdict(template_id, aflow_label(template_id), str(tags.get("mineral") or ""),
                           structure.composition.reduced_formula, check_template(structure))


def check_template(structure: Structure) -> str:
    """Why ``structure`` is not a usable template (one line), or '' when it passes every check
    of the module docstring."""
    outside = sorted({s.symbol for s in structure.composition} - set(DEFAULT_ELEMENTS))
    if outside:
        return f"holds {', '.join(outside)}, outside the element pool ({POOL_IN_WORDS})"
    lo, hi = DENSITY_LIMITS_G_CM3
    if not lo <= structure.density <= hi:
        return f"density {structure.density:.2f} g/cm^3 is outside the plausible {lo:g}-{hi:g} g/cm^3"
    return bond_problem(structure)


def bond_problem(structure: Structure) -> str:
    """Checks 3-5 of the module docstring (the bonds), '' when they pass: what a substituted,
    rescaled template must still satisfy (`namsa.substitution`)."""
    return clash(structure) or _ionic_problem(structure)


def clash(structure: Structure) -> str:
    """The closest contact shorter than `COVALENT_TOLERANCE` x the covalent-radius sum, or ''."""
    from pymatgen.analysis.molecule_structure_comparator import CovalentRadius

    radii = np.array([CovalentRadius.radius[site.specie.symbol] for site in structure])
    distances = structure.distance_matrix + np.diag(np.full(len(structure), np.inf))
    ratio = distances / (radii[:, None] + radii[None, :])
    i, j = np.unravel_index(np.argmin(ratio), ratio.shape)
    if ratio[i, j] >= COVALENT_TOLERANCE:
        return ""
    a, b = structure[int(i)].specie.symbol, structure[int(j)].specie.symbol
    return (f"{a}-{b} at {distances[i, j]:.2f} A is {ratio[i, j]:.2f} x the covalent-radius sum "
            f"{radii[i] + radii[j]:.2f} A (< {COVALENT_TOLERANCE})")


@lru_cache(maxsize=4096)
def oxidation_states(formula: str) -> dict[str, float] | None:
    """pymatgen's most likely oxidation state per element of ``formula`` (charge balanced), or None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        guesses = Composition(formula).oxi_state_guesses(max_sites=-1)
    return {str(k): float(v) for k, v in guesses[0].items()} if guesses else None


def _ionic_problem(structure: Structure) -> str:
    """Checks 4 and 5 of the module docstring on an ionic template; '' when they pass or do not apply."""
    symbols = {s.symbol for s in structure.composition}
    states = oxidation_states(structure.composition.reduced_formula) if symbols & ANIONS else None
    if not states:
        return ""
    oxide = {s for s in symbols if states[s] < 0} == {"O"}
    for index, site in enumerate(structure):
        symbol = site.specie.symbol
        if states[symbol] <= 0 or not (site.specie.is_metal or site.specie.is_metalloid):
            continue   # anions, and covalent centres (C in carbonate, B in h-BN) that are no Shannon cations
        bonds = [n for n in structure.get_neighbors(site, BOND_SEARCH_A)
                 if n.specie.symbol in ANIONS and states[n.specie.symbol] < 0]
        problem = _short_bond(symbol, states, bonds) or (oxide and _bond_valence(structure, index, states, bonds))
        if problem:
            return problem
    return ""


def _short_bond(symbol: str, states: dict[str, float], bonds: list) -> str:
    for bond in sorted(bonds, key=lambda n: n.nn_distance)[:1]:
        anion = bond.specie.symbol
        radii = _ionic_radius(symbol, states[symbol]) + _ionic_radius(anion, states[anion])
        if radii > 0 and bond.nn_distance < IONIC_TOLERANCE * radii:
            return (f"{symbol}-{anion} at {bond.nn_distance:.2f} A is {bond.nn_distance / radii:.2f} x the Shannon "
                    f"radius sum {radii:.2f} A (< {IONIC_TOLERANCE})")
    return ""


def _ionic_radius(symbol: str, state: float) -> float:
    """Shannon radius of the ion, 0 where pymatgen has none for that state (the check is then skipped)."""
    with warnings.catch_warnings():   # pymatgen warns where it falls back to other data or has none
        warnings.simplefilter("ignore")
        try:
            radius = Species(symbol, state).ionic_radius
        except ValueError:
            return 0.0
    return float(radius) if radius is not None else 0.0


def _bond_valence(structure: Structure, index: int, states: dict[str, float], bonds: list) -> str:
    from pymatgen.analysis.bond_valence import BV_PARAMS, calculate_bv_sum
    from pymatgen.core import Element

    site = structure[index]
    symbol, state = site.specie.symbol, states[site.specie.symbol]
    if Element(symbol) not in BV_PARAMS:   # no bond-valence parameters: the check does not apply
        return ""
    total = float(calculate_bv_sum(site, bonds))
    if abs(total - state) <= BOND_VALENCE_TOLERANCE * state:
        return ""
    return (f"{symbol} bond-valence sum {total:.2f} against its oxidation state +{state:g} "
            f"(off by more than {BOND_VALENCE_TOLERANCE:.0%}; {len([b for b in bonds if b.nn_distance < 2.6])} "
            f"O within 2.6 A)")
