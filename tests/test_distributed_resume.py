"""Kill one rank of a real 2-rank training run (models.train with the bitvector engine): the
other fails with a clear error within the timeout, and ``resume=True`` continues from the last
checkpoint to the end."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from models.distributed.spawn import run_local

pytestmark = pytest.mark.distributed

MAX_STEPS = 8


def _train(rank: int, data_dir: str, out: str, resume: bool, crash_after_ckpt: bool) -> dict:
    import stage
    from models import ModelConfig, TrainConfig, train
    from models.distributed import DistributedConfig

    if crash_after_ckpt and rank == 1:
        ckpts = Path(out, "checkpoints")

        def crash_once_checkpointed() -> None:
            # A node dies mid-run: as soon as the step-4 checkpoint exists, rank 1 vanishes.
            while not any(p.name.startswith("step-00000004") for p in ckpts.glob("step-*")):
                time.sleep(0.01)
            os._exit(9)

        threading.Thread(target=crash_once_checkpointed, daemon=True).start()
    result = train(ModelConfig(preset="tiny"),
                   TrainConfig(max_steps=MAX_STEPS, checkpoint_every=2, eval_every=100, batch_size=1, device="cpu",
                               progress=False, tensorboard=False, log_every=100),
                   DistributedConfig(engine="bitvector", timeout_s=30), stage.DataConfig(num_workers=0), [data_dir], out,
                   resume=resume)
    return {"steps": result.steps}


def test_killed_rank_then_resume(tiny_data_dir, tmp_path):
    out = str(tmp_path / "run")
    first = run_local(_train, 2, str(tiny_data_dir), out, False, True, timeout_s=240, allow_failures=True)
    assert first[1] == ("exit", 9)
    status, text = first[0]
    assert status == "error", first[0]
    first_line = [line for line in text.splitlines() if line.strip()][0]
    # One clear line naming the failure (not a hang, not a bare gloo traceback).
    assert first_line.startswith("PeerFailureError: rank 0:") and "--resume" in first_line, first_line
    saved = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    assert saved and int(saved[-1].split("-")[1]) < MAX_STEPS
    last = tmp_path / "run" / "checkpoints" / saved[-1]
    stamps = {p.name: p.stat().st_mtime_ns for p in last.iterdir()}
    second = run_local(_train, 2, str(tiny_data_dir), out, True, False, timeout_s=240)
    assert all(value["steps"] == MAX_STEPS for _, value in second.values())
    saved = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    assert int(saved[-1].split("-")[1]) == MAX_STEPS
    # It continued from that checkpoint (left untouched) rather than retraining from step 0.
    assert {p.name: p.stat().st_mtime_ns for p in last.iterdir()} == stamps
