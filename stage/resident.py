"""A split held whole in the training device's memory (``data.resident``): read once, gathered by index.

The LMDB store stays the staging layer: a `ResidentSet` reads the samples of one split of a
`SampleDataset` (raw: the patterns as stored, float16 in a study store, and the targets
standardised, exactly as the streaming loader delivers them) once through the dataset's own
`read_into` (every record's checksum verified), into one device tensor ``cbed`` (R, S, P, P) in
the stored dtype and one ``target`` (R, C, T, T) float32, R the distinct samples it holds. A
training step then takes its batch from there by index (`stage.resident_batch`), with no host
work. Before anything is read, `check_fits` refuses, in one line, splits that do not fit the
device's free memory with a quarter of it kept for the model (`namsa.errors.MemoryShortage`).
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import torch

from namsa.errors import MemoryShortage

from .dataset import SampleDataset

#: of the device's free memory, the share a resident set may not take: the model, its activations and
#: the optimiser's state live there too (the study's 3.4 M-parameter model at batch 64 needs a few GiB)
KEEP_FRACTION = 0.25
#: float32 copies of one batch the step makes on the device (the gather's, the noise's Poisson rates,
#: counts and result, the transform's; with data.camera_augmentation its spectrum, read noise and
#: result, stage.camera_augmentation), counted with the resident data
BATCH_COPIES = 9
#: samples a reader thread copies to a cuda device at a time (through one pinned host buffer)
CHUNK = 16
GIB = float(2 ** 30)


class ResidentSet:
    """The samples of ``positions`` (dataset positions) of a raw ``dataset``, once loaded (`load`):
    ``cbed`` (R, S, P, P) as stored, ``target`` (R, C, T, T) float32 standardised, and ``row_of``
    (len(dataset),) int64 giving each position's row (an oversampled copy shares its sample's row;
    -1: not held). ``storage_scale``: the factor the stored patterns carry (`stage.transforms`)."""

    def __init__(self, dataset: SampleDataset, positions: Sequence[int]):
        if not dataset.raw_cbed:
            raise ValueError("a ResidentSet holds the patterns as stored: build its SampleDataset with raw_cbed=True")
        self.dataset = dataset
        self.storage_scale = dataset.storage_scale
        row_of = np.full(len(dataset), -1, np.int64)
        rows: dict[int, int] = {}      # global store index -> row
        self.sources: list[int] = []   # per row, the position it is read from
        for k in sorted(set(int(p) for p in positions)):
            g = dataset.global_indices[k]
            if g not in rows:
                rows[g] = len(self.sources)
                self.sources.append(k)
            row_of[k] = rows[g]
        self.row_of_host = row_of
        self.cbed: torch.Tensor | None = None
        self.target: torch.Tensor | None = None
        self.row_of: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.sources)

    @property
    def sample_bytes(self) -> int:
        """Bytes one sample takes held: its stack as stored and its float32 targets."""
        ds = self.dataset
        return int(np.prod(ds.stack_shape)) * ds.cbed_dtype.itemsize + int(np.prod(ds.target_shape)) * 4

    @property
    def nbytes(self) -> int:
        """Bytes the whole set takes held (rows times `sample_bytes`)."""
        return len(self) * self.sample_bytes

    def batch_bytes(self, batch_size: int) -> int:
        """Bytes of the float32 working copies one batch of ``batch_size`` makes on the device."""
        return BATCH_COPIES * batch_size * int(np.prod(self.dataset.stack_shape)) * 4

    def load(self, device: torch.device | str, threads: int = 0) -> None:
        """Read every held sample (checksums verified; a corrupt record is the dataset's error or,
        with its ``skip_corrupt``, its substitute) into ``device`` memory, ``threads`` reader threads
        (0: in the calling thread)."""
        device = torch.device(device)
        ds = self.dataset
        dtype = torch.from_numpy(np.empty(0, ds.cbed_dtype)).dtype
        self.cbed = torch.empty((len(self), *ds.stack_shape), dtype=dtype, device=device)
        self.target = torch.empty((len(self), *ds.target_shape), dtype=torch.float32, device=device)
        self.row_of = torch.from_numpy(self.row_of_host).to(device)
        for reader in ds.stores.readers:  # one LMDB environment per store, shared by the threads
            reader.env  # noqa: B018 (opens it in this process)
        chunks = [range(start, min(start + CHUNK, len(self))) for start in range(0, len(self), CHUNK)]
        read = self._read_chunk if device.type == "cpu" else _Staged(self).read_chunk
        try:
            if threads > 0:
                with ThreadPoolExecutor(threads, thread_name_prefix="resident-load") as pool:
                    list(pool.map(read, chunks))   # raises the first reader's error
            else:
                for chunk in chunks:
                    read(chunk)
        finally:
            ds.stores.close()

    def _read_chunk(self, rows: range) -> None:
        """Read ``rows`` straight into a host-memory set (device cpu)."""
        cbed, target = self.cbed.numpy(), self.target.numpy()
        for r in rows:
            self.dataset.read_into(self.sources[r], cbed[r], target[r])


class _Staged:
    """Reads rows of a device-held `ResidentSet` through one pinned host buffer per reader thread."""

    def __init__(self, resident: ResidentSet):
        self.resident = resident
        self.local = threading.local()

    def _buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        res = self.resident
        if not hasattr(self.local, "cbed"):
            pin = torch.cuda.is_available()
            self.local.cbed = torch.empty((CHUNK, *res.cbed.shape[1:]), dtype=res.cbed.dtype, pin_memory=pin)
            self.local.target = torch.empty((CHUNK, *res.target.shape[1:]), dtype=torch.float32, pin_memory=pin)
        return self.local.cbed, self.local.target

    def read_chunk(self, rows: range) -> None:
        res = self.resident
        cbed, target = self._buffers()
        host_cbed, host_target = cbed.numpy(), target.numpy()
        for i, r in enumerate(rows):
            res.dataset.read_into(res.sources[r], host_cbed[i], host_target[i])
        n = len(rows)
        res.cbed[rows.start: rows.stop].copy_(cbed[:n])   # synchronous: the buffer is refilled next
        res.target[rows.start: rows.stop].copy_(target[:n])


def free_bytes(device: torch.device | str) -> float:
    """Memory free for a resident set on ``device``: the GPU's free memory (cuda), else the
    machine's available memory (what `workflow.memory.machine_memory` reads)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return float(free)
    return float(psutil.virtual_memory().available)


def check_fits(sets: Sequence[ResidentSet], batch_size: int, device: torch.device | str,
               free: float | None = None) -> None:
    """Refuse, in one line (`MemoryShortage`, exit 2), ``sets`` whose samples and one batch's working
    copies need more than (1 - `KEEP_FRACTION`) of the ``free`` bytes of ``device`` (None: `free_bytes`)."""
    free = free_bytes(device) if free is None else float(free)
    data = sum(s.nbytes for s in sets)
    work = max((s.batch_bytes(batch_size) for s in sets), default=0)
    need = data + work
    if need <= (1.0 - KEEP_FRACTION) * free:
        return
    samples = sum(len(s) for s in sets)
    raise MemoryShortage(
        f"data.resident: {samples} samples ({data / GIB:.3g} GiB as stored) and a batch of {batch_size}'s working "
        f"copies ({work / GIB:.3g} GiB) need {need / GIB:.3g} GiB of {torch.device(device)}, which has "
        f"{free / GIB:.3g} GiB free and keeps {KEEP_FRACTION:.0%} of it for the model: set data.resident false "
        f"(stream the batches from the store) or train on fewer samples (training.max_train_samples)")


__all__ = ["ResidentSet", "check_fits", "free_bytes", "KEEP_FRACTION"]
