"""Splits by material: deterministic, no leakage, fractions respected."""
from __future__ import annotations

from collections import Counter

import pytest

import stage
from namsa.errors import UserError
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
        assert stores[i].meta["material_id"] in {m for m, s in split_of_material.items() if s == {"dev"}}
