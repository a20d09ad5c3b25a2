"""Checkpoint format: safetensors + JSON round trip, RNG state, atomic writes, corruption, pickle refusal."""
from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from models import ModelConfig, TrainConfig, build_model
from models import checkpoint as ckpt
from models.optim import BlockOptimizer
from _train_helpers import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


def _model_and_optimizer():
    torch.manual_seed(0)
    model = build_model(ModelConfig(preset="tiny", in_channels=4))
    opt = BlockOptimizer(model.blocks(), TrainConfig(optimizer="larc_adam"))
    model(torch.randn(2, 4, 16, 16)).mean().backward()
    opt.step(1e-3)
    return model, opt


def _save(root: Path, step: int, model, opt, **state):
    return ckpt.save_checkpoint(root, step, model.state_dict(), opt.state_dict(), {"note": "test", **state})


def test_round_trip_of_weights_optimizer_and_state(tmp_path):
    model, opt = _model_and_optimizer()
    path = _save(tmp_path, 7, model, opt, position={"step": 7})
    assert path.name == "step-00000007"
    assert sorted(p.name for p in path.iterdir()) == sorted(ckpt.EXPECTED_FILES)
    weights, opt_state, state = ckpt.load_checkpoint(path)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert state["step"] == 7 and state["position"] == {"step": 7} and state["note"] == "test"
    torch.manual_seed(1)
    twin = build_model(ModelConfig(preset="tiny", in_channels=4))
    twin.load_state_dict(weights)
    twin_opt = BlockOptimizer(twin.blocks(), TrainConfig(optimizer="larc_adam"))
    twin_opt.load_state_dict(opt_state)
    a, b = opt.state_dict(), twin_opt.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for idx, entry in a["state"].items():
        assert all(torch.equal(v, b["state"][idx][k]) for k, v in entry.items())


def test_rng_states_round_trip_through_json():
    import json

    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    state = json.loads(json.dumps(ckpt.rng_state()))
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    ckpt.set_rng_state(state)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], got[0]) and np.array_equal(expected[1], got[1]) and expected[2] == got[2]


def test_interrupted_write_leaves_only_complete_checkpoints(tmp_path):
    model, opt = _model_and_optimizer()
    _save(tmp_path, 2, model, opt)
    (tmp_path / ".step-00000004.tmp-999").mkdir()  # what a kill during a write leaves behind
    (tmp_path / ".step-00000004.tmp-999" / "model.safetensors").write_bytes(b"partial")
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000002"]
    assert ckpt.load_latest(tmp_path)[0].name == "step-00000002"
    ckpt.prune_checkpoints(tmp_path, keep_last=5)
    assert not (tmp_path / ".step-00000004.tmp-999").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(p.read_bytes()[:100]), "truncated"),
    (lambda p: p.write_bytes(p.read_bytes()[:-1] + bytes([p.read_bytes()[-1] ^ 1])), "digest"),
    (lambda p: p.unlink(), "missing"),
])
def test_corrupt_checkpoint_is_detected_and_the_previous_one_used(tmp_path, damage, message):
    model, opt = _model_and_optimizer()
    _save(tmp_path, 2, model, opt)
    newest = _save(tmp_path, 4, model, opt)
    damage(newest / ckpt.MODEL_FILE)
    with pytest.raises(ckpt.CorruptCheckpointError, match=message):
        ckpt.load_checkpoint(newest)
    messages: list[str] = []
    path, *_ = ckpt.load_latest(tmp_path, warn=messages.append)
    assert path.name == "step-00000002"
    assert "falling back to step-00000002" in messages[0]


