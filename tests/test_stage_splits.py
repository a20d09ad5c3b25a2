"""Splits by material: deterministic, no leakage, fractions respected."""
from __future__ import annotations

from collections import Counter

import pytest

import stage
from namsa.errors import UserError
from namsa.sample_meta import SampleMeta
from stage_helpers import CONFIG_HASH, make_sample


def test_split_of_is_deterministic_and_respects_fractions():
    ids = [f"mp-{i}" for i in range(4000)]
    first = [stage.split_of(m, (0.9, 0.05, 0.05), 0) for m in ids]
    assert first == [stage.split_of(m, (0.9, 0.05, 0.05), 0) for m in ids]
    counts = Counter(first)
    assert abs(counts["train"] / 4000 - 0.90) < 0.02
    assert abs(counts["dev"] / 4000 - 0.05) < 0.015
    assert abs(counts["test"] / 4000 - 0.05) < 0.015
    other_seed = [stage.split_of(m, (0.9, 0.05, 0.05), 1) for m in ids]
    assert other_seed != first
    assert Counter(stage.split_of(m, (0.5, 0.5, 0.0), 3) for m in ids).keys() == {"train", "dev"}


@pytest.mark.parametrize("bad", [(0.9, 0.05), (0.9, 0.2, 0.1), (1.1, -0.05, -0.05)])
def test_bad_fractions_are_a_user_error(bad):
    with pytest.raises(UserError, match="fractions"):
        stage.split_of("mp-1", bad, 0)
    with pytest.raises(ValueError):
        stage.DataConfig(split_fractions=bad)


def test_no_material_in_two_splits_across_independent_writers(tmp_path):
    cfg = stage.DataConfig(split_fractions=(0.5, 0.25, 0.25), split_seed=7)
    materials = [f"mp-{i}" for i in range(24)]
    for w in range(2):  # two writers, each with every orientation of some materials
        with stage.StoreWriter(tmp_path / f"w{w}", config_hash=CONFIG_HASH, data_cfg=cfg) as writer:
            for m in materials[w::2] + materials[:4]:
                for variant in range(2):
                    writer.put(make_sample(m, variant))
    stores = stage.open_stores(tmp_path)
    split_of_material: dict[str, set[str]] = {}
    for r in stores.readers:
        for entry in r.manifest["samples"]:
            split_of_material.setdefault(entry["material_id"], set()).add(entry["split"])
    assert all(len(splits) == 1 for splits in split_of_material.values())
    assert {s for splits in split_of_material.values() for s in splits} == {"train", "dev", "test"}
    for i in stores.indices("dev"):
        assert stores[i].meta.material_id in {m for m, s in split_of_material.items() if s == {"dev"}}


# ---------------------------------------------------------------------------------------------
# split by structure type (data.split_by: prototype)
# ---------------------------------------------------------------------------------------------

def _meta(material_id: str, prototype: str | None = None) -> SampleMeta:
    """The meta of a sample of ``material_id``: what a split is drawn from."""
    return SampleMeta(scan_shape=(1, 1), fov_A=(0.0, 0.0, 1.0, 1.0), material_id=material_id, prototype=prototype)


def _library_and_generated_ids() -> list[str]:
    from namsa import generator, library

    return library.list_ids() + generator.generated_ids(generator.GeneratorConfig(count=300, seed=5))


def test_prototype_split_holds_every_prototype_in_one_split_and_is_deterministic():
    from namsa.structure_type import prototype_label

    ids = _library_and_generated_ids()
    fractions = (0.6, 0.2, 0.2)
    splits = {m: stage.sample_split(_meta(m), fractions, 0, "prototype") for m in ids}
    per_prototype: dict[str, set[str]] = {}
    for m, split in splits.items():
        per_prototype.setdefault(prototype_label(m), set()).add(split)
    assert len(per_prototype) == 20                              # the library's 20 structure types
    assert all(len(s) == 1 for s in per_prototype.values())       # none in two splits
    assert {s for v in per_prototype.values() for s in v} == {"train", "dev", "test"}
    # the materials of one prototype spread over splits when split by material: the mode matters
    by_material = {m: stage.sample_split(_meta(m), fractions, 0) for m in ids}
    assert any(len({by_material[m] for m in ids if prototype_label(m) == p}) > 1 for p in per_prototype)
    assert splits == {m: stage.sample_split(_meta(m), fractions, 0, "prototype") for m in ids}


def test_material_split_is_unchanged_by_the_prototype_mode():
    ids = _library_and_generated_ids()
    # the default mode is split_of(material id): the study's assignment, byte for byte
    assert all(stage.sample_split(_meta(m, "x"), (0.9, 0.05, 0.05), 0)
               == stage.split_of(m, (0.9, 0.05, 0.05), 0) for m in ids)
    assert stage.DataConfig().split_by == "material"
    assert stage.split_of("NaCl-rocksalt", (0.9, 0.05, 0.05), 0) == "train"   # pinned: hash unchanged
    assert [stage.split_of(m, (0.5, 0.25, 0.25), 0) for m in ("Cr-bcc", "Al-fcc")] == ["dev", "test"]


def test_writer_splits_by_prototype_and_refuses_to_resume_with_another_mode(tmp_path):
    cfg = stage.DataConfig(split_fractions=(0.4, 0.3, 0.3), split_by="prototype")
    materials = ["NaCl-rocksalt", "MgO-rocksalt", "NaCl-rocksalt:K,Br:1.0731", "Si-diamond",
                 "C-diamond", "Ge-diamond:Sn:1.1500", "GaN-wurtzite", "ZnO-wurtzite"]
    with stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH, data_cfg=cfg) as writer:
        for m in materials:
            writer.put(make_sample(m))
    from namsa.structure_type import prototype_label

    entries = stage.open_stores(tmp_path).readers[0].manifest["samples"]
    per_prototype: dict[str, set[str]] = {}
    for entry in entries:
        per_prototype.setdefault(prototype_label(entry["material_id"]), set()).add(entry["split"])
    assert len(per_prototype) == 3 and all(len(s) == 1 for s in per_prototype.values())
    with pytest.raises(UserError, match="split_by"):
        stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH, data_cfg=stage.DataConfig(
            split_fractions=(0.4, 0.3, 0.3)))
