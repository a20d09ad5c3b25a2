"""Planning: which samples a config asks for (SampleSpec, Plan, plan_samples); a structure that
cannot be planned is recorded with its reason, never fatal; what a plan holds (summarize_plan).

A material is planned only along zone axes its simulation can build (the automatic search, or the
cell choice `orient_supercell` makes along an explicit axis), so no planned sample fails there. A
generated material with no such axis is refused as it is drawn and its slot drawn again, so
``generator.count`` materials, and the plan's counts, still come out; its refusal is in the plan's
failures, with why, and in `Plan.replaced`.

Two of planning's steps are slow and not cheaply re-derived: drawing the generated materials and
searching each material's automatic zone axes. `plan_and_choices` returns those choices
(`PlanChoices`) beside the plan and takes them back in place of the draw and the searches, so a
plan kept on disk (`workflow.plan_cache`) stores only them; sources, failures, variants and order
are planned from the config every time."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .config import SimulationConfig
from .errors import UserError
from .material_id import is_generated_id, sample_id

Axis = tuple[int, int, int]


@dataclass(frozen=True)
class SampleSpec:
    """One planned sample: material id, zone axis [u, v, w], variant index."""

    material_id: str
    zone_axis: Axis
    variant: int

    def sample_id(self, cfg: SimulationConfig) -> str:
        return sample_id(self.material_id, self.zone_axis, self.variant, cfg.physics_hash())


@dataclass
class Plan:
    """Every sample a config asks for, and the structures that could not be planned (with why)."""

    specs: list[SampleSpec] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    #: material id -> what ``simulate_sample`` should load (library id or CIF path)
    sources: dict[str, str] = field(default_factory=dict)
    #: generated materials refused as they were drawn (each in ``failures``, with why) and replaced by
    #: the next draw: no sample of the plan is missing for them
    replaced: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.specs)


@dataclass(frozen=True)
class PlanChoices:
    """What planning chose that is slow to choose again: the generated material ids in slot order, each
    planned material's automatic zone axes (none under explicit ``zone_axes``; a material whose search
    found no axis is left out, its failure is searched again, and so is one whose axes only its standard
    cell gave: indices beyond `namsa.zone_axes.MAX_INDEX` in its own basis, which a stored plan does not
    hold), and the generated materials refused as they were drawn, in that order (searched again on a
    read, for their failures)."""

    generated: tuple[str, ...] = ()
    zone_axes: Mapping[str, tuple[Axis, ...]] = field(default_factory=dict)
    refused: tuple[str, ...] = ()


class _StaleChoices(Exception):
    """Known choices this plan's own checks contradict (a generated material that cannot be planned, a
    refused one that can): the plan is made afresh instead (never leaves this module)."""


def plan_samples(cfg: SimulationConfig) -> Plan:
    """Expand the config's dataset plan into SampleSpecs; a bad structure is recorded, never fatal."""
    return plan_and_choices(cfg)[0]


def plan_and_choices(cfg: SimulationConfig, known: PlanChoices | None = None) -> tuple[Plan, PlanChoices]:
    """(the plan of ``cfg``, its `PlanChoices`). ``known``: choices of an earlier plan of the same config,
    used instead of drawing and searching; the caller has checked them against ``cfg``
    (`workflow.plan_cache`), a material they hold no axes for is searched as without them, and choices
    that this plan's checks contradict are planned over."""
    if known is not None:
        try:
            return _plan(cfg, known)
        except _StaleChoices:
            pass
    return _plan(cfg, None)


def _plan(cfg: SimulationConfig, known: PlanChoices | None) -> tuple[Plan, PlanChoices]:
    from .supercell import ZoneAxisError, normalize_zone_axis

    plan = Plan()
    try:
        explicit = None if cfg.zone_axes == "auto" else \
            tuple(normalize_zone_axis(a) for a in cfg.zone_axes)[: cfg.max_zone_axes]
    except ZoneAxisError as exc:   # the config's own axes: every material fails alike, none is refused for it
        return _unplannable(cfg, known, plan, str(exc))
    drawn = _GeneratedMaterials(cfg, explicit, known)
    generated = drawn.draw()
    variants = range(cfg.first_variant, cfg.first_variant + cfg.variants) if cfg.variations.any else range(1)
    chosen: dict[str, tuple[Axis, ...]] = {}
    for material_id, structure in _plan_sources(cfg, plan, {m: drawn.structures[m] for m in generated}).items():
        try:
            axes, refused = drawn.checked.get(material_id) or _axes_of(cfg, material_id, structure, explicit, known)
        except Exception as exc:  # a structure the library cannot orient must not stop the plan
            plan.failures.append((material_id, _reason(exc)))
            continue
        plan.failures += [(material_id, why) for why in refused]
        if explicit is None and _storable(axes):
            chosen[material_id] = axes
        plan.specs += [SampleSpec(material_id, axis, variant) for axis in axes for variant in variants]
    plan.replaced = list(drawn.refusals)
    plan.failures += list(drawn.refusals.items())
    return plan, PlanChoices(tuple(generated), chosen, tuple(drawn.refusals))


