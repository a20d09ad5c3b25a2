"""Generated crystal structures: library prototypes x element substitutions x lattice-constant jitter.

The built-in library (`namsa.library`, 82 structures) is far too small to teach a reconstructor
that generalises to unseen materials. This module derives as many new materials as a study needs
from it: take a library structure as a *template* (its space group and Wyckoff sites), replace each
of its distinct elements by another element, scale the lattice so that the closest contacts keep
their distance relative to the sum of the atoms' radii, and jitter that lattice constant by a few
percent.

Templates may also be the checked AFLOW prototypes of `namsa.prototypes` (``sources: [library,
aflow]``; ids ``"AB_cF8_225_a_b:Sr,S:1.2699"``), and ``substitution: oxidation`` replaces the
any-element draw by `namsa.substitution`'s charge-preserving rule with the bonds re-checked.
``light_fraction`` draws that share of the materials from the light pool (`LIGHT_ELEMENTS`, Z <= 14)
on a stream of its own, and ``light_family_weights`` draws their templates of the named families
(`namsa.families`: oxide, nitride, carbonate, ..., layered) that many times as often.

Every generated material has an id that *is* its recipe, e.g. ``"NaCl-rocksalt:K,Br:1.0731"``:
template library id, the replacement of each distinct template element in order of first
appearance, and the lattice scale factor. `build` turns an id back into the structure, so a
sample's material can be rebuilt anywhere from its id alone (workers, resumed runs, evaluation),
and splits by material (`stage.splits.split_of`) work on generated ids as on library ids. The
lattice constant belongs to the material (drawn once per id), so no material appears in two splits
with different lattice constants.

Atomic radii: pymatgen's ``Element.atomic_radius``, the empirical radii of J. C. Slater,
J. Chem. Phys. 41, 3199 (1964).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Annotated, Callable, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pymatgen.core import Composition, Element, Structure

from . import library, prototypes
from .element_pool import DEFAULT_ELEMENTS, LIGHT_ELEMENTS
from .errors import UserError
from .families import LAYERED, Family, chemical_family, is_layered
from .material_id import GENERATED_FORM, generated_id, is_generated_id, split_generated_id
from .random_streams import MAX_SEED, GeneratorStream, generator_rng

#: lattice scale factors outside this range are refused (a typo or a broken recipe)
SCALE_LIMITS: tuple[float, float] = (0.5, 2.5)
#: most generated materials one config may ask for: each recipe is drawn and checked one by one
#: before the first sample is simulated (a few ms each), so more would stall planning silently
MAX_GENERATED = 20_000
#: seconds one recipe draw takes on a laptop core (measured: ~3.5 ms), for the refusal's estimate
SECONDS_PER_DRAW = 0.004


class GeneratorError(UserError):
    """A generator setting or a generated id that cannot be used."""


class GeneratorConfig(BaseModel):
    """How many materials to derive, from which templates, with which elements (``simulation.generator``).

    count:          number of generated materials (each then gets the plan's zone axes and variants).
    sources:        where templates come from: ``library`` (namsa.library) and/or ``aflow`` (the
                    checked AFLOW prototypes of namsa.prototypes).
    templates:      template ids (library ids or AFLOW labels), or ``all`` (every template of ``sources``).
    substitution:   ``any`` (any pool element on any site) or ``oxidation`` (namsa.substitution:
                    each replacement takes its predecessor's oxidation state; bonds re-checked).
    elements:       substitution pool (element symbols); None = `DEFAULT_ELEMENTS`.
    lattice_jitter: the radius-scaled lattice constant is multiplied by 1 + U(-j, j) (fraction).
    seed:           the draw of the recipes; the same seed gives the same list of ids.
    light_fraction: share of the materials drawn from the pool's light elements (Z <= 14,
                    `LIGHT_ELEMENTS`) with the oxidation rule, so charge balanced: material k is light
                    when floor((k + 1) f) > floor(k f), so any count holds floor(count f) of them and a
                    longer list still extends a shorter one. They draw on a stream of their own
                    (`GeneratorStream.LIGHT_MATERIALS`), the others as without them. 0 = none.
    light_family_weights: {family: weight} for the template draw of the light materials: a template
                    of a named family (`namsa.families`: its chemical family, e.g. oxide, nitride,
                    carbide, boride, carbonate, silicate, or ``layered``) is drawn weight times as
                    often as one of no named family (the largest weight when it has two); {} = every
                    template alike. The other materials draw every template alike, so the structure
                    types (the prototype splits' held-out units) stay as many as without light ones.
    """

    model_config = ConfigDict(extra="forbid")

    count: int = Field(0, ge=0)
    sources: list[Literal["library", "aflow"]] = Field(default_factory=lambda: ["library"], min_length=1)
    templates: list[str] | Literal["all"] = "all"
    substitution: Literal["any", "oxidation"] = "any"
    elements: list[str] | None = None
    lattice_jitter: float = Field(0.04, ge=0.0, le=0.3)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    light_fraction: float = Field(0.0, ge=0.0, le=1.0)
    light_family_weights: dict[Family, Annotated[float, Field(gt=0.0, le=1000.0, allow_inf_nan=False)]] = Field(
        default_factory=dict)

    @field_validator("count")
    @classmethod
    def _count_bounded(cls, value: int) -> int:
        # Refused up front: the draws below would run for hours before anything is simulated.
        if value > MAX_GENERATED:
            raise ValueError(f"count={value} generated materials would take about "
                             f"{_duration(value * SECONDS_PER_DRAW)} just to draw the recipes, before any "
                             f"sample is simulated; set generator.count to at most {MAX_GENERATED} (and raise "
                             f"variants or zone axes for more samples per material)")
        return value

    @field_validator("templates")
    @classmethod
    def _known_templates(cls, value: list[str] | str) -> list[str] | str:
        if value != "all":
            bad = [t for t in value if t not in library.list_ids()]
            if bad and any(not prototypes.is_template_id(t) for t in bad):
                bad = [t for t in bad if not prototypes.is_template_id(t)]
            elif bad:   # AFLOW labels: only the ones that passed namsa.prototypes' checks
                bad = [t for t in bad if t not in prototypes.accepted_ids()]
            if bad or not value:
                raise ValueError(f"templates {bad or value} are not library ids or accepted AFLOW prototype labels; "
                                 "use ids from namsa.library.list_ids(), namsa.prototypes.accepted_ids() or 'all'")
        return value

    @field_validator("elements")
    @classmethod
    def _known_elements(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            bad = [s for s in value if not Element.is_valid_symbol(s) or _radius(s) is None]
            if bad or len(set(value)) < 3:
                raise ValueError(f"elements {bad or value}: need at least 3 distinct element symbols "
                                 "with a known atomic radius, e.g. [Mg, O, Si, Ga, As]")
        return value

    @model_validator(mode="after")
    def _light_draws_possible(self) -> "GeneratorConfig":
        if self.light_fraction == 0:
            if self.light_family_weights:
                raise ValueError("light_family_weights weights the templates of the light materials, and "
                                 "light_fraction is 0: set generator.light_fraction > 0, or leave the weights out")
            return self
        if self.substitution != "oxidation":
            raise ValueError(f"light_fraction={self.light_fraction} draws charge-balanced light materials by "
                             "namsa.substitution's rule: set generator.substitution: oxidation")
        light = [s for s in self.elements or DEFAULT_ELEMENTS if s in LIGHT_ELEMENTS]
        if len(light) < 3:
            raise ValueError(f"light_fraction={self.light_fraction} draws from the pool's light elements (Z <= 14), "
                             f"and generator.elements holds {light or 'none'}: add at least 3 of "
                             f"{', '.join(LIGHT_ELEMENTS)}")
        return self


def _duration(seconds: float) -> str:
    """``seconds`` as the largest sensible unit, e.g. '46 days'."""
    for unit, size in (("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def draw_budget(count: int) -> int:
    """How many recipes `generated_ids` draws at most for ``count`` materials: every template with more
    distinct elements than the pool holds is skipped, as is a repeat or a refused material."""
    return 50 * count + 100


def generated_ids(cfg: GeneratorConfig, refuse: Callable[[str], bool] | None = None) -> list[str]:
    """The ``cfg.count`` generated material ids, a pure function of ``cfg`` and ``refuse`` (no
    duplicates, none with the same prototype and formula as a library structure).

    ``refuse(id)``: True when a drawn material cannot be used (a plan's: none of its zone axes can be
    built, `namsa.plan`); it is skipped as a repeat is and its slot drawn again from the same stream,
    so the count and the light slots hold and each stream's other draws are as without refusals (but
    for a chemistry both streams draw, which the one now first takes)."""
    if cfg.count == 0:   # no templates to read: reading them costs tens of seconds (prototype verdicts)
        return []
    templates = _source_templates(cfg.sources) if cfg.templates == "all" else list(cfg.templates)
    pool = list(cfg.elements or DEFAULT_ELEMENTS)
    # the light materials draw on a stream of their own, so the others are drawn as without them
    draws = {False: (None, pool, np.random.default_rng(cfg.seed)),
             True: (_draw_weights(templates, cfg.light_family_weights),
                    [s for s in pool if s in LIGHT_ELEMENTS], generator_rng(cfg.seed, GeneratorStream.LIGHT_MATERIALS))}
    taken = {_chemistry(t, _template_elements(t)) for t in _source_templates(["library", *cfg.sources])}
    ids: list[str] = []
    refused = 0
    for _ in range(draw_budget(cfg.count)):
        if len(ids) == cfg.count:
            break
        recipe = _draw_recipe(templates, *draws[is_light_slot(len(ids), cfg.light_fraction)], cfg)
        chemistry = None if recipe is None else _chemistry(recipe[0], recipe[1])
        if chemistry is None or chemistry in taken:
            continue
        taken.add(chemistry)   # a refused material stays taken: drawn again, it would be refused again
        material_id = generated_id(*recipe)
        if refuse is not None and refuse(material_id):
            refused += 1
            continue
        ids.append(material_id)
    if len(ids) < cfg.count:
        light = f" ({cfg.light_fraction:g} of them light)" if cfg.light_fraction else ""
        also = f", {refused} more refused by the plan (no zone axis could be built)" if refused else ""
        raise GeneratorError(f"could draw only {len(ids)} of generator.count={cfg.count} distinct materials{light}"
                             f"{also} from {len(templates)} templates and {len(pool)} elements; add templates or "
                             f"elements")
    return ids


def is_light_slot(index: int, light_fraction: float) -> bool:
    """Whether generated material ``index`` (0-based) is drawn from the light pool: floor((k + 1) f) >
    floor(k f), so the first n materials hold floor(n f) light ones for every n."""
    # the small offset keeps products such as 0.55 * 20 = 11.000000000000002 on their whole number
    return math.floor((index + 1) * light_fraction + 1e-9) > math.floor(index * light_fraction + 1e-9)


def _draw_recipe(templates: list[str], weights: np.ndarray | None, pool: list[str], rng: np.random.Generator,
                 cfg: GeneratorConfig) -> tuple[str, list[str], float] | None:
    """(template, new elements, lattice scale) of one draw, or None when the template cannot take it."""
    index = rng.integers(len(templates)) if weights is None else rng.choice(len(templates), p=weights)
    template = templates[int(index)]
    old = _template_elements(template)
    if len(old) > len(pool):
        return None
    if cfg.substitution == "oxidation":
        recipe = _plausible_recipe(template, pool, rng, cfg.lattice_jitter)
        return None if recipe is None else (template, *recipe)
    new = [str(s) for s in rng.choice(pool, size=len(old), replace=False)]
    jitter = 1.0 + rng.uniform(-cfg.lattice_jitter, cfg.lattice_jitter)
    return template, new, float(np.clip(_radius_ratio(template, old, new) * jitter, *SCALE_LIMITS))


def _draw_weights(templates: list[str], family_weights: dict[str, float]) -> np.ndarray | None:
    """Probability of each template under ``family_weights`` (None: every template alike)."""
    if not family_weights:
        return None
    weights = np.array([max((family_weights[f] for f in _weighted_families(t, LAYERED in family_weights)
                             if f in family_weights), default=1.0) for t in templates])
    return weights / weights.sum()


def _weighted_families(template: str, with_layers: bool) -> set[str]:
    # the layered test (Larsen's algorithm, ~35 ms a template) only where a weight asks for it
    return {_template_family(template), *([LAYERED] if with_layers and _template_layered(template) else [])}


@lru_cache(maxsize=None)
def _template_family(template: str) -> str:
    return chemical_family(_template_structure(template))


@lru_cache(maxsize=None)
def _template_layered(template: str) -> bool:
    return is_layered(_template_structure(template))


def material_families(material_id: str) -> frozenset[str]:
    """The families of a library or generated material: its own chemical family (a substitution may
    change it: S to O makes a sulphide an oxide), ``layered`` when its template is layered."""
    template = _parse(material_id)[0] if is_generated_id(material_id) else material_id
    structure = build(material_id) if is_generated_id(material_id) else library.get(material_id)
    return frozenset({chemical_family(structure), *([LAYERED] if _template_layered(template) else [])})


def _source_templates(sources: list[str]) -> list[str]:
    """Every template of the given sources, library first (in a stable order)."""
    return ((library.list_ids() if "library" in sources else []) +
            (prototypes.accepted_ids() if "aflow" in sources else []))


def _template_structure(template: str) -> Structure:
    """A fresh copy of a template: a library structure or an accepted AFLOW prototype."""
    return library.get(template) if template in library.list_ids() else prototypes.template(template)


def _plausible_recipe(template: str, pool: list[str], rng: np.random.Generator,
                      jitter: float) -> tuple[list[str], float] | None:
    """(new elements, lattice scale) by namsa.substitution's rule, or None when no element can take
    some charge or the rescaled structure fails the bond checks of namsa.prototypes."""
    from .substitution import draw_elements, lattice_scale, template_charges

    structure, old = _template_structure(template), _template_elements(template)
    charges = template_charges(structure)
    new = draw_elements(charges, old, pool, rng)
    if new is None:
        return None
    rename = dict(zip(old, new))
    factor = 1.0 + rng.uniform(-jitter, jitter)
    scale = float(np.clip(lattice_scale(structure, charges, rename) * factor, *SCALE_LIMITS))
    structure.replace_species(rename)
    structure.scale_lattice(structure.volume * scale ** 3)
    return None if prototypes.bond_problem(structure) else (new, scale)


def build(material_id: str) -> Structure:
    """The structure of a generated id (Angstrom; ``properties["material_id"]`` = the id).

    Raises `GeneratorError` (one line) for a malformed id.
    """
    return _build(str(material_id)).copy()


@lru_cache(maxsize=256)
def _build(material_id: str) -> Structure:
    template, new, scale = _parse(material_id)
    structure = _template_structure(template)
    structure.replace_species(dict(zip(_template_elements(template), new)))
    structure.scale_lattice(structure.volume * scale ** 3)
    # a new dict: Structure.copy shares ``properties`` with the template it copied (the library's
    # cached structure), so writing into it would relabel the template and every material built on it
    structure.properties = {**structure.properties, "material_id": material_id}
    return structure


def _parse(material_id: str) -> tuple[str, list[str], float]:
    hint = f"generated ids look like {GENERATED_FORM}"
    try:
        template, new, scale_text = split_generated_id(material_id)
    except ValueError as exc:
        raise GeneratorError(str(exc)) from None
    if template not in library.list_ids() and not prototypes.is_template_id(template):
        raise GeneratorError(f"{material_id!r}: template {template!r} is not a library id or AFLOW label; {hint}")
    old = _template_elements(template)
    if len(new) != len(old) or len(set(new)) != len(new) or not all(Element.is_valid_symbol(s) for s in new):
        raise GeneratorError(f"{material_id!r}: template {template} has elements {old}; give {len(old)} distinct "
                             f"element symbols in that order; {hint}")
    try:
        scale = float(scale_text)
    except ValueError:
        raise GeneratorError(f"{material_id!r}: lattice scale {scale_text!r} is not a number; {hint}") from None
    if not SCALE_LIMITS[0] <= scale <= SCALE_LIMITS[1]:
        raise GeneratorError(f"{material_id!r}: lattice scale {scale} is outside {SCALE_LIMITS}; {hint}")
    return template, new, scale


@lru_cache(maxsize=None)
def _template_elements(template: str) -> list[str]:
    """Distinct elements of a template, in order of first appearance."""
    return list(dict.fromkeys(site.specie.symbol for site in _template_structure(template)))


def _chemistry(template: str, elements: list[str]) -> tuple[str, str]:
    """(prototype, reduced formula): two materials with the same pair are the same material."""
    rename = dict(zip(_template_elements(template), elements))
    formula = Composition({rename[e]: n for e, n in _template_composition(template)}).reduced_formula
    return _template_kind(template), formula


@lru_cache(maxsize=None)
def _template_composition(template: str) -> tuple[tuple[str, float], ...]:
    return tuple((e.symbol, float(n)) for e, n in _template_structure(template).composition.items())


@lru_cache(maxsize=None)
def _template_kind(template: str) -> str:
    """The template's structure type; library tags as AFLOW labels, so NaCl on the AFLOW rocksalt is
    the library's NaCl-rocksalt."""
    from .structure_type import LIBRARY_AFLOW

    if template not in library.list_ids():
        return prototypes.aflow_label(template)
    tag = library.info(template)["prototype"]
    return LIBRARY_AFLOW.get(tag, tag)


def _radius(symbol: str) -> float | None:
    radius = Element(symbol).atomic_radius
    return None if radius is None else float(radius)


def _radius_ratio(template: str, old: list[str], new: list[str]) -> float:
    """Lattice scale that keeps the template's closest contacts as tight, relative to the atoms'
    radii, as they were: the largest (r_a' + r_b') / (r_a + r_b) over the element pairs that
    touch (nearest distance within 20% of the structure's shortest one; Slater radii)."""
    rename = dict(zip(old, new))
    structure = _template_structure(template)
    distances = structure.distance_matrix + np.diag(np.full(len(structure), np.inf))
    shortest = float(distances.min())
    symbols = [site.specie.symbol for site in structure]
    ratios = [(_radius(rename[a]) + _radius(rename[b])) / (_radius(a) + _radius(b))
              for i, a in enumerate(symbols) for j, b in enumerate(symbols) if distances[i, j] <= 1.2 * shortest]
    return float(max(ratios))
