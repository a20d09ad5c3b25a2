"""The study's training data looks like what microscopists image (issue 30, part 3): a stated share of
light (every element Z <= 14), charge-balanced generated materials whose templates lean towards oxides,
nitrides, carbides, borides, carbonates, silicates and layered materials; a stated share of thin
specimens; and the prototype-disjoint splits kept. Fast tests on the study's own generator and
variation settings with fewer materials; the slow one on the study's whole plan, built without
simulating."""
from __future__ import annotations

import collections
import math
from pathlib import Path

import numpy as np
import pytest

from namsa import generator
from namsa.config import SimulationConfig
from namsa.errors import UserError
from namsa.families import chemical_family, is_layered
from namsa.kirkland import is_light
from namsa.prototypes import bond_problem
from namsa.substitution import is_charge_balanced, template_charges
from namsa.variations import sample_seed, specimen_thickness_A
from workflow.config import load_config

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "configs" / "study.yaml"
#: the families the study's light draws lean towards (configs/study.yaml, generator.light_family_weights)
IMAGED = ("oxide", "nitride", "carbide", "boride", "carbonate", "silicate", "layered")


def _light(material_id: str) -> bool:
    return is_light([e.symbol for e in generator.build(material_id).composition])


def _template_and_rename(material_id: str):
    """(template structure, old -> new elements) of a generated id: the substitution's own record."""
    template_id, elements, _ = material_id.split(":")
    template = generator._template_structure(template_id)
    return template, dict(zip(generator._template_elements(template_id), elements.split(",")))


def test_the_studys_light_share_is_charge_balanced_with_plausible_bonds() -> None:
    """The study's generator with fewer materials; its template weights left out here (each template's
    families take ~20 s to find; test_family_weights_lean_... checks them), as they choose templates,
    not the substitution rule checked here."""
    cfg = load_config(STUDY).simulation.generator.model_copy(update={"count": 40, "light_family_weights": {}})
    ids = generator.generated_ids(cfg)
    slots = [generator.is_light_slot(k, cfg.light_fraction) for k in range(len(ids))]
    assert sum(slots) == math.floor(40 * cfg.light_fraction) >= 0.4 * 40
    for material_id, light_slot in zip(ids, slots):
        if not light_slot:
            continue
        assert _light(material_id), material_id
        template, rename = _template_and_rename(material_id)
        charges = template_charges(template)
        assert is_charge_balanced(template, charges, rename), material_id
        assert bond_problem(generator.build(material_id)) == "", material_id


def test_light_materials_draw_on_their_own_stream_and_leave_the_others_as_they_were() -> None:
    plain = dict(count=24, sources=["library", "aflow"], substitution="oxidation", seed=2)
    without = generator.generated_ids(generator.GeneratorConfig(**plain))
    mixed = generator.generated_ids(generator.GeneratorConfig(**plain, light_fraction=0.5))
    heavy = [m for k, m in enumerate(mixed) if not generator.is_light_slot(k, 0.5)]
    assert heavy == without[:len(heavy)] and len(heavy) == 12
    assert all(_light(m) for k, m in enumerate(mixed) if generator.is_light_slot(k, 0.5))
    # a longer list extends the shorter one, light materials included
    longer = generator.generated_ids(generator.GeneratorConfig(**{**plain, "count": 30}, light_fraction=0.5))
    assert longer[:24] == mixed


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.5, 0.55, 1.0])
def test_every_prefix_holds_the_stated_share_of_light_slots(fraction: float) -> None:
    slots = [generator.is_light_slot(k, fraction) for k in range(200)]
    assert all(sum(slots[:n]) == math.floor(n * fraction + 1e-9) for n in range(201))


def test_family_weights_lean_the_light_templates_towards_those_families() -> None:
    base = dict(count=16, sources=["library"], substitution="oxidation", seed=1, light_fraction=1.0)

    def family_counts(weights: dict[str, float]) -> collections.Counter:
        ids = generator.generated_ids(generator.GeneratorConfig(**base, light_family_weights=weights))
        return collections.Counter(f for i in ids for f in generator.material_families(i))

    alike, leaning = family_counts({}), family_counts({"nitride": 50.0, "layered": 50.0})
    assert leaning["nitride"] + leaning["layered"] > alike["nitride"] + alike["layered"] + 4


