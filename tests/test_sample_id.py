"""The id grammar (namsa.material_id): sample ids made by sample_id and read back by
parse_sample_id (what a re-simulation needs), generated material ids made and split by the same
module that the generator, the structure-type labels and the evaluation's id descriptions use."""
from __future__ import annotations

import pytest

from evaluation.material_ids import describe_material, describe_sample
from namsa import generator
from namsa.material_id import (generated_id, is_generated_id, parse_sample_id, sample_id, split_generated_id,
                               template_of)
from namsa.structure_type import prototype_label


@pytest.mark.parametrize("material", ["Al-fcc", "A2B5_mC28_15_f_e2f:Pr,Cd:1.4556", "odd__name"])
def test_an_id_reads_back_as_what_made_it(material):
    sid = sample_id(material, (2, -1, 0), 3, "f" * 64)
    assert parse_sample_id(sid) == (material, (2, -1, 0), 3)
    assert describe_sample(sid) == {"material": material, "zone_axis": "[2 -1 0]", "variant": "3", "hash": "f" * 12}


@pytest.mark.parametrize("bad", ["Al-fcc", "Al-fcc__0_1__v0__abc", "Al-fcc__0_1_1__x0__abc", "__0_1_1__v0__abc"])
def test_what_is_not_an_id_is_refused(bad):
    with pytest.raises(ValueError, match="is not a sample id"):
        parse_sample_id(bad)
    assert describe_sample(bad) == {}


def test_a_generated_id_is_its_recipe_in_one_grammar():
    mid = generated_id("NaCl-rocksalt", ["K", "Br"], 1.07312)
    assert mid == "NaCl-rocksalt:K,Br:1.0731" and is_generated_id(mid) and not is_generated_id("NaCl-rocksalt")
    assert split_generated_id(mid) == ("NaCl-rocksalt", ["K", "Br"], "1.0731")
    assert template_of(mid) == template_of("NaCl-rocksalt") == "NaCl-rocksalt"
    with pytest.raises(ValueError, match="is not a generated material id"):
        split_generated_id("NaCl-rocksalt:K,Br")
    # the generator builds what the grammar names; the labels and descriptions read the same parts
    assert generator.build(mid).composition.reduced_formula == "KBr"
    assert prototype_label(mid) == prototype_label("NaCl-rocksalt")
    assert describe_material(mid)["made"] == "library NaCl-rocksalt with Na→K, Cl→Br, lattice × 1.0731"
