"""namsa.generator: generated materials are valid, reproducible, distinct from the library, and
flow through planning, simulation and material splits like library materials."""
from __future__ import annotations

import numpy as np
import pytest
from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

import namsa
from namsa import generator, library
from namsa.generator import GeneratorConfig, GeneratorError
from namsa.structure_type import LIBRARY_AFLOW, prototype_label
from stage.splits import sample_split, split_of


@pytest.fixture(scope="module")
def ids() -> list[str]:
    return generator.generated_ids(GeneratorConfig(count=40, seed=3))


def test_ids_are_reproducible_and_distinct(ids):
    assert generator.generated_ids(GeneratorConfig(count=40, seed=3)) == ids
    assert len(set(ids)) == 40
    assert generator.generated_ids(GeneratorConfig(count=40, seed=4)) != ids
    # a longer list extends the shorter one (nested study sizes draw the same first materials)
    assert generator.generated_ids(GeneratorConfig(count=60, seed=3))[:40] == ids


def test_no_materials_asked_reads_no_templates(monkeypatch):
    # reading the AFLOW templates' verdicts takes tens of seconds, which once ran the GPU study's
    # 30 s check (a config with generator.count=0) out of time
    def unreadable(sources):
        raise AssertionError(f"templates of {sources} read for count=0")

    monkeypatch.setattr(generator, "_source_templates", unreadable)
    assert generator.generated_ids(GeneratorConfig(count=0, sources=["library", "aflow"])) == []


def test_structures_are_valid_and_keep_the_template_symmetry(ids):
    library_chemistry = {generator._chemistry(t, generator._template_elements(t)) for t in library.list_ids()}
    for material_id in ids[:15]:
        template, elements, scale = material_id.split(":")
        structure = namsa.load_structure(material_id)       # the checked loader accepts generated ids
        assert structure.properties["material_id"] == material_id
        assert sorted({s.specie.symbol for s in structure}) == sorted(elements.split(","))
        assert structure.volume == pytest.approx(library.get(template).volume * float(scale) ** 3, rel=1e-9)
        distances = structure.distance_matrix + np.diag(np.full(len(structure), np.inf))
        assert distances.min() > 0.9, material_id                 # no overlapping atoms
        # substitution keeps the Wyckoff sites, so the space group can only be the template's or higher
        assert SpacegroupAnalyzer(structure, symprec=1e-3).get_space_group_number() >= \
            library.info(template)["spacegroup_number"], material_id
        assert generator._chemistry(template, elements.split(",")) not in library_chemistry
    # rebuilding from the id alone gives the same atoms (workers and resumed runs rely on it)
    a, b = generator.build(ids[0]), generator.build(ids[0])
    assert np.array_equal(a.cart_coords, b.cart_coords) and a.species == b.species


def test_building_a_material_relabels_neither_its_template_nor_its_siblings():
    # Structure.copy shares the properties dict: writing the id into it used to relabel the library's
    # cached template and every material built on it with the last id built
    first = generator.build("WS2-2H:Mg,B:0.9923")
    second = generator.build("WS2-2H:Tb,Ga:1.3363")
    assert first.properties["material_id"] == "WS2-2H:Mg,B:0.9923"
    assert second.properties["material_id"] == "WS2-2H:Tb,Ga:1.3363"
    assert library.get("WS2-2H").properties["material_id"] == "WS2-2H"


def test_lattice_jitter_spreads_the_scale_around_the_radius_rule():
    plain = generator.generated_ids(GeneratorConfig(count=30, seed=5, lattice_jitter=0.0))
    jittered = generator.generated_ids(GeneratorConfig(count=30, seed=5, lattice_jitter=0.1))
    ratios = [float(j.split(":")[2]) / float(p.split(":")[2]) for p, j in zip(plain, jittered)
              if p.split(":")[:2] == j.split(":")[:2] and generator.SCALE_LIMITS[0] < float(p.split(":")[2])
              < generator.SCALE_LIMITS[1] / 1.1]
    assert len(ratios) >= 10
    assert max(abs(r - 1) for r in ratios) <= 0.1 + 1e-4 and np.std(ratios) > 0.02