def test_families_name_the_compounds_microscopists_image() -> None:
    from namsa import library, prototypes

    named = {"MgO-rocksalt": "oxide", "AlN-wurtzite": "nitride", "SiC-zincblende": "carbide",
             "MgB2-AlB2": "boride", "Cu-fcc": "element", "LiF-rocksalt": "halide", "GaAs-zincblende": "other",
             "ZnS-zincblende": "chalcogenide"}
    assert {i: chemical_family(library.get(i)) for i in named} == named
    assert chemical_family(prototypes.template("ABC3_hR10_167_a_b_e~2")) == "carbonate"   # calcite
    assert chemical_family(prototypes.template("A4BC_tI24_141_h_b_a")) == "silicate"     # zircon
    assert chemical_family(prototypes.template("AB3_cP4_221_a_c")) == "intermetallic"    # Cu3Au
    assert is_layered(library.get("C-graphite")) and is_layered(library.get("MoS2-2H"))
    assert not is_layered(library.get("C-diamond")) and not is_layered(library.get("LiCoO2-layered"))


def test_the_thin_share_is_drawn_below_the_edge_and_uniform_elsewhere() -> None:
    study = load_config(STUDY).simulation
    var = study.variations
    seeds = range(4000)
    thickness = np.array([specimen_thickness_A(study, seed) for seed in seeds])
    lo, hi = var.thickness_range_A
    assert lo <= thickness.min() and thickness.max() <= hi
    assert abs(np.mean(thickness < var.thin_below_A) - var.thin_fraction) < 0.03
    assert var.thin_fraction > 1 / 3 and var.thin_below_A == 50
    # without thin_fraction the thickness stream draws exactly as before the key existed
    plain = SimulationConfig(variations={"thickness_range_A": [lo, hi]})
    assert [specimen_thickness_A(plain, s) for s in range(5)] == [
        float(np.random.default_rng([s, 1]).uniform(lo, hi)) for s in range(5)]
    assert plain.physics_hash() == SimulationConfig(variations={"thickness_range_A": [lo, hi],
                                                                "thin_fraction": None}).physics_hash()
    # a one-value range is a fixed thickness (scripts/gpu_study_check.py's quick sample): no share to draw
    fixed = load_config(STUDY, ["simulation.variations.thickness_range_A=[20,20]"]).simulation
    assert {specimen_thickness_A(fixed, seed) for seed in range(20)} == {20.0}


@pytest.mark.parametrize("override, says", [
    ("simulation.generator.light_fraction=1.5", "light_fraction: Input should be less than or equal to 1"),
    ("simulation.generator.substitution=any", "set generator.substitution: oxidation"),
    ("simulation.generator.elements=[Fe,Co,Ni,Cu]", "add at least 3 of Li, Be, B"),
    ("simulation.generator.light_family_weights.oxides=2", "light_family_weights.oxides"),
    ("simulation.generator.light_family_weights.oxide=0", "Input should be greater than 0"),
    ("simulation.generator.light_fraction=0", "set generator.light_fraction > 0"),
    ("simulation.variations.thin_fraction=-0.1", "thin_fraction: Input should be greater than or equal to 0"),
    ("simulation.variations.thin_below_A=200", "must lie inside variations.thickness_range_A"),
    ("simulation.variations.thin_below_A=null", "thin_fraction (the share of thin samples) and thin_below_A"),
])
def test_bad_light_and_thin_settings_are_one_line_errors(override: str, says: str) -> None:
    with pytest.raises(UserError) as err:
        load_config(STUDY, [override])
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.fixture(scope="module")
def study_plan():
    from namsa.plan import plan_samples

    cfg = load_config(STUDY)
    return cfg, plan_samples(cfg.simulation)


