"""Issue 32 (C): every config seed is 0 <= seed < 2**63, and the largest one really trains.

torch's generators take seeds below 2**64 only; the training loop and the sharded sampler derive
their generator seeds as ``seed * 1_000_003 + ...``, which must wrap into that range rather than
overflow an hour into a run.
"""
from __future__ import annotations

import pytest

import models
from _train_helpers import DATA_CFG, one_thread, tiny_train_cfg  # noqa: F401
from models import ModelConfig
from namsa.random_streams import MAX_SEED
from stage.dataset import SampleDataset
from stage.sampler import ShardedBatchSampler

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_sampler_shuffles_with_the_largest_seed(tiny_data_dir):
    dataset = SampleDataset([tiny_data_dir], None, None)
    sampler = ShardedBatchSampler(dataset, batch_size=2, seed=MAX_SEED)
    order = sampler.rank_indices()
    assert order and len(set(order)) == len(order)


def test_training_runs_with_the_largest_seed(tiny_data_dir, tmp_path):
    result = models.train(ModelConfig(preset="tiny"), tiny_train_cfg(max_steps=2, eval_every=100,
                                                                      checkpoint_every=100, seed=MAX_SEED),
                          None, DATA_CFG, [tiny_data_dir], tmp_path / "run")
    assert result.model_dir
