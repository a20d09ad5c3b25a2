"""What the ptychography baselines share (single-slice `ptycho`, `multislice`, `refined`): their maps
brought to the targets' resolution, the facts an iterative solver's run is recorded by, and their one
requirement, py4DSTEM. Every baseline's map is in physical units (V*Angstrom) on the targets' grid
([row = y, col = x]), made from the CBED stack alone: no function here sees the truth. Scoring puts each
into the views (`evaluation.views`); the reconstructions themselves live in namsa (`namsa.icom`,
`namsa.ptychography`)."""
from __future__ import annotations

from typing import Any

import numpy as np

from namsa.ptychography.single_slice import INSTALL_HINT
from namsa.sample_meta import SampleMeta
from namsa.targets import to_target_resolution

from .record import Requirement

#: what every ptychography baseline imports (the module `namsa.ptychography` loads lazily).
PY4DSTEM = Requirement(module="py4DSTEM.process.phase", package="py4DSTEM", install=INSTALL_HINT)


def at_target_resolution(raw: np.ndarray, meta: SampleMeta) -> np.ndarray:
    """``raw`` brought to the targets' resolution when ``meta`` states it (``target_fwhm_A``,
    `namsa.targets.to_target_resolution`), as the network learned it: ptychography, whose maps resolve
    finer than the probe, is not charged for detail finer than the truth holds."""
    if meta.target_fwhm_A:
        raw = to_target_resolution(raw, meta.fov_A, float(meta.target_fwhm_A))
    return np.asarray(raw, dtype=np.float32)


def solver_facts(result: Any) -> dict[str, Any]:
    """What the evaluation records of an iterative reconstruction."""
    return {"seconds": result.seconds, "error": result.error, "iterations": result.iterations,
            "converged": result.converged}
