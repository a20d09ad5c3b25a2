"""models.train on the lead's tiny real data set: overfitting, outputs, and bad input."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import models
import stage
from models import ModelConfig, TrainConfig

DATA_CFG = stage.DataConfig(num_workers=0, pin_memory=False)


def tiny_cfg(**overrides):
    base = dict(batch_size=2, lr0=1e-3, eval_every=5, checkpoint_every=5, log_every=1, device="cpu",
                progress=False, tensorboard=False, seed=0, optimizer="adam", max_steps=10)
    base.update(overrides)
    return TrainConfig(**base)


def read_metrics(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_tiny_model_overfits_a_handful_of_real_samples(tiny_data_dir, tmp_path):
    cfg = tiny_cfg(max_steps=100, lr0=3e-3, max_train_samples=2, batch_size=2, eval_every=1000,
                   checkpoint_every=1000, weight_decay=0.0)
    result = models.train(ModelConfig(preset="tiny"), cfg, None, DATA_CFG, [tiny_data_dir], tmp_path / "run")
    losses = [float(r["train_loss"]) for r in read_metrics(result.metrics_csv)]
    assert len(losses) == 100
    first, last = losses[0], min(losses[-10:])
    assert last < first / 10, (first, last)
