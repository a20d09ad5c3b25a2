"""A simulation task gives cupy's cached GPU memory back when it ends (workflow.apps.simulate_app),
so training that starts next on the same GPUs finds it free; a no-op without cupy.

cupy is not our component: a small module standing in for it records the pool calls. The task
itself (simulate_app's function, the simulation, the store) is the real one.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

import stage
from workflow import data_runners
from workflow.apps import simulate_app
from workflow.config import load_config

MICRO = str(Path(__file__).resolve().parents[1] / "configs" / "micro.yaml")


class FakePool:
    def __init__(self, name: str, calls: list, data_dir: Path):
        self.name, self.calls, self.data_dir = name, calls, data_dir

    def free_all_blocks(self) -> None:
        # what the task had stored when the pool was released: the release must come at its end
        self.calls.append((self.name, len(data_runners.stored_ids(self.data_dir)) if self.data_dir.exists() else 0))


def _fake_cupy(monkeypatch, data_dir: Path) -> list:
    calls: list = []
    cupy = types.ModuleType("cupy")
    cupy.ndarray = type("ndarray", (), {})  # what array-namespace checks look up on an imported cupy
    cupy.get_default_memory_pool = lambda: FakePool("device", calls, data_dir)
    cupy.get_default_pinned_memory_pool = lambda: FakePool("pinned", calls, data_dir)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return calls


def _task(cfg, store_dir: Path, n: int, progress: Path) -> dict:
    """simulate_app's own function (what a Parsl worker runs), called in this process."""
    planned = data_runners.plan(cfg)
    keys = [data_runners.spec_key(s) for s in planned.specs[:n]]
    return simulate_app.func(cfg.simulation.model_dump(mode="json"), cfg.data.model_dump(mode="json"),
                             str(store_dir), keys, dict(planned.sources), str(progress))


def test_the_pools_are_released_when_the_simulation_task_ends(tmp_path, monkeypatch):
    cfg = load_config(MICRO, [])
    data_dir = tmp_path / "data"
    calls = _fake_cupy(monkeypatch, data_dir)
    summary = _task(cfg, data_dir / "store-000", 1, tmp_path / "progress.json")
    assert summary["written"] == 1, summary["failed"]
    assert calls == [("device", 1), ("pinned", 1)]  # once, after the sample was stored


def test_the_pools_are_released_when_the_task_fails(tmp_path, monkeypatch):
    cfg = load_config(MICRO, [])
    blocker = tmp_path / "file"
    blocker.write_text("a regular file: no store can be made below it (NotADirectoryError)")
    calls = _fake_cupy(monkeypatch, tmp_path / "none")
    out = _task(cfg, blocker / "store-000", 1, tmp_path / "progress.json")  # the store cannot be made: the task fails
    with pytest.raises(stage.StoreError, match="Not a directory"):  # Parsl's wrapper holds the exception
        out.reraise()
    assert [name for name, _ in calls] == ["device", "pinned"]


def test_release_without_cupy_imports_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    data_runners.release_device_pools()
    assert "cupy" not in sys.modules
