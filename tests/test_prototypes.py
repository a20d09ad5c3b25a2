"""The AFLOW templates (namsa.prototypes), their checks, the plausible substitutions
(namsa.substitution through namsa.generator) and the frozen-phonon fraction; the study's
prototype-disjoint splits are checked in tests/test_study_distribution.py."""
from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
from pymatgen.analysis.molecule_structure_comparator import CovalentRadius
from pymatgen.core import Element

from namsa import generator, library, prototypes
from namsa.config import SimulationConfig
from namsa.element_pool import DEFAULT_ELEMENTS
from namsa.errors import UserError
from namsa.structure_type import prototype_label
from namsa.substitution import can_take, is_charge_balanced, template_charges

REPO = Path(__file__).resolve().parents[1]


def _verdict(mineral: str) -> prototypes.TemplateVerdict:
    return next(v for v in prototypes.template_report() if v.mineral == mineral)


def test_report_covers_every_entry_of_pymatgens_library_once() -> None:
    from pymatgen.analysis.prototypes import AFLOW_PROTOTYPE_LIBRARY

    report = prototypes.template_report()
    assert len(report) == len(AFLOW_PROTOTYPE_LIBRARY) == len({v.template_id for v in report})
    assert [v.template_id for v in report if v.accepted] == prototypes.accepted_ids()
    assert all(v.reason for v in report if not v.accepted)
    assert 150 < len(prototypes.accepted_ids()) < len(report)   # most pass, some are refused
    # a repeated label keeps its AFLOW label for the split, behind a distinct id
    repeats = [v for v in report if prototypes.DUPLICATE_MARK in v.template_id]
    assert repeats and all(prototype_label(f"{v.template_id}:X:1.0") == v.aflow for v in repeats)


def test_pymatgens_wrong_anatase_and_tenorite_are_refused_with_their_reasons() -> None:
    anatase, tenorite = _verdict("Anatase"), _verdict("Tenorite")
    assert anatase.template_id == "A2B_tI12_141_e_a" and "Ti bond-valence sum 2.0" in anatase.reason
    assert tenorite.template_id == "AB_mC8_15_c_e" and "Cu-O at 1.67 A" in tenorite.reason
    with pytest.raises(UserError, match="refused: Ti bond-valence sum"):
        prototypes.template("A2B_tI12_141_e_a")
    # the same chemistry, correctly built, passes: rutile TiO2 and cuprite Cu2O
    assert _verdict("Rutile").accepted and _verdict("Cuprite").accepted


def test_every_accepted_template_has_bonds_and_density_within_tolerance() -> None:
    lo, hi = prototypes.DENSITY_LIMITS_G_CM3
    for template_id in prototypes.accepted_ids():
        structure = prototypes.template(template_id)
        radii = np.array([CovalentRadius.radius[site.specie.symbol] for site in structure])
        distances = structure.distance_matrix + np.diag(np.full(len(structure), np.inf))
        shortest = float((distances / (radii[:, None] + radii[None, :])).min())
        assert shortest >= prototypes.COVALENT_TOLERANCE, template_id
        assert lo <= structure.density <= hi, template_id
        assert {s.symbol for s in structure.composition} <= set(DEFAULT_ELEMENTS), template_id


def test_unknown_template_is_a_user_error() -> None:
    with pytest.raises(UserError, match="not an AFLOW prototype label"):
        prototypes.template("AB_cF8_999_z_z")
    from namsa.structure_io import load_structure

    with pytest.raises(UserError, match="is refused"):   # a refused template cannot come back through an id
        load_structure("A2B_tI12_141_e_a:Sn,O:1.0000")


def _oxidation_ids(count: int = 40) -> list[str]:
    return generator.generated_ids(generator.GeneratorConfig(count=count, seed=2, sources=["aflow"],
                                                             substitution="oxidation"))


def _recipe(material_id: str):
    """(template structure, its charges, old -> new elements) of a generated id on an AFLOW template."""
    template_id, elements, _ = material_id.split(":")
    template = prototypes.template(template_id)
    old = list(dict.fromkeys(site.specie.symbol for site in template))
    return template, template_charges(template), dict(zip(old, elements.split(",")))


def test_oxidation_substitutions_keep_charge_balance_and_plausible_bonds() -> None:
    ids = _oxidation_ids()
    assert len(ids) == 40 and all(prototypes.is_template_id(i.split(":")[0]) for i in ids)
    ionic = 0
    for material_id in ids:
        template, charges, rename = _recipe(material_id)
        assert is_charge_balanced(template, charges, rename), material_id
        for before, after in rename.items():
            charge = charges[before]
            if float(charge).is_integer() and charge != 0:
                assert int(charge) in Element(after).common_oxidation_states, material_id
        ionic += any(charges.values())
        assert prototypes.bond_problem(generator.build(material_id)) == "", material_id
    assert ionic >= 10   # the charged rule was exercised, not only the metal-for-metal one


def test_any_element_on_any_site_breaks_charge_balance_which_the_rule_prevents() -> None:
    ids = generator.generated_ids(generator.GeneratorConfig(count=40, seed=2, sources=["aflow"]))
    recipes = [_recipe(material_id) for material_id in ids]
    assert any(any(charges.values()) and not is_charge_balanced(template, charges, rename)
               for template, charges, rename in recipes)


