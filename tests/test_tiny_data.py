"""The shared tiny data set that models, evaluation and workflow tests train on is what it claims."""
from __future__ import annotations

import stage

from conftest import TINY_MATERIALS


def test_tiny_data_dir_has_every_split_and_material(tiny_data_dir):
    stores = stage.find_stores(tiny_data_dir)
    assert len(stores) == 1
    store = stage.open_store(stores[0])
    splits = {s: len(store.ids(split=s)) for s in ("train", "dev", "test")}
    assert all(n > 0 for n in splits.values()), splits
    materials = {store[i].meta.material_id for i in range(len(store))}
    assert materials == set(TINY_MATERIALS)
    sample = store[0]
    assert sample.cbed.shape == (64, 16, 16) and sample.potential.shape == (16, 16)
