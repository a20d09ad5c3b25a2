"""Checkpointed CUDA RNG: one state per rank, of the rank's own device (models.checkpoint).

A restarted job may see another number of GPUs; the state saved must not depend on it, and a
checkpoint of the old layout (one state per visible GPU) must still load. Without a GPU the CUDA
branch runs against `FakeCuda`, a few lines standing in for torch.cuda's generator calls (torch is
not our component); on a machine with CUDA those tests skip and the gpu-marked one runs instead.
"""
from __future__ import annotations

import json

import pytest
import torch

from models import checkpoint as ckpt

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="drives the CUDA branch through a fake")


class FakeCuda:
    """torch.cuda's generator calls over ``count`` devices, each state a distinct byte tensor."""

    def __init__(self, count: int, current: int = 0):
        self.states = [torch.full((16,), 10 + k, dtype=torch.uint8) for k in range(count)]
        self.current = current

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in ("is_available", "is_initialized"):
            monkeypatch.setattr(torch.cuda, name, lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.states))
        monkeypatch.setattr(torch.cuda, "get_rng_state", self.get_rng_state)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.set_rng_state)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in self.states])
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", self.set_rng_state_all)

    def _index(self, device: torch.device | int | str) -> int:
        index = torch.device(device).index if not isinstance(device, int) else device
        if index is None or index >= len(self.states):
            raise RuntimeError(f"invalid device ordinal {index} of {len(self.states)}")
        return index

    def get_rng_state(self, device: torch.device | int | str = "cuda") -> torch.Tensor:
        return self.states[self._index(device)].clone()

    def set_rng_state(self, state: torch.Tensor, device: torch.device | int | str = "cuda") -> None:
        self.states[self._index(device)] = state.clone()

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        for k, state in enumerate(states):
            self.set_rng_state(state, k)


def _json(state: dict) -> dict:
    return json.loads(json.dumps(state))


def test_cpu_state_round_trips_and_names_no_gpu():
    torch.manual_seed(3)
    state = _json(ckpt.rng_state(torch.device("cpu")))
    assert "cuda" not in state and "cuda_device" not in state
    expected = torch.rand(4)
    torch.manual_seed(8)
    ckpt.set_rng_state(state, torch.device("cpu"))
    assert torch.equal(torch.rand(4), expected)


@needs_no_cuda
def test_only_the_rank_device_generator_is_saved(monkeypatch):
    fake = FakeCuda(4)
    fake.install(monkeypatch)
    state = _json(ckpt.rng_state(torch.device("cuda", 2)))
    assert "cuda" not in state  # not one entry per visible GPU
    assert torch.equal(ckpt._unb64(state["cuda_device"]), fake.states[2])


@needs_no_cuda
def test_default_device_is_the_current_cuda_device(monkeypatch):
    fake = FakeCuda(3, current=1)
    fake.install(monkeypatch)
    assert torch.equal(ckpt._unb64(ckpt.rng_state()["cuda_device"]), fake.states[1])


@needs_no_cuda
def test_restart_on_fewer_gpus_restores_onto_the_rank_device(monkeypatch):
    before = FakeCuda(4)
    before.install(monkeypatch)
    before.states[3] = torch.arange(16, dtype=torch.uint8)
    state = _json(ckpt.rng_state(torch.device("cuda", 3)))
    after = FakeCuda(1)  # the restarted rank sees only its own GPU, now ordinal 0
    after.install(monkeypatch)
    ckpt.set_rng_state(state, torch.device("cuda", 0))
    assert torch.equal(after.states[0], torch.arange(16, dtype=torch.uint8))


@needs_no_cuda
def test_old_checkpoint_with_every_visible_gpu_loads(monkeypatch):
    old = FakeCuda(2)
    old.install(monkeypatch)
    state = _json(ckpt.rng_state(torch.device("cpu")))
    state["cuda"] = [ckpt._b64(s) for s in old.states]  # the layout written before per-device states
    fake = FakeCuda(4)
    fake.install(monkeypatch)
    ckpt.set_rng_state(state, torch.device("cuda", 1))
    assert torch.equal(fake.states[1], old.states[1])
    untouched = fake.states[3].clone()
    ckpt.set_rng_state(state, torch.device("cuda", 3))  # no entry for this ordinal: stream restarts
    assert torch.equal(fake.states[3], untouched)


@pytest.mark.gpu
def test_cuda_generator_of_the_training_device_round_trips():
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    state = _json(ckpt.rng_state(device))
    expected = torch.rand(4, device=device)
    torch.rand(100, device=device)
    ckpt.set_rng_state(state, device)
    assert torch.equal(torch.rand(4, device=device), expected)
