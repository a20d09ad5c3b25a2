"""The training data: opening the stores, node-local staging, the split datasets and loaders,
the shape check against the model, and moving a batch onto the training device."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from ..config import Architecture, ModelConfig, TrainConfig
from ..losses import data_loss
from .errors import DataShapeError, TrainingError


def _data_dir_list(data_dirs: Any) -> list[Path]:
    if isinstance(data_dirs, (str, os.PathLike)):
        data_dirs = [data_dirs]
    return [Path(d) for d in data_dirs]


def manifest_hash(manifests: list[dict[str, Any]]) -> str:
    """sha256 of what defines the data: sample ids and splits, shapes, physics config hashes."""
    keys = ("config_hash", "arrays", "samples", "split_fractions", "split_seed", "count")
    payload = [{k: m.get(k) for k in keys} for m in manifests]
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


class TrainingData:
    """The run's data: ``store_paths``, ``data_hash``, ``config_hashes``, ``normalizer``, ``train_ds`` /
    ``dev_ds``, sample totals and ``cbed_shape``. Opening checks the shapes against the model."""

    def __init__(self, model_cfg: ModelConfig, cfg: TrainConfig, arch: Architecture, data_cfg: Any, ctx: Any,
                 device: torch.device, data_dirs: Any, normalizer: Any = None):
        self.model_cfg, self.cfg, self.arch, self.data_cfg = model_cfg, cfg, arch, data_cfg
        self.ctx, self.device = ctx, device
        self._open_data(data_dirs, normalizer)
        self._check_data_shapes()
        #: the training loss's data term (training.loss_weighting), ``data_loss(pred, target, delta)``
        self.data_loss = data_loss(cfg.loss_weighting, self.normalizer, model_cfg.targets)

    def _open_data(self, data_dirs: Any, normalizer: Any = None) -> None:
        """``normalizer``: the one the weights were fitted to (training.init_from); None fits one on
        the training split."""
        import stage

        dirs = _data_dir_list(data_dirs)
        paths: list[Path] = []
        for d in dirs:
            if not Path(d).exists():
                raise TrainingError(f"data directory {d} does not exist; run `namsa simulate` first or fix --data")
            paths += stage.find_stores(d)
        if not paths:
            raise TrainingError(f"no sample stores under {[str(d) for d in dirs]}; run `namsa simulate` or fix --data")
        self.store_paths = paths
        with stage.open_stores(paths) as stores:
            self.data_hash = manifest_hash(stores.manifests)
            self.scan_shape = _scan_shape(stores)
            #: the physics hash of the simulation config each store was written with (namsa.SimulationConfig)
            self.config_hashes = frozenset(m.get("config_hash") for m in stores.manifests)
        self.normalizer = normalizer or stage.Normalizer.fit(paths, self.data_cfg.transform,
                                                             physics_inputs=self.arch.physics_inputs)
        self.local_data = bool(self.data_cfg.node_local_dir)
        read_paths = self._stage_locally(dirs) if self.local_data else paths
        #: data.resident: the splits are held in the device's memory and batched there (stage.resident_loader)
        self.resident = bool(getattr(self.data_cfg, "resident", False))
        if self.resident and self.arch.physics_inputs:
            raise TrainingError("data.resident cannot serve model.physics_inputs (their maps are computed in the "
                                "streaming loader from the patterns it delivers): set data.resident false")
        # On a GPU the loader ships float16 cbed as stored (half the host-to-device bytes) and the
        # input transform runs on the device; on the CPU it runs in the loader. A resident set holds
        # the patterns as stored and transforms them on its device.
        raw = self.device.type == "cuda" or self.resident
        targets = tuple(self.model_cfg.targets)
        # noise drawn on the device (data.dose_augmentation.on_device) comes before the transform
        dose = getattr(self.data_cfg, "dose_augmentation", None)
        on_device = dose is not None and dose.enabled and dose.on_device
        # a resident set draws the augmentations itself, on the device: its dataset delivers samples as stored
        self.train_ds = self._dataset(read_paths, "train", targets, raw or on_device, allow_empty=self.local_data,
                                      augment=not self.resident)
        self.dev_ds = self._dataset(read_paths, "dev", targets, raw, allow_empty=True)
        self._agree_sample_counts()

    def _stage_locally(self, dirs: list[Path]) -> list[Path]:
        """``data.node_local_dir``: copy this rank's shard of the data there (verified; what is
        already staged is kept) and read only that, as in the paper's node-local staging."""
        import stage

        if self.data_cfg.shard_mode == "shared":
            raise TrainingError("data.shard_mode=shared has every rank read every store, which node-local staging "
                                "(data.node_local_dir) rules out; use shard_mode: unique or unset node_local_dir")
        ctx = self.ctx
        report = stage.stage_rank_shard(dirs, self.data_cfg.node_local_dir, self.data_hash, rank=ctx.rank,
                                        world_size=ctx.world_size, threads=max(1, self.data_cfg.num_workers))
        ctx.notice(f"staged rank {ctx.rank}'s shard of {ctx.world_size} into {self.data_cfg.node_local_dir}: "
                   f"{report.copied} samples copied ({report.bytes_copied / 1e9:.3f} GB in {report.seconds:.1f} s), "
                   f"{report.skipped} already there")
        return report.destinations

    def _dataset(self, paths: list[Path], split: str, targets: tuple[str, ...], raw: bool, allow_empty: bool,
                 augment: bool = True) -> Any:
        """The split's `stage.SampleDataset`, or None when it has no samples and ``allow_empty``;
        ``augment`` False: without the dose, symmetry and camera augmentations."""
        from stage import EmptyStoreError

        cap = self.cfg.max_train_samples if split == "train" else None
        if cap is not None and self.local_data:
            cap = max(1, cap // self.ctx.world_size)  # the cap is global: each rank holds 1/P of the data
        try:
            # Shot noise at a random dose (data.dose_augmentation), a share of it seen through an integrating
            # camera (data.camera_augmentation) and the square group's rotations/mirrors
            # (data.symmetry_augmentation); SampleDataset applies them to "train" only.
            dose = getattr(self.data_cfg, "dose_augmentation", None) if augment else None
            symmetry = getattr(self.data_cfg, "symmetry_augmentation", None) if augment else None
            camera = getattr(self.data_cfg, "camera_augmentation", None) if augment else None
            return _dataset_class(self.arch)(paths, split, self.normalizer, targets, raw_cbed=raw, max_samples=cap,
                                             dose_augmentation=dose, symmetry_augmentation=symmetry,
                                             camera_augmentation=camera,
                                             light_oversample=getattr(self.data_cfg, "light_oversample", 1))
        except EmptyStoreError:
            if allow_empty:
                return None
            raise

    def _agree_sample_counts(self) -> None:
        """Sample totals, and with per-rank staged data the training samples every rank uses per
        epoch: the smallest rank's count, so every rank runs the same number of steps."""
        from models.distributed.launch import all_gather_objects

        mine = (len(self.train_ds) if self.train_ds is not None else 0, len(self.dev_ds) if self.dev_ds is not None else 0)
        counts = all_gather_objects(self.ctx, mine) if self.local_data and self.ctx.world_size > 1 else [mine]
        self.train_total, self.dev_total = (sum(c[i] for c in counts) for i in (0, 1))
        self.train_per_rank = min(c[0] for c in counts) if self.local_data else None
        if self.local_data and self.train_per_rank < self.cfg.batch_size:
            raise TrainingError(f"the ranks' staged shards hold {[c[0] for c in counts]} training samples; the smallest "
                                f"gives no full batch of {self.cfg.batch_size}: use fewer ranks, a smaller batch_size "
                                "or more data")

    def _check_data_shapes(self) -> None:
        s, p, p2 = getattr(self.train_ds, "stack_shape", self.train_ds.cbed_shape)  # the patterns alone
        c, t, t2 = self.train_ds.target_shape
        problem = (self.arch.data_mismatch(s, p, t, self.scan_shape) if p == p2 and t == t2
                   else f"patterns {p}x{p2} or targets {t}x{t2} are not square")
        if problem:
            raise DataShapeError(f"{problem} (model preset {self.model_cfg.preset})")
        self.cbed_shape = (s + len(self.arch.physics_inputs), p, p2)

    def build_loaders(self) -> tuple[Any, Any]:
        """(train loader, dev loader or None), sharded over the ranks."""
        import stage

        cfg, ctx = self.cfg, self.ctx
        mode = "local" if self.local_data else None  # None: data.shard_mode
        if self.resident:
            return self._resident_loaders(mode)
        train_loader = stage.make_loader(self.train_ds, self.data_cfg, cfg.batch_size, ctx.rank, ctx.world_size,
                                         shuffle=True, seed=cfg.seed, shard_mode=mode,
                                         samples_per_rank=self.train_per_rank)
        dev_loader = (stage.make_loader(self.dev_ds, self.data_cfg, cfg.batch_size, ctx.rank, ctx.world_size,
                                        shuffle=False, shard_mode=mode) if self.dev_ds is not None else None)
        return train_loader, dev_loader

    def _resident_loaders(self, mode: str | None) -> tuple[Any, Any]:
        """``data.resident``: the loaders of the splits held in the training device's memory, checked
        to fit together (one line otherwise) and read once."""
        import time

        from stage.resident_loader import load_resident, make_resident_loader

        cfg, ctx = self.cfg, self.ctx
        train = make_resident_loader(self.train_ds, self.data_cfg, cfg.batch_size, self.normalizer, rank=ctx.rank,
                                     world_size=ctx.world_size, shuffle=True, seed=cfg.seed, shard_mode=mode,
                                     samples_per_rank=self.train_per_rank)
        dev = (make_resident_loader(self.dev_ds, self.data_cfg, cfg.batch_size, self.normalizer, rank=ctx.rank,
                                    world_size=ctx.world_size, shuffle=False, shard_mode=mode, augment=False)
               if self.dev_ds is not None else None)
        held = [ld for ld in (train, dev) if ld is not None]
        t0 = time.perf_counter()
        load_resident(held, self.device, threads=self.data_cfg.num_workers)
        gib = sum(ld.resident.nbytes for ld in held) / 2 ** 30
        ctx.notice(f"data.resident: {sum(len(ld.resident) for ld in held)} samples ({gib:.3g} GiB) held in "
                   f"{self.device} memory, read in {time.perf_counter() - t0:.1f} s")
        return train, dev

    def to_device(self, batch: dict[str, Any], train: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(normalised cbed, standardised targets) on the training device; ``train``: a batch of
        the training split, whose shot noise is drawn here with data.dose_augmentation.on_device.
        A resident loader's batches (data.resident) are made there already."""
        from stage.dataset import batch_to_device
        from stage.device_noise import noisy_batch_to_device

        if not self.resident:
            if train and getattr(self.train_ds, "device_dose", None) is not None:
                batch = noisy_batch_to_device(batch, self.device, self.normalizer, self.train_ds)
            elif self.arch.physics_inputs:
                batch = _physics_batch_to_device(batch, self.device, self.normalizer, self.arch.in_channels)
            else:
                batch = batch_to_device(batch, self.device, self.normalizer)
        x = batch["cbed"]
        if self.cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, batch["target"].float()


def _scan_shape(stores: Any) -> tuple[int, int] | None:
    """(scan_y, scan_x) of the data, from its first sample's meta (the stores read together hold
    stacks of one shape, `stage.StoreSet` checks); None for stores without samples."""
    if not len(stores):
        return None
    reader, index = stores.locate(0)
    scan_y, scan_x = reader.meta(index).scan_shape
    return scan_y, scan_x


def _dataset_class(arch: Architecture) -> Any:
    """`stage.SampleDataset`, or with ``model.physics_inputs`` a partial of
    `stage.physics_dataset.PhysicsSampleDataset` that adds those maps as extra planes."""
    import functools

    import stage
    from stage.physics_dataset import PhysicsSampleDataset

    if not arch.physics_inputs:
        return stage.SampleDataset
    return functools.partial(PhysicsSampleDataset, physics_inputs=arch.physics_inputs)


def _physics_batch_to_device(batch: dict[str, Any], device: torch.device, normalizer: Any,
                             patterns: int) -> dict[str, Any]:
    """`stage.dataset.batch_to_device` for (B, S + K, P, P) stacks: a raw (fp16, GPU) batch has its
    S patterns transformed on the device; the K physics planes arrive standardised already."""
    from stage.dataset import batch_to_device

    out = batch_to_device(batch, device, None)
    if "cbed_scale" in batch:
        x = out["cbed"].float()
        x[:, :patterns] = normalizer.cbed(x[:, :patterns], stored_scale=float(batch["cbed_scale"][0]))
        out["cbed"] = x
    return out


__all__ = ["TrainingData", "manifest_hash"]
