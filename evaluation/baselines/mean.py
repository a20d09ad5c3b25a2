"""The mean baseline: its record and the pixel-wise mean of the training targets (physical units)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .record import ALL_TARGETS, Method


def mean_training_targets(stores: Any, targets: Sequence[str]) -> dict[str, np.ndarray] | None:
    """Pixel-wise mean of each target over the train split of ``stores`` (a `stage.StoreSet`).

    Reads only the target arrays (not the CBED stacks). None when the stores hold no training
    samples (e.g. a test-only store): the mean baseline is then left out and the report says so.
    """
    indices = stores.indices("train")
    if not indices:
        return None
    sums: dict[str, np.ndarray] = {}
    for i in indices:
        reader, j = stores.locate(i)
        arrays, _ = reader.read_arrays(j, names=tuple(targets))
        for name in targets:
            sums[name] = sums.get(name, 0.0) + arrays[name].astype(np.float64)
    return {name: (total / len(indices)).astype(np.float32) for name, total in sums.items()}


# No runner: one map per target for every sample, computed once from the training split by `evaluate`.
METHOD = Method(
    name="mean", label="mean training target", short_label="mean", verdict_label="mean training target",
    description="the pixel-wise mean of the training split's targets: a network that does not beat it has "
                "learned nothing about the individual sample",
    colour="tab:gray", targets=ALL_TARGETS, legacy_fitted=False, judged=True, dose_sweep=True, panel_order=4,
    switch="mean_baseline", missing_note="the mean-training-target baseline is absent: {why}")
