"""Scan tiles with overlap and their seamless stitching (`namsa reconstruct` on scans of any size).

A model reconstructs a fixed ``scan_shape`` block of probe positions into a (T, T) map. A larger
scan is cut into such tiles with a stride smaller than the tile (they overlap), each tile's map is
weighted by a separable window and the weighted maps are summed and divided by the summed weights.

The window, per axis: at a tile border where a neighbouring tile continues the scan, weight 0 on
the ``margin`` pixels next to the border, then a raised-cosine ramp across the rest of the overlap
(the two tiles' ramps sum to 1), then 1. The margin is the network's reach into a tile from its
border (`tile_margin`): a scan-layout network pads the scan axes, so a pixel that close to a tile
border sees zeros or, with circular padding, the tile's opposite side, never the scan that
continues there; with the margin the stitched map's interior comes only from pixels that saw the
scan itself, whatever the padding. At the outer border of the whole scan only one tile covers the
map (weight 1 there): its outer ``margin`` pixels still depend on the padding, as nothing lies
beyond the scan. Tiles are processed in blocks that fit a memory budget, so memory does not grow
with the scan.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from stage.microscope.errors import ExperimentalInputError

from ..config import Architecture
from ..fcdensenet import edge_reach

#: the margin is capped at 1 / MARGIN_CAP of a tile: with half-tile strides the trusted parts of
#: neighbouring tiles (all but the margin at each inner border) still meet
MARGIN_CAP = 4


@dataclass(frozen=True)
class TileGrid:
    """Where the tiles lie: origins (in probe positions of the fitted scan) per axis, the tile's
    ``scan_shape`` (positions), ``target_px`` (map pixels per tile side) and ``margin`` (map pixels at
    each inner tile border that the blending ignores)."""

    origins_y: tuple[int, ...]
    origins_x: tuple[int, ...]
    scan_shape: tuple[int, int]
    target_px: int
    margin: int = 0

    @property
    def covered(self) -> tuple[int, int]:
        """Probe positions covered by the tiles, (y, x) from position 0."""
        return self.origins_y[-1] + self.scan_shape[0], self.origins_x[-1] + self.scan_shape[1]

    @property
    def map_shape(self) -> tuple[int, int]:
        """(H, W) pixels of the stitched maps."""
        return tuple(self.pixel(n, axis) for axis, n in enumerate(self.covered))  # type: ignore[return-value]

    def pixel(self, position: int, axis: int) -> int:
        """The map pixel where probe position ``position`` along ``axis`` (0 = y, 1 = x) begins."""
        return position * self.target_px // self.scan_shape[axis]


def tile_margin(arch: Architecture, tile_px: int) -> int:
    """Map pixels at a tile's inner border to ignore for a network ``arch`` with ``tile_px`` maps: in
    the scan layout its `edge_reach` (the same for zeros and circular padding: neither is the scan
    beyond the tile), capped at tile_px // MARGIN_CAP; 0 in the patterns layout, whose convs pad
    the detector axes (every map pixel sees the whole tile)."""
    return 0 if arch.input_layout != "scan" else min(edge_reach(arch), tile_px // MARGIN_CAP)


def tile_grid(scan: tuple[int, int], scan_shape: tuple[int, int], target_px: int, margin: int = 0) -> TileGrid:
    """Tiles over a ``scan`` (y, x) of fitted probe positions: stride about half a tile (whole map
    pixels; less if neighbours would overlap by under 2 ``margin`` px), the last tile flush with the
    scan's end when its origin falls on whole map pixels. ``margin``: `tile_margin`."""
    return TileGrid(origins_y=_origins(scan[0], scan_shape[0], target_px, margin),
                    origins_x=_origins(scan[1], scan_shape[1], target_px, margin),
                    scan_shape=scan_shape, target_px=target_px, margin=margin)


