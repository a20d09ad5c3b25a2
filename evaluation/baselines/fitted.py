"""The iCoM and ptychography baselines put into the truth's units: a per-sample least-squares
fit of ``scale * map + offset`` to the truth (uses the truth for these two scalars only)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..metrics import fit_affine
from .icom import icom_from_sample


def icom_baseline(sample: Any, truth: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """iCoM of ``sample`` on the truth's grid, least-squares scaled and offset to ``truth``.

    Returns the fitted map (units of the truth) and ``{"scale", "offset"}`` of the fit.
    """
    raw = icom_from_sample(sample, output_shape=truth.shape)
    scale, offset = fit_affine(raw, truth)
    return (scale * raw + offset).astype(np.float32), {"scale": scale, "offset": offset}


def ptycho_baseline(sample: Any, truth: np.ndarray, iterations: int,
                    batch_size: int) -> tuple[np.ndarray, dict[str, float]]:
    """Ptychography of ``sample`` on the truth's grid, least-squares scaled and offset to ``truth``.

    Returns the fitted map (units of the truth) and ``{"scale", "offset", "seconds", "error"}``:
    the fit, py4DSTEM's compute time for this sample (s) and its final data error.
    """
    from .ptycho import ptycho_from_sample

    result = ptycho_from_sample(sample, output_shape=truth.shape, iterations=iterations, batch_size=batch_size)
    scale, offset = fit_affine(result.potential, truth)
    fitted = (scale * result.potential.astype(np.float64) + offset).astype(np.float32)
    return fitted, {"scale": scale, "offset": offset, "seconds": result.seconds, "error": result.error}
