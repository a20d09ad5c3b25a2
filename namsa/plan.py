"""Planning: which samples a config asks for (SampleSpec, Plan, plan_samples); a structure that
cannot be planned is recorded with its reason, never fatal; what a plan holds (summarize_plan).

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


@dataclass(frozen=True)
class SampleSpec:
    """One planned sample: material id, zone axis [u, v, w], variant index."""

    material_id: str
    zone_axis: tuple[int, int, int]
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

    def __len__(self) -> int:
        return len(self.specs)


@dataclass(frozen=True)
class PlanChoices:
    """What planning chose that is slow to choose again: the generated material ids in the order drawn,
    and each planned material's automatic zone axes (none under explicit ``zone_axes``; a material
    whose search found no axis is left out, its failure is searched again)."""

    generated: tuple[str, ...] = ()
    zone_axes: Mapping[str, tuple[tuple[int, int, int], ...]] = field(default_factory=dict)


def _plan_sources(cfg: SimulationConfig, plan: Plan, generated: list[str]) -> dict[str, Any]:
    from . import generator, library
    from .structure_io import load_cif_dir

    structures: dict[str, Any] = {}
    ids = library.list_ids() if cfg.materials == "library" else list(cfg.materials)
    for material_id in ids + generated:
        try:
            structures[material_id] = (generator.build(material_id) if is_generated_id(material_id)
                                       else library.get(material_id))
            plan.sources[material_id] = material_id
        except library.UnknownStructureIdError:   # advice a config file can follow
            plan.failures.append((material_id, f"unknown structure id {material_id!r}; "
                                               f"{library.suggest_ids(material_id, library.CONFIG_ADVICE)}"))
        except UserError as exc:
            plan.failures.append((material_id, str(exc)))
    if cfg.cif_dir:
        loaded, failures = load_cif_dir(cfg.cif_dir)
        plan.failures.extend(failures)
        for stem, structure in loaded.items():
            structures[stem] = structure
            plan.sources[stem] = str(Path(cfg.cif_dir) / f"{stem}.cif")
    return structures


def plan_samples(cfg: SimulationConfig) -> Plan:
    """Expand the config's dataset plan into SampleSpecs; a bad structure is recorded, never fatal."""
    return plan_and_choices(cfg)[0]


def plan_and_choices(cfg: SimulationConfig, known: PlanChoices | None = None) -> tuple[Plan, PlanChoices]:
    """(the plan of ``cfg``, its `PlanChoices`). ``known``: choices of an earlier plan of the same config,
    used instead of drawing and searching; the caller has checked them against ``cfg``
    (`workflow.plan_cache`), and a material they hold no axes for is searched as without them."""
    from . import generator

    plan = Plan()
    variants = cfg.variants if cfg.variations.any else 1
    generated = list(known.generated) if known is not None else generator.generated_ids(cfg.generator)
    chosen: dict[str, tuple[tuple[int, int, int], ...]] = {}
    for material_id, structure in _plan_sources(cfg, plan, generated).items():
        try:
            axes = _zone_axes(cfg, material_id, structure, known)
        except UserError as exc:
            plan.failures.append((material_id, str(exc)))
            continue
        except Exception as exc:  # a structure the library cannot orient must not stop the plan
            plan.failures.append((material_id, f"{type(exc).__name__}: {' '.join(str(exc).split())}"))
            continue
        if cfg.zone_axes == "auto":
            chosen[material_id] = axes
        plan.specs += [SampleSpec(material_id, axis, variant) for axis in axes for variant in range(variants)]
    return plan, PlanChoices(tuple(generated), chosen)


def _zone_axes(cfg: SimulationConfig, material_id: str, structure: Any,
               known: PlanChoices | None) -> tuple[tuple[int, int, int], ...]:
    """The zone axes of one material: the config's explicit ones, the known choice, or the search."""
    from .supercell import normalize_zone_axis
    from .zone_axes import planned_zone_axes

    if cfg.zone_axes != "auto":
        return tuple(normalize_zone_axis(a) for a in cfg.zone_axes)[: cfg.max_zone_axes]
    if known is not None and material_id in known.zone_axes:
        return tuple(known.zone_axes[material_id])
    # raises (recorded by the caller) rather than returning no axis: a material is never dropped
    axes = planned_zone_axes(structure, cfg.max_zone_axes, cfg.cell_lateral_A, material_id)
    return tuple(tuple(int(i) for i in axis) for axis in axes)  # type: ignore[misc]


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