class _GeneratedMaterials:
    """The generated materials of a plan, each checked as it is drawn: built, and planned along the axes
    its simulation can build; one with no such axis is refused, with why (an explicit axis that only
    some cannot be built along is dropped for those, as for a named material: no structure type leaves
    the plan for want of one axis)."""

    def __init__(self, cfg: SimulationConfig, explicit: tuple[Axis, ...] | None, known: PlanChoices | None):
        self.cfg, self.explicit, self.known = cfg, explicit, known
        self.structures: dict[str, Any] = {}
        #: planned material id -> (its axes, why each other explicit axis is not one)
        self.checked: dict[str, tuple[tuple[Axis, ...], list[str]]] = {}
        #: refused material id -> why, in the order drawn
        self.refusals: dict[str, str] = {}

    def draw(self) -> list[str]:
        """The generated ids: drawn (`namsa.generator.generated_ids`, each refused one drawn again), or
        the known ones, each judged again as it was (else `_StaleChoices`)."""
        from . import generator

        if self.known is None:
            return generator.generated_ids(self.cfg.generator, refuse=self.refuse)
        if any(self.refuse(m) for m in self.known.generated) or not all(self.refuse(m) for m in self.known.refused):
            raise _StaleChoices
        return list(self.known.generated)

    def refuse(self, material_id: str) -> bool:
        """True, with why kept in ``refusals``, when ``material_id`` cannot be planned."""
        from . import generator

        try:
            structure = generator.build(material_id)
            axes, refused = _axes_of(self.cfg, material_id, structure, self.explicit, self.known)
            if not axes:
                raise UserError("; ".join(refused))
        except Exception as exc:  # the search's UserError, or whatever a structure library raises
            self.refusals[material_id] = f"{_reason(exc)} (refused as drawn; the next draw took its place)"
            return True
        self.structures[material_id], self.checked[material_id] = structure, (axes, refused)
        return False


def _unplannable(cfg: SimulationConfig, known: PlanChoices | None, plan: Plan, why: str) -> tuple[Plan, PlanChoices]:
    """The plan of a config whose explicit zone axes are not axes: every material fails with ``why``."""
    from . import generator

    generated = list(known.generated) if known is not None else generator.generated_ids(cfg.generator)
    structures = {m: generator.build(m) for m in generated}
    plan.failures += [(material_id, why) for material_id in _plan_sources(cfg, plan, structures)]
    return plan, PlanChoices(tuple(generated))


def _plan_sources(cfg: SimulationConfig, plan: Plan, generated: dict[str, Any]) -> dict[str, Any]:
    """The structures of the config's named materials, the ``generated`` ones (built already) and the
    CIFs of ``cif_dir``, in that order; what each is loaded from in ``plan.sources``."""
    from . import generator, library
    from .structure_io import load_cif_dir

    structures: dict[str, Any] = {}
    for material_id in library.list_ids() if cfg.materials == "library" else list(cfg.materials):
        try:   # a generated id named in the config is planned as it is, never replaced
            structures[material_id] = (generator.build(material_id) if is_generated_id(material_id)
                                       else library.get(material_id))
            plan.sources[material_id] = material_id
        except library.UnknownStructureIdError:   # advice a config file can follow
            plan.failures.append((material_id, f"unknown structure id {material_id!r}; "
                                               f"{library.suggest_ids(material_id, library.CONFIG_ADVICE)}"))
        except UserError as exc:
            plan.failures.append((material_id, str(exc)))
    for material_id, structure in generated.items():
        structures[material_id] = structure
        plan.sources[material_id] = material_id
    if cfg.cif_dir:
        loaded, failures = load_cif_dir(cfg.cif_dir)
        plan.failures.extend(failures)
        for stem, structure in loaded.items():
            structures[stem] = structure
            plan.sources[stem] = str(Path(cfg.cif_dir) / f"{stem}.cif")
    return structures


