"""`PhysicsSampleDataset`: a `SampleDataset` whose stacks carry the physics input channels.

Each item's ``cbed`` is (S + K, P, P): the S patterns (normalised as usual), then the K maps of
``physics_inputs`` (`stage.physics_inputs`) computed from the same patterns as read, after any
dose augmentation and before the input transform, on the targets' field of view, standardised
with the `Normalizer`'s physics statistics. Both loaders (process workers and reader threads) go
through `read_into`, so both deliver the channels.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from namsa.errors import UserError
from namsa.icom import ScanCalibration

from .dataset import SampleDataset
from .physics_inputs import physics_maps

#: the key under which the extra planes of the (S + K, P, P) buffer travel through `_read`
PHYSICS_KEY = "physics"


class PhysicsSampleDataset(SampleDataset):
    """`SampleDataset` plus the physics input planes; ``physics_inputs`` is the ordered channel list."""

    def __init__(self, paths: Any, split: str | None, normalizer: Any, targets: Sequence[str] = ("potential",),
                 max_samples: int | None = None, *, physics_inputs: Sequence[str], **kwargs: Any):
        if not physics_inputs:
            raise UserError("PhysicsSampleDataset needs at least one physics input; use SampleDataset without them")
        super().__init__(paths, split, normalizer, targets, max_samples, **kwargs)
        if self.device_dose is not None:  # the maps would come from the clean patterns, the input from noisy ones
            raise UserError("data.dose_augmentation.on_device draws the noise after the loader computed the physics "
                            "input maps from the clean patterns; set on_device: false with model.physics_inputs")
        self.physics_inputs = tuple(physics_inputs)
        self._calibrations: dict[int, ScanCalibration] = {}  # by store index: a meta read once per sample

    @property
    def cbed_shape(self) -> tuple[int, ...]:
        s, p, p2 = self.stack_shape
        return (s + len(self.physics_inputs), p, p2)

    def _read_or_substitute(self, index: int, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # `read_into` hands over the whole (S + K, P, P) buffer: the patterns go to its first S
        # planes (which it then normalises), the maps to the last K.
        full = out["cbed"]
        s = self.stack_shape[0]
        arrays = super()._read_or_substitute(index, {**out, "cbed": full[:s], PHYSICS_KEY: full[s:]})
        return {**arrays, "cbed": full[:s]}

    def _read(self, index: int, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = super()._read(index, out)
        planes = out[PHYSICS_KEY]
        maps = physics_maps(arrays["cbed"], self._calibration(index), self.physics_inputs, planes.shape[1:])
        planes[...] = self.normalizer.physics(maps, self.physics_inputs) if self.normalizer is not None else maps
        return arrays

    def _calibration(self, index: int) -> ScanCalibration:
        key = self.global_indices[index]
        if key not in self._calibrations:
            reader, j = self.stores.locate(key)
            self._calibrations[key] = reader.meta(j).calibration
        return self._calibrations[key]


__all__ = ["PhysicsSampleDataset", "PHYSICS_KEY"]
