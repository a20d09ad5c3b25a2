"""CBED intensity units and input transforms: the power-of-two intensity scale, the pattern-minimum shift.

Intensity scale: a CBED pattern carries total intensity 1 spread over P x P pixels, so a typical
pixel holds ~1/P^2 (1.5e-5 at P = 256). That is below float16's smallest normal number (6.1e-5),
where float16 keeps only a few significant bits, and it makes ``log1p`` a no-op (log1p(x) ~ x).
Both the float16 store and the transforms therefore work on intensities multiplied by
``intensity_scale(P) = 2^min(15, round(log2(P^2)) - 4)`` (mean pixel ~1/16): a power of two, so
scaling is exact, and at most 32768, so a pixel <= 1 never overflows float16 (max 65504).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

TRANSFORMS: tuple[str, ...] = ("none", "log1p", "sqrt")


def intensity_scale(pattern_px: int) -> float:
    """Power-of-two factor applied to CBED intensities before float16 storage and transforms."""
    exponent = min(15, max(0, round(math.log2(pattern_px * pattern_px)) - 4))
    return float(2 ** exponent)


def subtract_pattern_min(x: Any, inplace: bool = False) -> Any:
    """Shift every pattern (last two axes) to a minimum of 0; numpy or torch, (..., P, P).

    Returns float32 (numpy) or a float32 tensor on the input's device. ``inplace`` reuses a
    float32 numpy input's memory (the loader's own fresh buffer) instead of copying it.
    """
    if isinstance(x, np.ndarray):
        x = x.astype(np.float32, copy=not inplace)
        x -= x.min(axis=(-2, -1), keepdims=True)
        return x
    x = x.float()
    return x - x.amin(dim=(-2, -1), keepdim=True)