def _axes_of(cfg: SimulationConfig, material_id: str, structure: Any, explicit: tuple[Axis, ...] | None,
             known: PlanChoices | None) -> tuple[tuple[Axis, ...], list[str]]:
    """(the axes ``material_id`` is planned along, why each other explicit axis is not): the automatic
    search (the known choice, else `planned_zone_axes`, which raises rather than return no axis: a
    material is never dropped), or the explicit axes whose cell its simulation can build."""
    from .zone_axes import buildable_axes, planned_zone_axes

    if explicit is not None:
        built, refused = buildable_axes(structure, explicit, cfg.cell_lateral_A, material_id)
        return tuple(built), refused
    if known is not None and material_id in known.zone_axes:
        return tuple(known.zone_axes[material_id]), []
    axes = planned_zone_axes(structure, cfg.max_zone_axes, cfg.cell_lateral_A, material_id)
    return tuple(tuple(int(i) for i in axis) for axis in axes), []  # type: ignore[misc]


def _storable(axes: tuple[Axis, ...]) -> bool:
    """Whether a stored plan holds ``axes``: indices within the search's own range in the structure's
    basis (`workflow.plan_cache` refuses others; a standard-cell axis beyond it is searched again)."""
    from .zone_axes import MAX_INDEX

    return all(max(abs(i) for i in axis) <= MAX_INDEX for axis in axes)


def _reason(exc: Exception) -> str:
    """One line saying why a material was not planned: a UserError's own words, else its type and text."""
    return str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {' '.join(str(exc).split())}"


@dataclass(frozen=True)
class PlanSummary:
    """What a plan holds, counted in samples: light ones (every element Z <= 14,
    `namsa.kirkland.is_light`), thin ones (requested thickness below ``thin_below_A``, Angstrom; the
    box holds whole beam repeats, so the simulated one can be up to one repeat more) and each family
    of `namsa.families` (a sample counts once for its chemical family, and again under ``layered``)."""

    samples: int
    light: int
    thin: int
    thin_below_A: float
    families: dict[str, int]

    def __str__(self) -> str:
        families = ", ".join(f"{name} {n}" for name, n in sorted(self.families.items(), key=lambda kv: -kv[1]))
        return (f"{self.samples} samples: {self.light} light ({self.light / max(self.samples, 1):.0%}), {self.thin} "
                f"thinner than {self.thin_below_A:g} A ({self.thin / max(self.samples, 1):.0%}); {families}")


#: "thin" where the config names no cut-off of its own (variations.thin_below_A): the evaluation's first
#: thickness bin (evaluation.thickness_bins_A), where weak-phase ptychography is at its best
DEFAULT_THIN_BELOW_A = 50.0


def summarize_plan(plan: Plan, cfg: SimulationConfig, thin_below_A: float | None = None) -> PlanSummary:
    """Count the light, thin and per-family samples of ``plan`` (built from ``cfg``) without simulating;
    thin: below ``thin_below_A`` (Angstrom), by default the config's ``variations.thin_below_A``."""
    from .variations import sample_seed, specimen_thickness_A

    if thin_below_A is None:
        thin_below_A = cfg.variations.thin_below_A or DEFAULT_THIN_BELOW_A

    facts = {material_id: _material_facts(material_id, plan.sources[material_id])
             for material_id in dict.fromkeys(spec.material_id for spec in plan.specs)}
    family_counts: Counter[str] = Counter()
    light = thin = 0
    for spec in plan.specs:
        is_light, families = facts[spec.material_id]
        light += is_light
        family_counts.update(families)
        thickness = specimen_thickness_A(cfg, sample_seed(cfg, spec.material_id, spec.zone_axis, spec.variant))
        thin += thickness < thin_below_A
    return PlanSummary(len(plan.specs), light, thin, float(thin_below_A), dict(family_counts))


def _material_facts(material_id: str, source: str) -> tuple[bool, frozenset[str]]:
    """(light, families) of one planned material (`namsa.generator.material_families` for library and
    generated ids, the structure's own families for a CIF)."""
    from . import generator, library
    from .families import families
    from .kirkland import is_light
    from .structure_io import load_structure

    structure = load_structure(source)
    known = is_generated_id(material_id) or material_id in library.list_ids()
    return (is_light([e.symbol for e in structure.composition]),
            generator.material_families(material_id) if known else families(structure))
