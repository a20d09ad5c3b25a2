"""Guards of the thread loader's pinned ring slots: a slot is refilled only after the GPU has
finished copying out of it.

A non-blocking host-to-device copy from pinned memory returns before the DMA engine has read the
buffer. `stage.threadloader.ThreadLoader` refills a slot ``depth`` batches later; without a guard,
that is safe only as long as the training step happens to synchronise with the device before then.
Here the consumer records a CUDA event on the copying stream right after it enqueues the copies of
a batch (`stage.dataset.batch_to_device` does), and the producer waits on that slot's event before
it writes into the slot again. On the CPU (no pinned ring, nothing asynchronous) the guard is a
no-op with the same interface.
"""
from __future__ import annotations

from typing import Protocol

import torch


class SlotGuard(Protocol):
    """What the ring needs of a guard: ``record`` after the copies out of the slot are enqueued,
    ``wait`` before the slot is overwritten."""

    def record(self, device: torch.device | str | None = None) -> None: ...

    def wait(self) -> None: ...


class NoGuard:
    """The CPU guard: copies out of a pageable slot are synchronous, there is nothing to wait on."""

    def record(self, device: torch.device | str | None = None) -> None:
        """Nothing to record: the copy has completed when it returns."""

    def wait(self) -> None:
        """Nothing to wait on."""


class CudaEventGuard:
    """A CUDA event per slot, recorded on the stream that copies out of it."""

    def __init__(self) -> None:
        self.event: torch.cuda.Event | None = None  # created on first use, on the copying device

    def record(self, device: torch.device | str | None = None) -> None:
        """Mark the point in ``device``'s current stream after the copies out of this slot."""
        device = torch.device(device) if device is not None else torch.device("cuda")
        if device.type != "cuda":
            return  # a copy to the CPU is synchronous
        with torch.cuda.device(device):
            if self.event is None:  # blocking: a waiting reader thread sleeps instead of spinning a core
                self.event = torch.cuda.Event(blocking=True)
            self.event.record(torch.cuda.current_stream(device))

    def wait(self) -> None:
        """Block the producer until the last recorded copy out of this slot has finished."""
        if self.event is not None:
            self.event.synchronize()


def slot_guard(pinned: bool) -> SlotGuard:
    """A fresh guard for one ring slot: CUDA events for a pinned (GPU-feeding) ring, else none."""
    return CudaEventGuard() if pinned else NoGuard()


__all__ = ["CudaEventGuard", "NoGuard", "SlotGuard", "slot_guard"]
