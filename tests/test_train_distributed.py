"""models.train on 2 real gloo ranks (127.0.0.1): per-block grouped reduction, rank-0 checkpoints
holding every rank's RNG, the LR scaled by the world size, and a 2-rank resume."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.distributed.spawn import run_local

pytestmark = pytest.mark.distributed


def rank_train(rank: int, data_dir: str, out: str, max_steps: int, resume: bool) -> dict:
    import models
    from _train_helpers import DATA_CFG, tiny_train_cfg
    from models.distributed import DistributedConfig

    cfg = tiny_train_cfg(max_steps=max_steps, checkpoint_every=3, eval_every=3, warmup_steps=2, lr0=1e-3)
    result = models.train(models.ModelConfig(preset="tiny", dropout=0.1), cfg, DistributedConfig(engine="grouped"),
                          DATA_CFG, [data_dir], out, resume=resume)
    return {"steps": result.steps, "dev": result.final_dev_loss, "best": str(result.best_checkpoint)}


def test_two_rank_training_and_resume(tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    first = run_local(rank_train, 2, str(tiny_data_dir), str(out), 6, False, timeout_s=240)
    (s0, r0), (s1, r1) = first[0], first[1]
    assert s0 == s1 == "ok" and r0 == r1 and r0["steps"] == 6  # dev loss is reduced over ranks: equal
    state = json.loads((out / "checkpoints" / "step-00000006" / "state.json").read_text())
    assert state["world_size"] == 2 and len(state["rng"]) == 2 and state["rng"][0] != state["rng"][1]
    with open(out / "metrics.csv") as fh:
        rows = [line.split(",") for line in fh.read().splitlines()]
    lr = [float(r[rows[0].index("lr")]) for r in rows[1:]]
    assert lr[0] == pytest.approx(1e-3) and lr[-1] == pytest.approx(2e-3)  # warm-up to N * lr0

    second = run_local(rank_train, 2, str(tiny_data_dir), str(out), 8, True, timeout_s=240)
    assert [second[r][1]["steps"] for r in (0, 1)] == [8, 8]
    card = json.loads((Path(out) / "model" / "model_card.json").read_text())
    assert card["training"]["world_size"] == 2 and card["training"]["samples_seen"] == 8 * 2 * 2
    assert card["training"]["gradient_engine"] == "grouped"   # the card says how gradients were reduced


def rank_train_until_wall(rank: int, data_dir: str, out: str, max_steps: int) -> dict:
    import models
    from _train_helpers import DATA_CFG, tiny_train_cfg
    from models.distributed import DistributedConfig

    cfg = tiny_train_cfg(max_steps=max_steps, max_wall_s=0.5 + 0.5 * rank, eval_every=1000, checkpoint_every=1000)
    result = models.train(models.ModelConfig(preset="tiny"), cfg, DistributedConfig(engine="grouped"), DATA_CFG,
                          [data_dir], out)
    return {"steps": result.steps, "stopped_by": result.stopped_by, "dev": result.final_dev_loss}


def test_wall_clock_limit_stops_every_rank_at_the_same_step(tiny_data_dir, tmp_path):
    """Rank 1's limit is twice rank 0's: the ranks agree on the step (the first rank past its
    limit stops both), evaluate and export there."""
    out = tmp_path / "run"
    max_steps = 5000
    results = run_local(rank_train_until_wall, 2, str(tiny_data_dir), str(out), max_steps, timeout_s=240)
    (s0, r0), (s1, r1) = results[0], results[1]
    assert s0 == s1 == "ok" and r0 == r1
    assert 0 < r0["steps"] < max_steps and r0["stopped_by"] == "max_wall_s"
    card = json.loads((out / "model" / "model_card.json").read_text())
    assert card["training"]["stopped_by"] == "max_wall_s" and card["training"]["steps"] == r0["steps"]
