"""The one least-squares fit of a map to the truth: ``scale * map + offset`` with ``scale >= 0``.

It makes the structure view of every method (`evaluation.views`: two numbers from the truth, so
only the map's structure is scored) and, for the reconstruction baselines, the legacy rule's map
(before issue 30 the headline scored iCoM and ptychography only after this fit). A sign flip is not
allowed, and the unconstrained, signed scale is recorded beside the fit so that a reader sees where
a map was anti-correlated with the truth. No baseline's own map goes through it
(`evaluation.baselines.maps`: raw maps in physical units).
"""
from __future__ import annotations

import numpy as np

from ..metrics import fit_affine_nonnegative


def fit_to_truth(raw: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """``scale * raw + offset`` (float64, the truth's units) with the non-negative least-squares scale,
    and ``{"scale", "offset", "signed_scale"}``. A map whose best fit would need a negative scale gets
    scale 0: the best constant map (the truth's mean)."""
    scale, offset, signed = fit_affine_nonnegative(raw, truth)
    fitted = scale * np.asarray(raw, dtype=np.float64) + offset
    return fitted, {"scale": scale, "offset": offset, "signed_scale": signed}
