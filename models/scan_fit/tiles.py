"""Scan tiles with overlap and their seamless stitching (`namsa reconstruct` on scans of any size).

A model reconstructs a fixed ``scan_shape`` block of probe positions into a (T, T) map. A larger
scan is cut into such tiles with a stride smaller than the tile (they overlap), each tile's map is
weighted by a separable raised-cosine (Hann) window and the weighted maps are summed and divided by
the summed weights: a tile's edge, where a network sees least context, counts least, and there is
no step where one tile ends. Tiles are processed in blocks that fit a memory budget, so memory does
not grow with the scan.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from stage.microscope.errors import ExperimentalInputError


@dataclass(frozen=True)
class TileGrid:
    """Where the tiles lie: origins (in probe positions of the fitted scan) per axis, the tile's
    ``scan_shape`` (positions) and ``target_px`` (map pixels per tile side)."""

    origins_y: tuple[int, ...]
    origins_x: tuple[int, ...]
    scan_shape: tuple[int, int]
    target_px: int

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


def tile_grid(scan: tuple[int, int], scan_shape: tuple[int, int], target_px: int) -> TileGrid:
    """Tiles over a ``scan`` (y, x) of fitted probe positions: stride about half a tile (whole map
    pixels), the last tile flush with the scan's end when its origin falls on whole map pixels."""
    return TileGrid(origins_y=_origins(scan[0], scan_shape[0], target_px),
                    origins_x=_origins(scan[1], scan_shape[1], target_px),
                    scan_shape=scan_shape, target_px=target_px)


def _origins(n: int, size: int, target_px: int) -> tuple[int, ...]:
    """Tile origins along one axis; an origin times target_px / size must be a whole pixel."""
    unit = size // math.gcd(size, target_px)  # positions per whole map pixel step
    stride = max(unit, (size // 2) // unit * unit)
    last = (n - size) // unit * unit
    origins = list(range(0, last + 1, stride))
    if origins[-1] != last:
        origins.append(last)
    return tuple(origins)


def hann_weights(size: int) -> np.ndarray:
    """(size, size) separable raised-cosine weights, positive everywhere (so a map edge that only
    one tile covers keeps that tile's values) and ~0 at a tile's border."""
    w = np.sin(np.pi * (np.arange(size) + 0.5) / size) ** 2
    return np.outer(w, w)


class Stitcher:
    """Sums window-weighted tile maps (C, T, T) into (C, H, W) and divides by the summed weights."""

    def __init__(self, channels: int, grid: TileGrid) -> None:
        self.grid = grid
        self.sum = np.zeros((channels, *grid.map_shape), dtype=np.float64)
        self.weight = np.zeros(grid.map_shape, dtype=np.float64)
        self.window = hann_weights(grid.target_px)

    def add(self, maps: np.ndarray, origin: tuple[int, int]) -> None:
        """Add one tile's (C, T, T) maps whose tile starts at probe position ``origin`` (y, x)."""
        y, x = self.grid.pixel(origin[0], 0), self.grid.pixel(origin[1], 1)
        t = self.grid.target_px
        if np.shape(maps) != (self.sum.shape[0], t, t):  # the model's maps are not what its card said
            raise ExperimentalInputError(f"the model returned maps of shape {list(np.shape(maps))} for a tile, but its "
                                         f"card expects {[self.sum.shape[0], t, t]} (targets, target_px, target_px); "
                                         "its card and weights disagree: re-export or re-download the model")
        self.sum[:, y:y + t, x:x + t] += maps * self.window
        self.weight[y:y + t, x:x + t] += self.window

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