def test_plan_simulate_and_split_generated_materials():
    cfg = namsa.SimulationConfig(materials=[], generator={"count": 3, "seed": 1}, zone_axes=[[0, 0, 1]],
                                 scan_shape=(4, 4), pattern_px=16, target_px=16, cell_lateral_A=8.0,
                                 thickness_A=8.0, sampling_A=0.25, variants=2,
                                 variations={"thickness_range_A": [8.0, 20.0]})
    plan = namsa.plan_samples(cfg)
    assert not plan.failures and len(plan) == 6
    spec = plan.specs[0]
    assert generator.is_generated_id(spec.material_id)
    one = namsa.simulate_sample(spec.material_id, spec.zone_axis, cfg, spec.variant)
    again = namsa.simulate_sample(spec.material_id, spec.zone_axis, cfg, spec.variant)
    assert one.meta.sample_id == spec.sample_id(cfg)
    assert np.array_equal(one.cbed, again.cbed)
    other = namsa.simulate_sample(spec.material_id, spec.zone_axis, cfg, 1 - spec.variant)
    assert one.meta.thickness_A != other.meta.thickness_A       # each variant draws its thickness
    for sample in (one, other):
        assert 8.0 <= sample.meta.thickness_A < 20.0 + 10.0  # whole beam repeats, each < 10 A here
    assert split_of(spec.material_id, (0.5, 0.25, 0.25), 0) in ("train", "dev", "test")
    # the sample records its structure type: its template's, which a prototype split holds whole
    template = spec.material_id.split(":")[0]
    assert one.meta.prototype == prototype_label(template) == LIBRARY_AFLOW[library.info(template)["prototype"]]
    assert sample_split(one.meta, (0.5, 0.25, 0.25), 0, "prototype") == split_of(one.meta.prototype,
                                                                                 (0.5, 0.25, 0.25), 0)


def test_dose_noise_is_poisson_at_the_dose_and_keeps_the_scale():
    base = dict(materials=["Si-diamond"], zone_axes=[[0, 0, 1]], scan_shape=(4, 4), pattern_px=16,
                target_px=16, cell_lateral_A=8.0, thickness_A=8.0, sampling_A=0.25)
    clean = namsa.simulate_sample("Si-diamond", (0, 0, 1), namsa.SimulationConfig(**base))
    dose = 1e3  # electrons / A^2 -> (8 A / 4)^2 * 1e3 = 4000 electrons per pattern
    noisy = namsa.simulate_sample("Si-diamond", (0, 0, 1), namsa.SimulationConfig(
        **base, variations={"dose_e_per_A2": dose}))
    per_pattern = dose * (clean.meta.fov_A[2] * clean.meta.fov_A[3]) / 16
    counts = noisy.cbed * per_pattern
    assert np.allclose(counts, np.round(counts), atol=1e-2)                       # whole electrons
    assert noisy.cbed.sum() == pytest.approx(clean.cbed.sum(), rel=0.01)          # same intensity scale
    z = (counts - clean.cbed * per_pattern) / np.sqrt(np.maximum(clean.cbed * per_pattern, 1.0))
    assert 0.7 < z[clean.cbed * per_pattern > 20].std() < 1.3                     # Poisson spread
    assert noisy.meta.dose_e_per_A2 == dose


@pytest.mark.parametrize("bad, fix", [
    ("NaCl-rocksalt:K:1.0", "2 distinct element symbols"),
    ("Nope-fcc:K:1.0", "is not a library id"),
    ("Al-fcc:K:9.0", "outside"),
    ("Al-fcc:Xx:1.0", "1 distinct element symbols"),
    ("Al-fcc:K:big", "not a number"),
])
def test_malformed_ids_get_one_line_errors(bad, fix):
    with pytest.raises(GeneratorError, match=fix) as err:
        generator.build(bad)
    assert "\n" not in str(err.value)


def test_bad_generator_settings_are_refused():
    with pytest.raises(ValueError, match="not library ids"):
        GeneratorConfig(count=2, templates=["Unobtainium-fcc"])
    with pytest.raises(ValueError, match="at least 3 distinct"):
        GeneratorConfig(count=2, elements=["Si", "Si"])
    with pytest.raises(GeneratorError, match="could draw only"):
        generator.generated_ids(GeneratorConfig(count=50, templates=["Si-diamond"], elements=["C", "Ge", "Sn"]))
    with pytest.raises(ValueError, match="low <= high"):
        namsa.SimulationConfig(variations={"thickness_range_A": [40, 20]})