def _origins(n: int, size: int, target_px: int, margin: int) -> tuple[int, ...]:
    """Tile origins along one axis; an origin times target_px / size must be a whole pixel."""
    unit = size // math.gcd(size, target_px)  # positions per whole map pixel step
    # the widest stride whose overlap keeps both tiles' margins: (target_px - stride_px) >= 2 margin
    widest = (target_px - 2 * margin) // (unit * target_px // size) * unit
    if widest < unit:
        raise ValueError(f"a margin of {margin} px leaves no overlap to blend {target_px} px tiles")
    stride = min(widest, max(unit, (size // 2) // unit * unit))
    last = (n - size) // unit * unit
    origins = list(range(0, last + 1, stride))
    if origins[-1] != last:
        origins.append(last)
    return tuple(origins)


def axis_windows(origins: tuple[int, ...], size: int, margin: int) -> list[np.ndarray]:
    """The 1-D window of each tile along one axis, tiles at map pixel ``origins`` of ``size`` px:
    0 on the ``margin`` px at a border a neighbour overlaps, a raised-cosine ramp across the rest of
    that overlap, 1 elsewhere (the outer borders of the scan included)."""
    windows = []
    for i, origin in enumerate(origins):
        w = np.ones(size)
        if i > 0:
            w *= _ramp(size, origins[i - 1] + size - origin, margin)
        if i < len(origins) - 1:
            w *= _ramp(size, origin + size - origins[i + 1], margin)[::-1]
        windows.append(w)
    return windows


def _ramp(size: int, overlap: int, margin: int) -> np.ndarray:
    """0 on the first ``margin`` px, sin^2 rising over the next ``overlap - 2 margin`` px, then 1:
    the neighbour's mirrored ramp over the same pixels is its complement (sin^2 + cos^2)."""
    width = overlap - 2 * margin
    t = np.arange(size) - margin + 0.5
    u = np.clip(t / width, 0.0, 1.0) if width > 0 else (t > 0).astype(float)
    return np.sin(0.5 * np.pi * u) ** 2


class Stitcher:
    """Sums window-weighted tile maps (C, T, T) into (C, H, W) and divides by the summed weights."""

    def __init__(self, channels: int, grid: TileGrid) -> None:
        self.grid = grid
        self.sum = np.zeros((channels, *grid.map_shape), dtype=np.float64)
        self.weight = np.zeros(grid.map_shape, dtype=np.float64)
        t, m = grid.target_px, grid.margin
        self.windows = [dict(zip(origins, axis_windows(tuple(grid.pixel(o, axis) for o in origins), t, m)))
                        for axis, origins in enumerate((grid.origins_y, grid.origins_x))]

    def add(self, maps: np.ndarray, origin: tuple[int, int]) -> None:
        """Add one tile's (C, T, T) maps whose tile starts at probe position ``origin`` (y, x)."""
        y, x = self.grid.pixel(origin[0], 0), self.grid.pixel(origin[1], 1)
        t = self.grid.target_px
        if np.shape(maps) != (self.sum.shape[0], t, t):  # the model's maps are not what its card said
            raise ExperimentalInputError(f"the model returned maps of shape {list(np.shape(maps))} for a tile, but its "
                                         f"card expects {[self.sum.shape[0], t, t]} (targets, target_px, target_px); "
                                         "its card and weights disagree: re-export or re-download the model")
        window = np.outer(self.windows[0][origin[0]], self.windows[1][origin[1]])
        self.sum[:, y:y + t, x:x + t] += maps * window
        self.weight[y:y + t, x:x + t] += window

    def result(self) -> np.ndarray:
        """(C, H, W) float32 blended maps."""
        return (self.sum / self.weight).astype(np.float32)


@dataclass(frozen=True)
class Block:
    """A run of tiles of one tile row read together: probe rows [y0, y1), columns [x0, x1) of the
    fitted scan, and the origins (y, x) of its tiles."""

    y0: int
    y1: int
    x0: int
    x1: int
    origins: tuple[tuple[int, int], ...]


def blocks(grid: TileGrid, bytes_per_position: int, budget_bytes: int) -> Iterator[Block]:
    """Blocks of whole tiles, row by row of tiles, each at most ``budget_bytes`` when read (at
    least one tile, whatever the budget: the model needs a whole tile)."""
    sy, sx = grid.scan_shape
    for oy in grid.origins_y:
        start = 0
        xs = grid.origins_x
        while start < len(xs):
            end = start + 1
            while end < len(xs) and sy * (xs[end] + sx - xs[start]) * bytes_per_position <= budget_bytes:
                end += 1
            yield Block(y0=oy, y1=oy + sy, x0=xs[start], x1=xs[end - 1] + sx,
                        origins=tuple((oy, ox) for ox in xs[start:end]))
            start = end
