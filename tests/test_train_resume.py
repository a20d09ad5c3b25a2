"""kill -9 in the middle of training, --resume, and compare with an uninterrupted run (CPU: bit-identical)."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import models
import stage
from _train_helpers import one_thread  # noqa: F401

TOTAL_STEPS = 48
KILL_AFTER = "step-00000012"

RUNNER = """
import json, sys
import torch
import models, stage
torch.set_num_threads(1)
spec = json.loads(sys.argv[1])
models.train(models.ModelConfig(**spec["model"]), models.TrainConfig(**spec["train"]), None,
             stage.DataConfig(num_workers=0, pin_memory=False), [spec["data"]], spec["out"], resume=spec["resume"])
"""


pytestmark = pytest.mark.usefixtures("one_thread")


def _spec(data_dir: Path, out: Path, resume: bool) -> dict:
    # dropout on and LARC-Adam with the L2 term: every source of state and randomness is exercised
    return {"model": {"preset": "tiny", "dropout": 0.2},
            "train": {"max_steps": TOTAL_STEPS, "batch_size": 2, "lr0": 1e-3, "warmup_steps": 10,
                      "decay_every": 50, "eval_every": 6, "checkpoint_every": 4, "keep_last": 2, "log_every": 1,
                      "device": "cpu", "progress": False, "tensorboard": False, "seed": 3},
            "data": str(data_dir), "out": str(out), "resume": resume}


def _train_in_process(spec: dict) -> models.TrainResult:
    return models.train(models.ModelConfig(**spec["model"]), models.TrainConfig(**spec["train"]), None,
                        stage.DataConfig(num_workers=0, pin_memory=False), [spec["data"]], spec["out"],
                        resume=spec["resume"])


def _losses(csv_path: Path) -> list[tuple[str, str]]:
    with open(csv_path, newline="") as fh:
        return [(r["step"], r["train_loss"]) for r in csv.DictReader(fh)]


def test_kill_9_and_resume_is_bit_identical(tiny_data_dir, tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, json.dumps(_spec(tiny_data_dir, killed, False))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not (killed / "checkpoints" / KILL_AFTER).exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.005)
    time.sleep(0.02)  # land the kill somewhere inside the following steps, not on a checkpoint boundary
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    steps_done = sorted(p.name for p in (killed / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert steps_done and steps_done[-1] < f"step-{TOTAL_STEPS:08d}", "the kill must land mid-run"

    resumed = _train_in_process(_spec(tiny_data_dir, killed, True))
    reference = _train_in_process(_spec(tiny_data_dir, tmp_path / "reference", False))

    assert resumed.steps == reference.steps == TOTAL_STEPS
    final = f"step-{TOTAL_STEPS:08d}"
    a = load_file(str(killed / "checkpoints" / final / "model.safetensors"))
    b = load_file(str(tmp_path / "reference" / "checkpoints" / final / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run"
    oa = load_file(str(killed / "checkpoints" / final / "optimizer.safetensors"))
    ob = load_file(str(tmp_path / "reference" / "checkpoints" / final / "optimizer.safetensors"))
    assert all(torch.equal(oa[k], ob[k]) for k in oa)
    # the metric log was rewound to the checkpoint and continued: identical, step for step
    assert _losses(resumed.metrics_csv) == _losses(reference.metrics_csv)
    assert resumed.final_dev_loss == reference.final_dev_loss
