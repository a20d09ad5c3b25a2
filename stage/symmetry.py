"""The square group's 8 rotations/mirrors of a whole experiment: drawn in the loader as augmentation,
and averaged over at prediction (`models.symmetry_average`, with `turn_stacks` / `unturn_maps`).

Turning (or mirroring) the whole experiment about the beam axis turns everything it records
together: the probe positions, every diffraction pattern and the projected maps. For a round
probe (namsa's aberrations C1 and C3 are round) the specimen rotated by g, scanned at g r, gives
the pattern I'(g r, g k) = I(r, k), and its maps are V'(g r) = V(r). A sample's beam tilt turns
with it, so the augmented sample is the simulation of the turned specimen under the turned tilt.

An operation is a permutation of the stored grids (``OPS``: transpose or not, then flip rows or
not, then flip columns or not), so intensities, their totals and the float16 storage scale are
untouched. The same array operation acts on
- the scan axes: the stack's first axis is (scan_y, scan_x) row-major; scan positions
  y0 + i dy (i = 0..n-1) turn about their centre y0 + (n - 1) dy / 2 (index i -> n - 1 - i);
- the target maps [y, x], T x T over the same field of view with the same endpoint-exclusive
  convention, so T must equal the scan size: then both grids share that centre;
- the patterns [ky, kx], k = 0 at index P // 2: index i -> 2 (P // 2) - i, taken modulo P. For
  odd P that is i -> P - 1 - i. For even P the row and column at index 0 (ky or kx = -P/2 dk,
  the band limit's edge, where only a sliver of intensity lies) have no partner at +P/2 dk on the
  stored grid; modulo P they map onto themselves, so the edge sliver at -k stands in for the
  unstored one at +k. Every other pixel is exact.

Where the physics allows: a square scan whose size equals the target size (else the grids do
not map onto themselves: refused with a `UserError` naming the shapes); a transpose (a 90 degree
rotation or a diagonal mirror) only where the scan steps are equal, dy = dx, else a sample gets
one of the 4 operations that keep the axes (identity, the two flips, the half turn).
Reproducible from the seed: the operation of a sample depends only on (seed, epoch, sample id),
as the dose of `stage.dose` does, on a stream of its own.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from namsa.errors import UserError
from namsa.random_streams import AugmentationStream
from namsa.sample_meta import SampleMeta

from .config import SymmetryAugmentationConfig
from .dose import augmentation_rng


class SymmetryOp(NamedTuple):
    """Transpose the two axes (y <-> x), then reverse y, then reverse x (about each grid's centre)."""

    transpose: bool
    flip_y: bool
    flip_x: bool


#: the 8 elements of the square group; the first 4 keep the axes (the rectangle's group)
OPS: tuple[SymmetryOp, ...] = tuple(SymmetryOp(t, fy, fx) for t in (False, True) for fy in (False, True)
                                    for fx in (False, True))
#: relative difference below which two scan steps count as equal
EQUAL_STEP_RTOL = 1e-9


def _pattern_reversal(p: int) -> np.ndarray:
    """Index map of k -> -k on a pattern axis of ``p`` pixels with k = 0 at index p // 2."""
    return (2 * (p // 2) - np.arange(p)) % p


def _apply(grid: np.ndarray, op: SymmetryOp, axes: tuple[int, int], reversal: np.ndarray | None) -> np.ndarray:
    """``grid`` with ``op`` applied to its two ``axes`` (square); ``reversal`` the index map of a
    reversed axis (None: about the array centre, i -> n - 1 - i)."""
    out = np.swapaxes(grid, *axes) if op.transpose else grid
    for axis, flip in zip(axes, (op.flip_y, op.flip_x)):
        if flip:
            out = np.flip(out, axis) if reversal is None else np.take(out, reversal, axis=axis)
    return out


def turn_stacks(op: SymmetryOp, cbed: np.ndarray) -> np.ndarray:
    """A new array: ``op`` applied to (..., S, P, P) stacks of a square scan (S = n * n, row-major) and
    their patterns, as the module docstring says."""
    n = math.isqrt(cbed.shape[-3])
    p = cbed.shape[-1]
    grid = cbed.reshape(*cbed.shape[:-3], n, n, p, p)
    k = grid.ndim
    turned = _apply(_apply(grid, op, (k - 4, k - 3), None), op, (k - 2, k - 1), _pattern_reversal(p))
    return np.ascontiguousarray(turned).reshape(cbed.shape)


def turn_maps(op: SymmetryOp, maps: np.ndarray) -> np.ndarray:
    """``op`` applied to square (..., y, x) maps (a view where numpy allows)."""
    return _apply(maps, op, (maps.ndim - 2, maps.ndim - 1), None)


def unturn_maps(op: SymmetryOp, maps: np.ndarray) -> np.ndarray:
    """The inverse of `turn_maps`: the flips undone (each is its own inverse), then the transpose."""
    axes = (maps.ndim - 2, maps.ndim - 1)
    return _apply(_apply(maps, op._replace(transpose=False), axes, None), SymmetryOp(op.transpose, False, False),
                  axes, None)


def apply_op(op: SymmetryOp, cbed: np.ndarray, maps: list[np.ndarray]) -> None:
    """Apply ``op`` in place to the (S, P, P) stack of a square scan and to each square [y, x] map of
    ``maps`` (see the module docstring for the conventions; `allowed_ops` refuses other grids first)."""
    cbed[...] = turn_stacks(op, cbed)
    for target in maps:
        target[...] = turn_maps(op, target).copy()   # copied first: a view of target itself


def allowed_ops(meta: SampleMeta, cbed_shape: tuple[int, ...], map_shape: tuple[int, ...]) -> tuple[SymmetryOp, ...]:
    """The operations the physics allows for a sample: all 8 with equal scan steps, the 4 that
    keep the axes otherwise; a `UserError` where the grids cannot map onto themselves."""
    scan_y, scan_x = meta.scan_shape
    patterns_square = len(cbed_shape) == 3 and cbed_shape[0] == scan_y * scan_x and cbed_shape[1] == cbed_shape[2]
    if scan_y != scan_x or tuple(map_shape) != (scan_y, scan_x) or not patterns_square:
        raise UserError(f"data.symmetry_augmentation needs a square scan, square patterns and targets of the scan's "
                        f"size (so rotations map them onto themselves); sample {meta.sample_id} has scan "
                        f"{scan_y}x{scan_x}, patterns {list(cbed_shape[1:])}, targets {list(map_shape)}: set "
                        f"data.symmetry_augmentation.enabled false, or simulate with scan_shape [n, n] and target_px n")
    _, _, height, width = (float(v) for v in meta.fov_A)
    equal_steps = abs(height - width) <= EQUAL_STEP_RTOL * max(height, width)
    return OPS if equal_steps else OPS[:4]


class SymmetryAugmentation:
    """Applies a `SymmetryAugmentationConfig` to one sample at a time (see the module docstring)."""

    def __init__(self, cfg: SymmetryAugmentationConfig):
        self.cfg = cfg

    def draw(self, meta: SampleMeta, epoch: int, ops: tuple[SymmetryOp, ...]) -> SymmetryOp:
        """This (epoch, sample)'s operation, uniform over ``ops``; its own stream, apart from the dose's."""
        rng = augmentation_rng(self.cfg.seed, epoch, meta.sample_id, AugmentationStream.SYMMETRY)
        return ops[int(rng.integers(len(ops)))]

    def apply(self, cbed: np.ndarray, maps: list[np.ndarray], meta: SampleMeta, epoch: int) -> SymmetryOp:
        """Draw this (epoch, sample)'s operation and apply it in place to ``cbed`` and ``maps``."""
        map_shape = maps[0].shape if maps else (meta.scan_shape[0],) * 2
        op = self.draw(meta, epoch, allowed_ops(meta, cbed.shape, map_shape))
        apply_op(op, cbed, maps)
        return op
