"""Symmetry averaging at prediction: the network's maps averaged over the square group's 8 turns.

Turning the whole experiment about the beam axis (scan, patterns and maps together, `stage.symmetry`,
the operations the training's ``data.symmetry_augmentation`` draws) gives the experiment of the turned
specimen; the network's map of each turned stack, turned back, is another estimate of the same map,
and their errors are only partly shared. A turn that transposes (a quarter turn or a diagonal mirror)
also swaps the scan's y and x steps and detector pixel sizes: that pass gets the calibration with y
and x swapped, so rectangular scan steps are turned exactly as well. It costs one network pass per turn.

Measured on the study's dev split (benchmarks/RESULTS.md, `python benchmarks/symmetry_average_dev.py`).
Where the grids do not map onto themselves (a scan that is not square, or maps of another size than the
scan) ``symmetry_average=None`` runs the single pass and ``True`` is refused in one line.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from stage.symmetry import OPS, turn_stacks, unturn_maps

__all__ = ["averaged_over_turns", "transposed_calibration", "SymmetryAverageError"]

#: the calibration fields that are (y, x) pairs: a transposing turn swaps them
_YX_FIELDS = ("scan_shape", "k_sampling_invA", "scan_step_A", "shift_frac")


class SymmetryAverageError(ValueError):
    """``symmetry_average=True`` asked of a stack whose grids the turns do not map onto themselves."""


def _swap(pair: Any) -> Any:
    return None if pair is None else (list(pair)[::-1] if isinstance(pair, list) else tuple(pair)[::-1])


def transposed_calibration(calibration: Any) -> Any:
    """``calibration`` (a `namsa.icom.ScanCalibration`, its dict, or None) of the transposed experiment:
    every (y, x) pair swapped."""
    if calibration is None:
        return None
    if isinstance(calibration, dict):
        return {k: (_swap(v) if k in _YX_FIELDS else v) for k, v in calibration.items()}
    return dataclasses.replace(calibration, **{k: _swap(getattr(calibration, k)) for k in _YX_FIELDS})


def averaged_over_turns(predict: Callable[[np.ndarray, bool], np.ndarray], stacks: np.ndarray,
                        required: bool) -> tuple[np.ndarray, int]:
    """(the mean over the 8 turns of ``predict``'s (B, C, T, T) maps of the turned (B, S, P, P) ``stacks``,
    each turned back; how many turns were averaged). ``predict(stacks, transposed)``: ``transposed`` says
    the turn swapped y and x (the pass needs the swapped calibration). Stacks whose scan is not square or
    whose maps are not the scan's size get the single pass (``required``: a `SymmetryAverageError`)."""
    single = predict(stacks, False)
    n = math.isqrt(stacks.shape[1])
    if not (n * n == stacks.shape[1] and single.shape[-2:] == (n, n) and stacks.shape[-1] == stacks.shape[-2]):
        if required:
            raise SymmetryAverageError(
                f"symmetry averaging needs a square scan, square patterns and maps of the scan's size; this model "
                f"maps {stacks.shape[1]} patterns of {list(stacks.shape[-2:])} px to {list(single.shape[-2:])} "
                f"maps: pass symmetry_average=None or False")
        return single, 1
    total = single.astype(np.float64)
    for op in OPS[1:]:   # OPS[0] is the identity (tests/test_symmetry_average.py): the single pass above
        total += unturn_maps(op, predict(turn_stacks(op, stacks), op.transpose))
    return (total / len(OPS)).astype(np.float32), len(OPS)