@pytest.mark.slow
def test_the_studys_plan_is_light_thin_and_rich_in_imaged_families(study_plan) -> None:
    """The study's whole plan (1-2 minutes of CPU: recipe draws and zone-axis searches): at least 40%
    light samples, a third thinner than 50 A (asked for and as simulated, whole beam repeats), each
    imaged family present, and the counts configs/study.yaml states."""
    from namsa.plan import summarize_plan
    from namsa.structure_io import load_structure
    from namsa.supercell import Orienter

    cfg, plan = study_plan
    summary = summarize_plan(plan, cfg.simulation)
    print(summary)
    assert summary.light >= 0.40 * summary.samples and summary.thin >= summary.samples / 3
    assert all(summary.families.get(f, 0) > 0 for f in IMAGED), summary.families
    comment = " ".join(STUDY.read_text().split())
    assert f"{summary.samples:,} samples: {summary.light} light" in comment
    # as simulated: the box holds the smallest whole number of beam repeats covering the drawn thickness
    orienters: dict[str, Orienter] = {}
    simulated = []
    for spec in plan.specs:
        if spec.material_id not in orienters:
            orienters[spec.material_id] = Orienter(load_structure(plan.sources[spec.material_id]), 20.0)
        orienter = orienters[spec.material_id]
        repeat = float(np.linalg.norm(orienter.beam_indices(spec.zone_axis) @ orienter.prim))
        drawn = specimen_thickness_A(cfg.simulation, sample_seed(cfg.simulation, spec.material_id, spec.zone_axis,
                                                                 spec.variant))
        simulated.append(max(1, math.ceil(drawn / repeat - 1e-9)) * repeat)
    assert np.mean(np.array(simulated) < 50.0) >= 1 / 3


@pytest.mark.slow
def test_the_studys_plan_holds_out_whole_prototypes(study_plan) -> None:
    """No prototype in two splits, at least 30 test prototypes and 150 test samples (moved here from
    tests/test_prototypes.py, so the study's plan is built once)."""
    from namsa.structure_type import prototype_label
    from stage.splits import split_of

    cfg, plan = study_plan
    assert cfg.data.split_by == "prototype"
    splits: dict[str, set[str]] = collections.defaultdict(set)
    samples: collections.Counter = collections.Counter()
    for spec in plan.specs:
        label = prototype_label(spec.material_id)
        split = split_of(label, cfg.data.split_fractions, cfg.data.split_seed)
        splits[label].add(split)
        samples[split] += 1
    assert all(len(s) == 1 for s in splits.values())
    held_out = collections.Counter(next(iter(s)) for s in splits.values())
    assert held_out["test"] >= 30 and held_out["dev"] >= 20 and samples["test"] >= 150
    assert len(plan.failures) < 0.05 * len(plan.specs)   # unorientable structures are reported, and few


def test_generator_streams_never_meet_a_samples_streams() -> None:
    from namsa.random_streams import GeneratorStream, SampleStream

    assert min(GeneratorStream) > 100 > max(SampleStream)


def test_a_plans_summary_counts_thin_by_the_configs_own_cut_off() -> None:
    """summarize_plan's "thin" is the config's variations.thin_below_A (here 30 A), not a fixed 50 A; a
    config without one counts below 50 A (the evaluation's first thickness bin)."""
    from namsa.plan import DEFAULT_THIN_BELOW_A, plan_samples, summarize_plan

    variations = dict(thickness_range_A=(10.0, 150.0), thin_fraction=0.5, thin_below_A=30.0)
    cfg = SimulationConfig(materials=["Al-fcc", "Cu-fcc", "Fe-bcc", "Mg-hcp"], variants=3, variations=variations)
    plan = plan_samples(cfg)
    summary = summarize_plan(plan, cfg)
    thicknesses = [specimen_thickness_A(cfg, sample_seed(cfg, s.material_id, s.zone_axis, s.variant)) for s in plan.specs]
    assert summary.thin_below_A == 30.0 and summary.thin == sum(t < 30.0 for t in thicknesses) > 0
    plain = SimulationConfig(materials=["Al-fcc", "Cu-fcc", "Fe-bcc", "Mg-hcp"], variants=3,
                             variations=dict(thickness_range_A=(10.0, 150.0)))
    assert summarize_plan(plan_samples(plain), plain).thin_below_A == DEFAULT_THIN_BELOW_A