def test_can_take_follows_oxidation_states_and_metallicity() -> None:
    assert can_take("Sr", "Ca", 2) and not can_take("Na", "Ca", 2)   # Na is never +2
    assert can_take("S", "O", -2) and not can_take("Se", "Ca", 2)    # Se2+ may exist, not on a metal site
    assert can_take("Mn", "Fe", 8 / 3)                               # mixed valence between +2 and +3
    # an anion takes only its own anion charge: carbon (common states -4 to +4) is a carbide's anion
    assert can_take("C", "C", -4) and not can_take("C", "Cl", -1) and not can_take("C", "O", -2)
    assert not can_take("N", "C", -1 / 3)                            # no mixed-valence anion
    # no charges (intermetallics, borides, covalent networks): metal for metal, else the same group
    assert can_take("Mg", "Al", 0) and not can_take("Si", "Al", 0)
    assert can_take("B", "B", 0) and not can_take("Al", "B", 0) and not can_take("O", "C", 0)
    assert can_take("Se", "S", 0) and not can_take("Te", "S", 0)     # Te is a metalloid, S is not


def test_default_generator_draws_are_unchanged() -> None:
    """quickstart and every existing config keep their materials: ids drawn by the code before
    AFLOW templates and the oxidation rule existed."""
    assert generator.generated_ids(generator.GeneratorConfig(count=6, seed=0)) == [
        "BN-hexagonal:Rh,Cs:2.5000", "Pd-fcc:Be:0.7688", "SnO2-rutile:Os,Ru:1.2916",
        "TiO2-rutile:Ag,Cd:1.6148", "MgF2-rutile:Li,Se:1.2515", "ZnO-wurtzite:Hf,Sm:1.7942"]


def test_aflow_template_ids_load_and_label_as_their_prototype() -> None:
    from namsa.structure_io import load_structure

    material_id = _oxidation_ids(3)[0]
    structure = load_structure(material_id)
    assert structure.properties["material_id"] == material_id
    assert prototype_label(material_id) == prototypes.aflow_label(material_id.split(":")[0])
    # the AFLOW rocksalt and the library's rocksalt are one structure type for the splits
    assert prototype_label("NaCl-rocksalt") == prototypes.aflow_label("AB_cF8_225_a_b")
    assert generator._chemistry("AB_cF8_225_a_b", ["Na", "Cl"]) == generator._chemistry("NaCl-rocksalt", ["Na", "Cl"])
    assert "NaCl-rocksalt" in library.list_ids()


def test_frozen_phonon_fraction_applies_to_that_share_of_samples() -> None:
    from namsa.variations import uses_frozen_phonon

    some = SimulationConfig(variations={"frozen_phonon": True, "frozen_phonon_fraction": 0.25})
    share = np.mean([uses_frozen_phonon(some, seed) for seed in range(2000)])
    assert 0.22 < share < 0.28
    every = SimulationConfig(variations={"frozen_phonon": True})
    assert all(uses_frozen_phonon(every, seed) for seed in range(50))
    # the fraction enters the physics hash only when set, so earlier stores keep their ids
    assert every.physics_hash() != some.physics_hash()
    unset = SimulationConfig(variations={"frozen_phonon_fraction": None})
    assert SimulationConfig().physics_hash() == unset.physics_hash()


def test_phonon_fraction_sample_records_whether_it_was_displaced() -> None:
    from namsa.simulate import simulate_sample
    from namsa.variations import sample_seed, uses_frozen_phonon

    cfg = SimulationConfig(variations={"frozen_phonon": True, "frozen_phonon_fraction": 0.5, "tilt_mrad": 2.0},
                           scan_shape=(2, 2), pattern_px=8, target_px=8, cell_lateral_A=6.0, thickness_A=4.0,
                           sampling_A=0.3, max_zone_axes=1)
    flags = {v: uses_frozen_phonon(cfg, sample_seed(cfg, "Si-diamond", (1, 0, 0), v)) for v in range(8)}
    assert set(flags.values()) == {True, False}
    for variant in (next(v for v, f in flags.items() if f), next(v for v, f in flags.items() if not f)):
        sample = simulate_sample("Si-diamond", (1, 0, 0), cfg, variant)
        assert sample.meta.frozen_phonon is flags[variant]


def test_a_template_the_planner_cannot_orient_is_reported_not_dropped() -> None:
    """Triclinic A2B_aP6_2_2i_i (the PI2 template) with Br and S has no orthogonal cell within 2%
    strain at the default 12 A supercell: the material is in the plan's failures, with what would
    orient it, beside a material that plans."""
    from namsa.plan import plan_samples

    cfg = SimulationConfig(materials=["A2B_aP6_2_2i_i:Br,S:1.1288", "Si-diamond"], max_zone_axes=2)
    plan = plan_samples(cfg)
    assert {s.material_id for s in plan.specs} == {"Si-diamond"}
    [(material_id, why)] = plan.failures
    assert material_id == "A2B_aP6_2_2i_i:Br,S:1.1288" and "found no usable zone axis" in why and "simulation." in why


def test_docs_list_the_refused_templates_as_the_checks_give_them() -> None:
    text = (REPO / "docs" / "structures.md").read_text(encoding="utf-8")
    block = text.split("<!-- refused-templates:start -->\n", 1)[1].split("\n<!-- refused-templates:end -->", 1)[0]
    assert block == prototypes.refused_markdown()
