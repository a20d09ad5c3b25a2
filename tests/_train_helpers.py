"""Helpers shared by the models training tests (test_train*.py, test_checkpoint.py, test_reconstructor.py)."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch

import stage
from models import TrainConfig

#: the loader without worker processes: tests stay single-process and fast.
DATA_CFG = stage.DataConfig(num_workers=0, pin_memory=False)


def tiny_train_cfg(**overrides: Any) -> TrainConfig:
    """A TrainConfig for the tiny preset on CPU, quiet, with per-step logging."""
    base = dict(batch_size=2, lr0=1e-3, eval_every=5, checkpoint_every=5, log_every=1, device="cpu",
                progress=False, tensorboard=False, seed=0, max_steps=10)
    base.update(overrides)
    return TrainConfig(**base)


def read_metrics(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture
def one_thread():
    """One intra-op thread: the tiny model gains nothing from more, a shared machine's
    oversubscribed OpenMP threads slow it down many times over, and runs compared bit for bit
    must use the same count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
