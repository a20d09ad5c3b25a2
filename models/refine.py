"""The network's potential maps refined by ptychography (`namsa.ptychography.refine`): the glue
`Reconstructor.predict(..., refine=...)` calls once it has checked the request (which stacks, their
calibrations, a potential target)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Sequence

import numpy as np

from namsa.ptychography.refine import RefineResult, RefineSettings, refine_from_sample
from namsa.sample_meta import SampleMeta


def refine_potentials(maps: np.ndarray, stacks: np.ndarray, channel: int, settings: RefineSettings,
                      metas: Sequence[SampleMeta]) -> tuple[np.ndarray, list[RefineResult]]:
    """(B, C, T, T) ``maps`` with channel ``channel`` (the potential, V * Angstrom) of stack b replaced
    by its refinement from ``stacks[b]`` (S, P, P) and ``metas[b]``; also the `RefineResult` of each."""
    out = np.array(maps, dtype=np.float32, copy=True)
    results = []
    for b, (stack, meta) in enumerate(zip(stacks, metas)):
        result = refine_from_sample(SimpleNamespace(cbed=stack, meta=meta), maps[b, channel], settings)
        out[b, channel] = result.potential
        results.append(result)
    return out, results


__all__ = ["refine_potentials", "RefineSettings", "RefineResult"]
