"""The torch `SampleDataset`: samples of one split of one or many stores as normalised tensors.

With stage.sampler, stage.loader, stage.threadloader, stage.device_noise, stage.camera_augmentation
and the resident set's stage.resident, stage.resident_batch and stage.resident_loader, the only
modules of `stage` that import torch. Stores are opened lazily, read-only and lock-free in each worker
process (kernel readahead off for small records, on for large ones that are read whole: see
`stage.reader.StoreReader`).
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate, get_worker_info

from namsa.errors import UserError
from namsa.sample_meta import SampleMeta

from .camera_augmentation import CameraAugmentation, CameraDraw
from .config import CameraAugmentationConfig, DoseAugmentationConfig, SymmetryAugmentationConfig
from .dose import DoseAugmentation
from .errors import CorruptRecordError, EmptyStoreError
from .normalize import Normalizer
from .splits import SPLITS
from .storeset import open_stores
from .symmetry import SymmetryAugmentation, allowed_ops


class SampleDataset(Dataset):
    """Samples of one split of one or many stores, as normalised float32 tensors.

    Items: ``{"cbed": float32 (S, P, P), "target": float32 (C, T, T), "index": int}`` where the C
    target channels follow ``targets`` (``potential`` in V*Angstrom, ``density`` in e/Angstrom^2,
    both standardised by ``normalizer``). ``normalizer=None`` returns unnormalised float32.
    ``raw_cbed=True`` returns cbed as stored (float16 intensities times ``item["cbed_scale"]``,
    untransformed) so the transform can run on the GPU after an fp16 host-to-device copy (half
    the PCIe bytes): `batch_to_device(batch, device, normalizer)` does both. ``skip_corrupt=True`` replaces a corrupt record by the next readable one
    (with a warning naming it) instead of failing the epoch.

    ``dose_augmentation`` (a `DoseAugmentationConfig`, enabled): training-split samples get
    Poisson shot noise at a random dose, drawn from (seed, epoch, sample id) before any
    transform (`stage.dose`); other splits are delivered as stored. The epoch is what
    `set_epoch` last set (the `ShardedBatchSampler` sets it): it lives in shared memory, so
    persistent DataLoader workers and reader threads all see it. ``symmetry_augmentation`` (a
    `SymmetryAugmentationConfig`, enabled): training-split samples get one of the square group's
    rotations/mirrors, drawn the same way, applied to scan, patterns and targets together after
    the noise (`stage.symmetry`); data whose grids do not allow it is refused here. With
    ``dose_augmentation.on_device`` the items stay clean and `device_noise_draws` gives each
    position's dose for the training step to draw the noise on its device (`stage.device_noise`);
    the items must then be untransformed (``raw_cbed=True`` or ``normalizer=None``).
    ``camera_augmentation`` (a `CameraAugmentationConfig`, enabled, with the dose augmentation): a
    share of the noisy training samples is seen through an integrating camera right after its Poisson
    draw (`stage.camera_augmentation`; on the device with ``on_device``: `device_camera_draws`).
    ``light_oversample`` k > 1: every training-split sample of a light material
    (`namsa.kirkland.is_light`) appears k times; copy c > 0 draws its noise and symmetry as the
    sample id with ``#c`` appended, so the copies differ (and stay reproducible).
    """

    def __init__(self, paths: Any, split: str | None, normalizer: Normalizer | None,
                 targets: Sequence[str] = ("potential",), max_samples: int | None = None, *,
                 raw_cbed: bool = False, skip_corrupt: bool = False, verify: bool = True,
                 readahead: bool | None = None, dose_augmentation: DoseAugmentationConfig | None = None,
                 symmetry_augmentation: SymmetryAugmentationConfig | None = None, light_oversample: int = 1,
                 camera_augmentation: CameraAugmentationConfig | None = None):
        if split is not None and split not in SPLITS:
            raise UserError(f"unknown split {split!r}; use one of {SPLITS} (or None for all samples)")
        bad = [t for t in targets if t not in ("potential", "density")]
        if bad or not targets:
            raise UserError(f"unknown targets {list(targets)}; choose from ('potential', 'density')")
        self.stores = open_stores(paths, verify=verify, readahead=readahead)
        self.split = split
        self.normalizer = normalizer
        self.targets = tuple(targets)
        self.raw_cbed = raw_cbed
        self.skip_corrupt = skip_corrupt
        self.global_indices = self.stores.indices(split)
        if max_samples is not None:
            self.global_indices = self.global_indices[: max(0, int(max_samples))]
        if not self.global_indices:
            raise EmptyStoreError(f"no {split} samples in {self.stores.describe()}; simulate more materials "
                                  f"or change data.split_fractions")
        #: which copy of its sample each position is (0: the sample itself; see light_oversample)
        self.copies = [0] * len(self.global_indices)
        if light_oversample > 1 and split == "train":
            self._oversample_light(int(light_oversample))
        self.storage_scale = self.stores.storage_scale
        augment = dose_augmentation is not None and dose_augmentation.enabled and split == "train"
        on_device = augment and dose_augmentation.on_device
        self.dose = DoseAugmentation(dose_augmentation) if augment and not on_device else None
        #: on_device: the loader delivers clean patterns and the training step draws their noise
        self.device_dose = DoseAugmentation(dose_augmentation) if on_device else None
        if on_device and normalizer is not None and not raw_cbed:
            raise UserError("dose_augmentation.on_device draws the noise before the input transform, so the "
                            "loader must deliver untransformed patterns: use raw_cbed=True (or normalizer=None)")
        self._noise_meta = self._noise_meta_per_position() if on_device else []
        camera = augment and camera_augmentation is not None and camera_augmentation.enabled
        #: the camera of the noisy samples: in the loader (host) or, on_device, drawn by the training step
        self.camera = CameraAugmentation(camera_augmentation) if camera else None
        turn = symmetry_augmentation is not None and symmetry_augmentation.enabled and split == "train"
        self.symmetry = SymmetryAugmentation(symmetry_augmentation) if turn else None
        if turn:  # refuse data whose grids rotations cannot map onto themselves before training starts
            allowed_ops(self._meta(self.global_indices[0]), self.stack_shape, self.target_shape[1:])   # the stack turns
        augment = augment or turn
        self._epoch = torch.zeros((), dtype=torch.int64)
        if augment:  # shared memory: workers forked (or spawned) before a set_epoch read the new value
            self._epoch.share_memory_()
        self.stores.close()  # workers open their own handles; the parent keeps none across fork()

    def __len__(self) -> int:
        return len(self.global_indices)

    def _oversample_light(self, k: int) -> None:
        """Append copies 1..k-1 of every light-material sample (read from each sample's meta)."""
        from namsa.kirkland import is_light

        light = [g for g in self.global_indices if is_light(self._meta(g).elements or ())]
        self.global_indices = self.global_indices + light * (k - 1)
        self.copies = self.copies + [c for c in range(1, k) for _ in light]

    def _noise_meta_per_position(self) -> list[SampleMeta]:
        """What `device_noise_draws` needs of each position's meta, read once here: the training
        process opens no store."""
        return self.position_metas(range(len(self)))

    def position_metas(self, positions: Sequence[int]) -> list[SampleMeta]:
        """What the draws of an augmentation need of each dataset position in ``positions``: a small
        `SampleMeta` with the id it draws as (an oversampled copy's with its ``#c`` suffix), the scan
        grid (``scan_shape``, ``fov_A``) and a dose as simulated (None: stored clean)."""
        out = []
        for k in positions:
            meta = self._meta(self.global_indices[k])
            out.append(SampleMeta(sample_id=_copy_id(meta, self.copies[k]), scan_shape=meta.scan_shape,
                                  fov_A=meta.fov_A, dose_e_per_A2=meta.dose_e_per_A2))
        return out

    def device_noise_draws(self, indices: Sequence[int]) -> list[tuple[float, int]]:
        """``dose_augmentation.on_device``: per dataset position in ``indices``, the electrons per
        probe position N = dose * dy * dx (0.0: delivered clean) and the seed of the torch.Generator
        of its counts, at the epoch `set_epoch` set; the dose is the one the host path draws."""
        if self.device_dose is None:
            return [(0.0, 0)] * len(indices)
        draws = []
        for k in indices:
            meta = self._noise_meta[k]
            dose, seed = self.device_dose.device_draw(meta, self.epoch)
            draws.append((0.0, 0) if dose is None else (dose * meta.scan_step_area_A2, seed))
        return draws

    def device_camera_draws(self, indices: Sequence[int]) -> list[CameraDraw | None]:
        """``dose_augmentation.on_device`` with ``camera_augmentation``: per dataset position in ``indices``,
        its camera at the epoch `set_epoch` set (None: counted, or no camera augmentation); it applies
        where `device_noise_draws` gives electrons."""
        if self.device_dose is None or self.camera is None:
            return [None] * len(indices)
        return [self.camera.draw(self._noise_meta[k], self.epoch)[0] for k in indices]

    def _meta(self, global_index: int) -> SampleMeta:
        reader, j = self.stores.locate(global_index)
        return reader.meta(j)

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose dose and noise draws `read_into` delivers."""
        self._epoch.fill_(int(epoch))

    @property
    def stack_shape(self) -> tuple[int, ...]:
        """(S, P, P): the diffraction stack as stored."""
        return tuple(self.stores.manifest["arrays"]["cbed"]["shape"])

    @property
    def cbed_shape(self) -> tuple[int, ...]:
        """The delivered input: the stack itself here (a subclass may append planes)."""
        return self.stack_shape

    @property
    def target_shape(self) -> tuple[int, ...]:
        return (len(self.targets), *self.stores.manifest["arrays"]["potential"]["shape"])

    def sample_id(self, index: int) -> str:
        reader, j = self.stores.locate(self.global_indices[index])
        return reader.ids()[j]

    def store_groups(self) -> list[list[int]]:
        """Dataset indices grouped by the store they live in (stores in order)."""
        groups = []
        for rng in self.stores.store_ranges():
            group = [k for k, g in enumerate(self.global_indices) if g in rng]
            if group:
                groups.append(group)
        return groups

    def _read(self, index: int, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        reader, j = self.stores.locate(self.global_indices[index])
        # Normalised or raw items take the stored values (the Normalizer knows their scale);
        # unnormalised float32 items are physical intensities.
        physical = self.normalizer is None and not self.raw_cbed
        arrays, meta = reader.read_arrays(j, names=("cbed", *self.targets), dtype=np.float32, out=out,
                                          physical=physical)
        if self.copies[index]:  # an oversampled copy draws its own noise and symmetry
            meta = meta.replace(sample_id=_copy_id(meta, self.copies[index]))
        if self.dose is not None:
            scale = 1.0 if physical else self.storage_scale
            dose = self.dose.apply(arrays["cbed"], meta, self.epoch, scale)
            if dose is not None and self.camera is not None:
                self.camera.apply(arrays["cbed"], meta, self.epoch, dose * meta.scan_step_area_A2, scale)
        if self.symmetry is not None:
            self.symmetry.apply(arrays["cbed"], [arrays[t] for t in self.targets], meta, self.epoch)
        return arrays

    def __getitem__(self, index: int) -> dict[str, Any]:
        cbed = _shared_empty(self.cbed_shape, self.cbed_dtype)
        target = np.empty(self.target_shape, np.float32)
        self.read_into(index, cbed.numpy(), target)
        item = {"cbed": cbed, "target": torch.from_numpy(target), "index": index}
        if self.raw_cbed:
            item["cbed_scale"] = self.storage_scale
        return item

    @property
    def cbed_dtype(self) -> np.dtype:
        """dtype of delivered cbed: as stored with ``raw_cbed``, else float32."""
        return np.dtype(self.stores.manifest["arrays"]["cbed"]["dtype"]) if self.raw_cbed else np.dtype(np.float32)

    def read_into(self, index: int, cbed: np.ndarray, target: np.ndarray) -> None:
        """Read item ``index`` into preallocated arrays: ``cbed`` (S, P, P) of `cbed_dtype` and
        ``target`` (C, T, T) float32, transformed exactly as `__getitem__` does (it calls this).
        Every record's checksum is verified; ``skip_corrupt`` substitutes as documented above."""
        out = {"cbed": cbed, **{t: target[c] for c, t in enumerate(self.targets)}}
        arrays = self._read_or_substitute(index, out)
        if not self.raw_cbed and self.normalizer is not None:
            self.normalizer.cbed(arrays["cbed"], inplace=True, stored_scale=self.storage_scale)
        if self.normalizer is not None:
            for c, t in enumerate(self.targets):
                target[c] = self.normalizer.target(target[c], t)

    def _read_or_substitute(self, index: int, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for attempt in range(len(self)):
            k = (index + attempt) % len(self)
            try:
                return self._read(k, out)
            except CorruptRecordError as exc:
                if not self.skip_corrupt:
                    raise
                warnings.warn(f"skipping corrupt record: {exc}", RuntimeWarning, stacklevel=2)
        raise EmptyStoreError(f"every {self.split} record in {self.stores.describe()} is corrupt; re-stage the data")


def _copy_id(meta: SampleMeta, copy: int) -> str | None:
    """The id an oversampled copy draws its noise and symmetry as: the sample's, ``#copy`` appended (copy > 0)."""
    return f"{meta.sample_id}#{copy}" if copy else meta.sample_id


def _shared_empty(shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
    """An uninitialised tensor; inside a DataLoader worker it lives in shared memory from the
    start, so handing it to the main process copies nothing (torch would otherwise copy every
    item into shared memory when collating)."""
    torch_dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    if get_worker_info() is None:
        return torch.empty(shape, dtype=torch_dtype)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    storage = torch.UntypedStorage._new_shared(nbytes)  # what default_collate uses for its batches
    return torch.empty(0, dtype=torch_dtype).set_(storage, 0, shape)


def collate_samples(items: list[dict[str, Any]]) -> dict[str, Any]:
    """default_collate, except that a batch of one is a view (no copy of a 128-512 MiB stack)."""
    if len(items) == 1:
        return {k: (v.unsqueeze(0) if torch.is_tensor(v) else torch.tensor([v])) for k, v in items[0].items()}
    return default_collate(items)


def batch_to_device(batch: dict[str, Any], device: torch.device | str, normalizer: Normalizer | None = None
                    ) -> dict[str, Any]:
    """Move a batch to ``device`` (non-blocking from pinned memory); with ``normalizer``, a raw
    fp16 cbed batch (``SampleDataset(raw_cbed=True)``, recognised by its ``cbed_scale``) is
    transformed on the device; already normalised batches are only moved."""
    out = {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}
    # a thread-loader batch: its ring slot may be refilled only once these copies have run
    guard = getattr(batch, "ring_guard", None)
    if guard is not None:
        guard.record(device)
    if normalizer is not None and "cbed_scale" in batch:
        out["cbed"] = normalizer.cbed(out["cbed"], stored_scale=float(batch["cbed_scale"][0]))
    return out