def test_truncated_state_json_is_corrupt(tmp_path):
    model, opt = _model_and_optimizer()
    path = _save(tmp_path, 2, model, opt)
    text = (path / ckpt.STATE_FILE).read_text()
    (path / ckpt.STATE_FILE).write_text(text[: len(text) // 2])
    with pytest.raises(ckpt.CorruptCheckpointError, match="not valid JSON"):
        ckpt.load_checkpoint(path)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert ckpt.load_latest(tmp_path) is None


@pytest.mark.parametrize("how", ["replace_weights", "extra_file"])
def test_pickled_payload_is_refused(tmp_path, how):
    model, opt = _model_and_optimizer()
    path = _save(tmp_path, 2, model, opt)
    if how == "replace_weights":
        torch.save(model.state_dict(), path / ckpt.MODEL_FILE)
    else:
        import pickle

        (path / "extra.bin").write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(ckpt.PickledCheckpointError, match="pickled payload"):
        ckpt.load_checkpoint(path)
    with pytest.raises(ckpt.PickledCheckpointError):  # not silently skipped as merely corrupt
        ckpt.load_latest(tmp_path)


def test_prune_keeps_last_k_and_the_best(tmp_path):
    model, opt = _model_and_optimizer()
    for step in (1, 2, 3, 4, 5):
        _save(tmp_path, step, model, opt)
    ckpt.prune_checkpoints(tmp_path, keep_last=2, keep={"step-00000002"})
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000002", "step-00000004", "step-00000005"]


def test_rewriting_a_step_replaces_it_whole(tmp_path):
    model, opt = _model_and_optimizer()
    _save(tmp_path, 3, model, opt, note="first")
    _save(tmp_path, 3, model, opt, note="second")
    assert ckpt.read_state(tmp_path / "step-00000003")["note"] == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000003"]


def test_safetensors_header_that_starts_like_a_pickle_marker_is_not_refused(tmp_path):
    from safetensors.torch import save_file

    # find a tensor name whose header is 640 bytes: its length field starts 0x80 0x02, like pickle protocol 2
    path = tmp_path / "model.safetensors"
    for width in range(1, 2000):
        save_file({"w" * width: torch.zeros(1)}, str(path))
        if path.read_bytes()[:2] == bytes([0x80, 0x02]):
            break
    else:
        pytest.skip("no header of that length reachable")
    assert ckpt.looks_pickled(path) and ckpt.has_safetensors_header(path)
    ckpt.refuse_pickles(tmp_path)  # a genuine safetensors file passes


def _rewrite_step_3_killed_between_renames(tmp_path, monkeypatch, *, exchange: bool) -> None:
    """Write step 3 twice; the second publish dies right after the swap's first OS call (the
    exchange, or with ``exchange=False`` the rename that sets the old checkpoint aside)."""
    import os

    from stage import dir_swap

    model, opt = _model_and_optimizer()
    _save(tmp_path, 3, model, opt, note="old")
    real_exchange, real_rename = dir_swap.exchange, os.rename
    calls = []

    def killed_after_first(real):
        def call(*args, **kwargs):
            if calls:
                raise KeyboardInterrupt("killed between the swap's steps")
            calls.append(args)
            return real(*args, **kwargs)
        return call

    if exchange:
        monkeypatch.setattr(dir_swap, "exchange", killed_after_first(real_exchange))
        monkeypatch.setattr(dir_swap, "remove", killed_after_first(lambda path: None))
    else:
        monkeypatch.setattr(dir_swap, "exchange", lambda a, b: False)   # a file system without renameat2
        monkeypatch.setattr(os, "rename", killed_after_first(real_rename))
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 3, model, opt, note="new")
    monkeypatch.undo()


def test_a_kill_after_the_exchange_leaves_the_new_checkpoint(tmp_path, monkeypatch):
    _rewrite_step_3_killed_between_renames(tmp_path, monkeypatch, exchange=True)
    assert ckpt.load_checkpoint(tmp_path / "step-00000003")[2]["note"] == "new"
    ckpt.prune_checkpoints(tmp_path, keep_last=5)   # the old one, left at the temporary name, is removed
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000003"]


def test_a_kill_between_the_fallback_renames_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    """Without renameat2 the old checkpoint is set aside first; a kill before the second rename
    leaves it there, and the next writer (or resume) puts it back, whole and loadable."""
    _rewrite_step_3_killed_between_renames(tmp_path, monkeypatch, exchange=False)
    assert ckpt.list_checkpoints(tmp_path) == []
    ckpt.recover_checkpoints(tmp_path)
    assert ckpt.load_checkpoint(tmp_path / "step-00000003")[2]["note"] == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000003"]
