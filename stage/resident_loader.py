"""`ResidentLoader`: the training (or dev) batches of a split held in device memory (``data.resident``).

The same `ShardedBatchSampler` as the streaming loaders (`stage.loader.make_loader`) orders the
batches, so for a seed, epoch and rank a resident loader yields the same dataset positions in the
same order as the streaming one, and the same clean batches (the same bytes, after the same
transform, as `batch_to_device` of the streaming path's raw batch). Per epoch, on the host: the
sampler's order and the epoch's augmentation draws (`stage.resident_draws`, computed ahead on a
background thread), each uploaded once. Per step: slicing that order, one indexing of the resident
tensors with the symmetry tables, one Poisson draw and the transform, all launched on the device
(`stage.resident_batch`); the host prepares nothing but a generator seed.

Batches are dicts ``{"cbed": float32 (B, S, P, P) normalised, "target": float32 (B, C, T, T)
standardised, "index": int64 (B,) dataset positions}``, all on the set's device.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .config import DataConfig
from .dataset import SampleDataset
from .normalize import Normalizer
from .resident import ResidentSet, check_fits
from .resident_batch import BatchDraws, SymmetryTables, make_batch
from .resident_draws import DrawsAhead, EpochDraws, batch_noise_seed
from .sampler import ShardedBatchSampler


class ResidentLoader:
    """Batches of a `ResidentSet` in the order of ``sampler`` (see the module docstring); ``draws``
    the augmentations (inactive for dev). `load` (or `load_resident`) first, then iterate like a
    `StageLoader`: ``set_epoch``, ``skip_batches``, ``len``."""

    def __init__(self, sampler: ShardedBatchSampler, resident: ResidentSet, draws: EpochDraws,
                 normalizer: Normalizer, noise_seed: int = 0):
        self.sampler = sampler
        self.batch_sampler = sampler   # the name the streaming loaders use
        self.resident = resident
        self.draws = draws
        self.ahead = DrawsAhead(draws)
        self.normalizer = normalizer
        self.noise_seed = int(noise_seed)
        self.tables: SymmetryTables | None = None
        self.generator: torch.Generator | None = None
        self._skip = 0

    @property
    def device(self) -> torch.device:
        return self.resident.cbed.device

    def load(self, device: torch.device | str, threads: int = 0) -> None:
        """Read the set into ``device`` memory (`ResidentSet.load`) and build the symmetry tables."""
        self.resident.load(device, threads)
        ds = self.resident.dataset
        if self.draws.symmetry is not None:
            self.tables = SymmetryTables(ds.stack_shape, ds.target_shape[1:], self.device)
        if self.draws.dose is not None:
            self.generator = torch.Generator(device=self.device)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def skip_batches(self, k: int) -> None:
        """Start the next iteration at batch ``k`` (to resume mid-epoch exactly)."""
        self._skip = max(0, int(k))

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.resident.cbed is None:
            raise RuntimeError("ResidentLoader.load (or stage.resident_loader.load_resident) comes before iterating")
        skip, self._skip = self._skip, 0
        epoch = self.sampler.epoch
        order = torch.tensor(self.sampler.rank_indices(), dtype=torch.int64).to(self.device, non_blocking=True)
        ops = electrons = camera = None
        if self.draws.active:
            drawn = self.ahead.get(epoch)
            ops = torch.from_numpy(drawn.ops).to(self.device) if self.draws.symmetry is not None else None
            electrons = torch.from_numpy(drawn.electrons).to(self.device) if self.draws.dose is not None else None
            if self.draws.camera is not None:
                camera = tuple(torch.from_numpy(a).to(self.device) for a in (drawn.seen, drawn.sigma_px,
                                                                             drawn.read_noise_e))
        size = self.sampler.batch_size
        rank, world = self.sampler.rank, self.sampler.world_size
        for b in range(skip, len(self)):
            positions = order[b * size: (b + 1) * size]
            if electrons is not None:
                self.generator.manual_seed(batch_noise_seed(self.noise_seed, epoch * len(self) + b, rank, world))
            draws = BatchDraws(ops=ops[positions] if ops is not None else None,
                               electrons=electrons[positions] if electrons is not None else None,
                               generator=self.generator,
                               camera=tuple(a[positions] for a in camera) if camera is not None else None)
            x, y = make_batch(self.resident.cbed, self.resident.target, self.resident.row_of[positions], draws,
                              self.tables, self.normalizer, self.resident.storage_scale)
            yield {"cbed": x, "target": y, "index": positions}

    def close(self) -> None:
        """Stop the background draws (the held tensors go with the loader)."""
        self.ahead.close()


def make_resident_loader(dataset: SampleDataset, data_cfg: DataConfig, batch_size: int, normalizer: Normalizer, *,
                         rank: int = 0, world_size: int = 1, shuffle: bool = True, seed: int = 0,
                         drop_last: bool | None = None, shard_mode: str | None = None,
                         samples_per_rank: int | None = None, augment: bool = True) -> ResidentLoader:
    """`stage.make_loader`'s recipe (the same sampler, arguments and defaults) for a resident set:
    ``dataset`` raw (``raw_cbed=True``) and built without augmentations; ``augment`` draws
    ``data_cfg``'s dose, symmetry and camera augmentations (the training split's). Nothing is read yet:
    `load_resident` checks the memory of all the loaders of a run, then loads them."""
    drop_last = shuffle if drop_last is None else drop_last
    mode = shard_mode or data_cfg.shard_mode
    sampler = ShardedBatchSampler(dataset, batch_size, rank=rank, world_size=world_size, shuffle=shuffle,
                                  seed=seed, drop_last=drop_last, shard_mode=mode, samples_per_rank=samples_per_rank)
    positions = range(len(dataset)) if mode == "shared" else sampler.shard
    dose = data_cfg.dose_augmentation if augment else None
    symmetry = data_cfg.symmetry_augmentation if augment else None
    metas = dataset.position_metas(positions) if augment and (dose.enabled or symmetry.enabled) else []
    draws = EpochDraws(len(dataset), positions if metas else [], metas, dose, symmetry, dataset.stack_shape,
                       dataset.target_shape[1:], camera=data_cfg.camera_augmentation if augment else None)
    return ResidentLoader(sampler, ResidentSet(dataset, positions), draws, normalizer,
                          noise_seed=data_cfg.dose_augmentation.seed)


def load_resident(loaders: Sequence[ResidentLoader], device: torch.device | str, threads: int = 0) -> None:
    """Check that the sets of ``loaders`` fit ``device`` together (`stage.resident.check_fits`: one
    line before anything is read), then read each into it."""
    batch = max((ld.sampler.batch_size for ld in loaders), default=1)
    check_fits([ld.resident for ld in loaders], batch, device)
    for ld in loaders:
        ld.load(device, threads)


__all__ = ["ResidentLoader", "make_resident_loader", "load_resident"]
