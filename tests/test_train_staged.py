"""Training from node-local staged shards (``data.node_local_dir``): each rank stages its own
shard of the shared data, reads only that, and every rank runs the same number of steps."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

import models
import stage
from _train_helpers import DATA_CFG, one_thread, tiny_train_cfg  # noqa: F401
from models.distributed.spawn import run_local
from models.training import TrainingError
from namsa.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")


def _staged_cfg(local: Path, **overrides) -> stage.DataConfig:
    return DATA_CFG.model_copy(update={"node_local_dir": str(local), **overrides})


def _train(data_dir: Path, out: Path, data_cfg: stage.DataConfig, **train) -> models.TrainResult:
    return models.train(models.ModelConfig(preset="tiny"), tiny_train_cfg(**train), None, data_cfg, [data_dir], out,
                        resume=False)


def test_one_rank_trains_identically_from_its_staged_copy(tiny_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("NODE_SCRATCH", str(tmp_path / "scratch"))
    staged = _train(tiny_data_dir, tmp_path / "staged", _staged_cfg(Path("$NODE_SCRATCH")), max_steps=6)
    plain = _train(tiny_data_dir, tmp_path / "plain", DATA_CFG, max_steps=6)
    a, b = (load_file(str(r.best_checkpoint / "model.safetensors")) for r in (staged, plain))
    assert all((a[k] == b[k]).all() for k in a), "the staged copy must feed exactly the same batches"
    (copy,) = (tmp_path / "scratch").glob("namsa-staged-*/data0/store-0")
    again = stage.stage_store(tiny_data_dir, copy.parent, progress=False)  # what a restarted job does
    assert again.copied == 0 and again.skipped == len(stage.open_store(tiny_data_dir / "store-0"))


def test_unset_variable_in_the_node_local_dir_is_a_clear_error(tiny_data_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("NAMSA_UNSET_SCRATCH", raising=False)
    with pytest.raises(UserError, match="NAMSA_UNSET_SCRATCH.*not set"):
        _train(tiny_data_dir, tmp_path / "run", _staged_cfg(Path("$NAMSA_UNSET_SCRATCH/x")), max_steps=2)
    assert not list(tmp_path.rglob("*NAMSA_UNSET_SCRATCH*"))


def test_shared_shard_mode_cannot_read_node_local_data(tiny_data_dir, tmp_path):
    with pytest.raises(TrainingError, match="shard_mode: unique or unset node_local_dir"):
        _train(tiny_data_dir, tmp_path / "run", _staged_cfg(tmp_path / "local", shard_mode="shared"), max_steps=2)


def _rank_train(rank: int, data_dir: str, out: str, local: str, batch_size: int, cap: int | None = None) -> dict:
    import torch

    from _train_helpers import DATA_CFG, tiny_train_cfg
    from models.distributed import DistributedConfig

    torch.set_num_threads(1)
    data_cfg = DATA_CFG.model_copy(update={"node_local_dir": local})
    try:
        result = models.train(models.ModelConfig(preset="tiny"),
                              tiny_train_cfg(max_steps=None, epochs=2, batch_size=batch_size, eval_every=2,
                                             max_train_samples=cap),
                              DistributedConfig(engine="ddp", timeout_s=60), data_cfg, [data_dir], out, resume=False)
    except TrainingError as exc:
        return {"error": str(exc)}
    return {"steps": result.steps, "dev": result.final_dev_loss}


@pytest.mark.distributed
def test_two_ranks_train_on_their_own_unequal_shards(tiny_data_dir, tmp_path):
    local = tmp_path / "local"
    results = run_local(_rank_train, 3, str(tiny_data_dir), str(tmp_path / "run"), str(local), 1, timeout_s=300)
    assert all(status == "ok" and "error" not in r for status, r in results.values())
    assert results[0][1] == results[1][1] == results[2][1]  # same steps; dev loss reduced over ranks

    shards = sorted(local.glob("namsa-staged-*/data0/shard-*"))
    assert [p.name for p in shards] == [f"shard-0000{r}-of-00003" for r in range(3)]
    source = stage.open_store(tiny_data_dir / "store-0")
    with stage.open_stores(shards) as staged:
        assert sorted(staged.ids()) == sorted(source.ids())  # disjoint shards covering the data
    per_rank = [len(stage.SampleDataset(p, "train", None)) for p in shards]
    assert len(set(per_rank)) == 2, per_rank  # unequal: without agreeing on a count the ranks would hang
    assert results[0][1]["steps"] == 2 * min(per_rank)  # 2 epochs of the smallest shard, batch 1

    card = json.loads((tmp_path / "run" / "model" / "model_card.json").read_text())
    assert card["data"]["train_samples"] == len(stage.SampleDataset(tiny_data_dir, "train", None)) == sum(per_rank)


@pytest.mark.distributed
def test_shards_too_small_for_a_batch_fail_on_every_rank(tiny_data_dir, tmp_path):
    results = run_local(_rank_train, 2, str(tiny_data_dir), str(tmp_path / "run"), str(tmp_path / "local"), 64,
                        timeout_s=240)
    for rank in (0, 1):
        message = results[rank][1]["error"]
        assert "no full batch of 64" in message and "fewer ranks" in message and "\n" not in message


@pytest.mark.distributed
def test_max_train_samples_stays_a_global_cap_on_staged_shards(tiny_data_dir, tmp_path):
    results = run_local(_rank_train, 2, str(tiny_data_dir), str(tmp_path / "run"), str(tmp_path / "local"), 1, 4,
                        timeout_s=240)
    assert results[0][1] == results[1][1] and results[0][1]["steps"] == 2 * 2  # 2 epochs of 4 / 2 ranks
    card = json.loads((tmp_path / "run" / "model" / "model_card.json").read_text())
    assert card["data"]["train_samples"] == 4
