"""The thread loader's ring slots are refilled only after the copy out of them has been waited on
(stage.ringguard): the consumer records a slot's guard in `batch_to_device`, the reader waits on it
before overwriting the slot. Without a GPU the ordering is checked through the guard interface
(`OrderGuard`); the CUDA event guard itself runs in the gpu-marked test."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import stage
from stage.dataset import batch_to_device
from stage.ringguard import CudaEventGuard, NoGuard, slot_guard
from stage.threadloader import ThreadLoader
from stage_helpers import write_stores

CFG = stage.DataConfig(split_fractions=(0.6, 0.2, 0.2), num_workers=2, prefetch_factor=2, loader="threads")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    write_stores(root, 1, 6, CFG)
    return root


class OrderGuard:
    """A slot guard that remembers whether a recorded copy is still unwaited (a real event's
    'the DMA may still be reading this slot')."""

    def __init__(self) -> None:
        self.unwaited = False
        self.records = self.waits = 0
        self.lock = threading.Lock()

    def record(self, device=None) -> None:
        with self.lock:
            self.unwaited, self.records = True, self.records + 1

    def wait(self) -> None:
        with self.lock:
            self.unwaited, self.waits = False, self.waits + 1


def _loader(data_dir, threads: int) -> tuple[ThreadLoader, list[str]]:
    """A ThreadLoader over OrderGuards whose dataset reports every write into a slot that still
    has an unwaited copy out of it."""
    ds = stage.SampleDataset(data_dir, None, None)
    sampler = stage.make_loader(ds, CFG, 1, shuffle=False).batch_sampler
    loader = ThreadLoader(ds, sampler, threads=threads, prefetch=2, pin_memory=False, guard_factory=OrderGuard)
    violations: list[str] = []
    read_into = ds.read_into

    def watched_read_into(idx, cbed, target):
        slot = next(k for k, (c, _) in enumerate(loader.ring) if np.shares_memory(c.numpy(), cbed))
        if loader.guards[slot].unwaited:
            violations.append(f"sample {idx} written into slot {slot} before its copy was waited on")
        read_into(idx, cbed, target)

    ds.read_into = watched_read_into  # observes the real read; the loader under test is unchanged
    return loader, violations


@pytest.mark.parametrize("threads", [0, 2])
def test_a_slot_is_not_refilled_before_its_copy_is_waited_on(data_dir, threads):
    loader, violations = _loader(data_dir, threads)
    batches = 0
    for _ in range(2):  # two epochs over a ring of 4 slots: every slot is refilled several times
        for batch in loader:
            batch_to_device(batch, "cpu")
            batches += 1
    assert batches > 2 * loader.depth
    assert violations == []
    assert sum(g.records for g in loader.guards) == batches  # batch_to_device recorded every batch
    assert sum(g.waits for g in loader.guards) >= batches - loader.depth
    loader.close()


def test_the_batch_carries_its_slot_guard_and_keeps_the_collate_keys(data_dir):
    loader, _ = _loader(data_dir, 2)
    batch = next(iter(loader))
    assert batch.ring_guard is loader.guards[0]
    assert set(batch) == {"cbed", "target", "index"}
    loader.close()


def test_cpu_guard_is_a_no_op_with_the_event_interface():
    assert isinstance(slot_guard(False), NoGuard) and isinstance(slot_guard(True), CudaEventGuard)
    for guard in (NoGuard(), CudaEventGuard()):
        guard.wait()  # nothing recorded yet: returns at once
        guard.record("cpu")  # a copy to the CPU is synchronous: nothing to record
        guard.wait()
    assert CudaEventGuard().event is None


@pytest.mark.gpu
def test_pinned_ring_records_cuda_events_and_delivers_the_same_batches(data_dir):
    ds = stage.SampleDataset(data_dir, None, None)
    loader = stage.make_loader(ds, CFG.model_copy(update={"pin_memory": True}), 1, shuffle=False)
    assert isinstance(loader, ThreadLoader) and loader.pin_memory
    for batch in loader:
        on_gpu = batch_to_device(batch, "cuda")
        want = ds[int(batch["index"][0])]["cbed"]
        torch.testing.assert_close(on_gpu["cbed"][0].cpu(), want)
    assert all(isinstance(g, CudaEventGuard) and g.event is not None for g in loader.guards)
    loader.close()
