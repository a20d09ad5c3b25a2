"""data.light_oversample: light-material training samples drawn k times per epoch, each copy with its
own noise draw, on the shared tiny real data set (Si, MgO and Al are light; the rest are not)."""
from __future__ import annotations

import numpy as np
import pytest

import stage
import torch
from _train_helpers import one_thread, tiny_train_cfg  # noqa: F401
from models import ModelConfig
from models.distributed.launch import DistContext
from models.training.data import TrainingData
from namsa.errors import UserError
from namsa.kirkland import LIGHT_MAX_Z, atomic_number, is_light
from stage.config import DoseAugmentationConfig

NOISY = DoseAugmentationConfig(enabled=True, dose_range_e_per_A2=(1e3, 1e3), clean_fraction=0.0)


def _elements(ds: stage.SampleDataset, position: int) -> list[str]:
    reader, j = ds.stores.locate(ds.global_indices[position])
    return reader.meta(j).elements


def test_light_training_samples_appear_k_times_with_their_own_noise(tiny_data_dir):
    plain = stage.SampleDataset([tiny_data_dir], "train", None, dose_augmentation=NOISY)
    light = [g for k, g in enumerate(plain.global_indices) if is_light(_elements(plain, k))]
    assert light and len(light) < len(plain)  # the tiny data holds both classes in training
    ds = stage.SampleDataset([tiny_data_dir], "train", None, dose_augmentation=NOISY, light_oversample=3)
    assert len(ds) == len(plain) + 2 * len(light)
    assert sorted(ds.global_indices[len(plain):]) == sorted(2 * light)
    first = ds.global_indices.index(light[0])
    copies = [k for k, g in enumerate(ds.global_indices) if g == light[0]]
    assert [ds.copies[k] for k in copies] == [0, 1, 2]
    items = [ds[k] for k in copies]
    np.testing.assert_array_equal(items[0]["target"], items[1]["target"])  # the same sample ...
    assert not np.array_equal(items[0]["cbed"], items[1]["cbed"])          # ... with another noise draw
    np.testing.assert_array_equal(ds[first]["cbed"], plain[plain.global_indices.index(light[0])]["cbed"])
    np.testing.assert_array_equal(ds[copies[2]]["cbed"], items[2]["cbed"])  # reproducible


def test_other_splits_and_k_1_are_as_stored(tiny_data_dir):
    for split in ("dev", "test"):
        assert (stage.SampleDataset([tiny_data_dir], split, None, light_oversample=4).global_indices
                == stage.SampleDataset([tiny_data_dir], split, None).global_indices)
    plain = stage.SampleDataset([tiny_data_dir], "train", None)
    assert stage.SampleDataset([tiny_data_dir], "train", None, light_oversample=1).global_indices == plain.global_indices


def test_light_means_every_element_at_most_silicon():
    assert LIGHT_MAX_Z == atomic_number("Si") == 14
    assert is_light(["B", "N"]) and is_light(["Mg", "O"]) and not is_light(["Si", "P"]) and not is_light([])
    with pytest.raises(UserError, match="not an element symbol"):
        atomic_number("Xx")
    with pytest.raises(ValueError, match="light_oversample"):
        stage.DataConfig(light_oversample=0)


@pytest.mark.usefixtures("one_thread")
def test_training_reads_the_oversampled_split(tiny_data_dir, tmp_path):
    """The trainer passes data.light_oversample to its training dataset (and only to it)."""
    data_cfg = stage.DataConfig(light_oversample=3, num_workers=0)
    arch = ModelConfig(preset="tiny").architecture()
    data = TrainingData(ModelConfig(preset="tiny"), tiny_train_cfg(max_steps=1), arch, data_cfg, DistContext(),
                        torch.device("cpu"), [tiny_data_dir])
    plain = stage.SampleDataset([tiny_data_dir], "train", None)
    assert len(data.train_ds) > len(plain) and len(data.dev_ds) == len(stage.SampleDataset([tiny_data_dir], "dev", None))
