"""Compute a split's ptychography baselines into ``evaluation.baseline_cache`` before any model exists
(they do not depend on it), e.g. while the candidates train; `namsa evaluate` with the same config then
reads them back instead of iterating again.

    namsa precompute CONFIG --data DATA [--set KEY=VALUE ...]

Uses the config's evaluation section (split, ptycho settings, multislice_ptycho, max_samples,
baseline_cache) and picks the multislice subset as `namsa evaluate` does (the first eligible samples
in store order). Touches no model and scores nothing: running it on the test split reveals no result.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from namsa.errors import UserError

from .config import EvaluationConfig
from .methods import REGISTRY, check_requirements
from .scoring import subset_rules


def precompute(cfg: EvaluationConfig, data_dirs: list[str | Path]) -> int:
    """Fill ``cfg.baseline_cache`` for every sample of ``cfg.split``; returns the number of samples."""
    from stage import open_stores

    if cfg.baseline_cache is None:
        raise UserError("evaluation.baseline_cache is not set: name the directory to fill (--set evaluation.baseline_cache=DIR)")
    # the methods whose maps are cached; their subset rules pick samples as `namsa evaluate` does
    cached = [m for m in REGISTRY if m.runner is not None and m.settings is not None and m.enabled(cfg)]
    check_requirements(cfg, tuple(cached))
    subsets = subset_rules(cfg, [t for m in cached for t in m.targets], tuple(cached))
    with open_stores(data_dirs) as stores:
        indices = stores.indices(cfg.split_filter())[: cfg.max_samples]
        for n, index in enumerate(indices, 1):
            sample = stores[index]
            started = time.perf_counter()
            due = {name for name, rule in subsets.items() if rule.take(sample.meta)}
            for m in cached:
                if m.subset is None or m.name in due:
                    for t in m.targets:
                        m.compute(cfg, sample, np.shape(getattr(sample, t)), {})  # cached methods read no network map
            print(f"{n}/{len(indices)} {sample.id}: {time.perf_counter() - started:.1f} s", flush=True)
    return len(indices)
