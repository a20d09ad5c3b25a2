"""What reconstructing a scan holds in memory at least, known from its header before anything is read.

A file's size says nothing about it: deflate packs a scan of few counts 200:1 (an 18 MB .hspy held
4 GiB of float32), so the bytes come from the 4-D dataset's shape and dtype. The scan is never held
whole (it is read a block of whole model tiles at a time, workflow.reconstruct), but two reads have
a least size whatever ``--memory-gb`` asks: a block holds at least one tile of the model's patterns
as stored, and the checks before inference (stage.microscope.checks, autocal) hold float64
temporaries of at least one pattern. `memory_problem` compares the larger with the data blocks'
budget and says, in one line, what makes the scan fit: patterns cropped or binned to fewer pixels,
or a larger ``--memory-gb`` where the machine has it.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .autocal import BLOCK_TEMPORARIES

GIB = 2**30


def tile_positions(shape: tuple[int, ...], tile_shape: tuple[int, int]) -> int:
    """Probe positions of the smallest block: one tile, or the whole scan when it is smaller."""
    return min(tile_shape[0], shape[0]) * min(tile_shape[1], shape[1])


def least_held(shape: tuple[int, ...], dtype: Any, tile_shape: tuple[int, int]) -> tuple[int, int]:
    """(bytes of one tile's patterns as stored, bytes of the checks' float64 temporaries of one
    pattern) of a (scan_y, scan_x, ky, kx) dataset of ``dtype`` read by a model with ``tile_shape``
    positions per tile."""
    pattern = shape[2] * shape[3]
    return tile_positions(shape, tile_shape) * pattern * np.dtype(dtype).itemsize, BLOCK_TEMPORARIES * pattern * 8


def memory_problem(scan: Any, tile_shape: tuple[int, int], detector: tuple[int, tuple[float, float]],
                   memory_gb: float, share: float, machine_bytes: float) -> str | None:
    """Why ``scan`` (a RawScan: its path, and data with a shape and dtype) cannot be reconstructed
    within ``--memory-gb`` ``memory_gb``, whose fraction ``share`` is the data blocks' budget, or
    None. ``detector``: the model's (pattern side px, (lowest, highest) detector pixel 1/Angstrom);
    ``machine_bytes``: this machine's memory."""
    shape, dtype = tuple(scan.data.shape), np.dtype(scan.data.dtype)
    tile, checks = least_held(shape, dtype, tile_shape)
    budget = min(memory_gb * GIB * share, machine_bytes)  # a --memory-gb above the machine's buys nothing
    if max(tile, checks) <= budget:
        return None
    n = tile_positions(shape, tile_shape)
    what = (f"{n} patterns as stored: the model's {tile_shape[0]} x {tile_shape[1]}-position tile" if tile >= checks
            else f"the checks' {BLOCK_TEMPORARIES} float64 copies of one pattern")
    limit = (f"this machine has {machine_bytes / GIB:.3g} GiB in all" if budget == machine_bytes else
             f"--memory-gb {memory_gb:g} gives the data blocks {budget / GIB:.3g} GiB ({share:.0%} of it)")
    whole = math.prod(shape) * dtype.itemsize
    return (f"{scan.path}: its {' x '.join(map(str, shape))} {dtype} scan ({whole / GIB:.3g} GiB decompressed, read a "
            f"block at a time) needs at least {max(tile, checks) / GIB:.3g} GiB at once ({what}) but {limit}; "
            + " or ".join(_advice(dtype, n, detector, max(tile, checks), budget, share, machine_bytes)))


def _advice(dtype: np.dtype, positions: int, detector: tuple[int, tuple[float, float]], need: int, budget: float,
            share: float, machine_bytes: float) -> list[str]:
    """What makes the scan fit: patterns cropped or binned to a side the budget holds (when that is
    no fewer pixels than the model's), and the --memory-gb that holds it as it is, if the machine has it."""
    options = []
    side = math.isqrt(int(min(budget // (positions * dtype.itemsize), budget // (BLOCK_TEMPORARIES * 8))))
    pattern_px, (lo, hi) = detector
    if side >= pattern_px:  # which of crop and bin keeps the model's detector depends on the file's pixel size
        options.append(f"crop or bin its patterns to at most {side} x {side} px (the model reads {pattern_px} x "
                       f"{pattern_px} px of {lo:.3g}-{hi:.3g} 1/Angstrom around k = 0)")
    needed_gb = math.ceil(need / (GIB * share) * 10) / 10
    if needed_gb * GIB <= machine_bytes:
        options.append(f"pass --memory-gb {needed_gb:g}")
    else:
        options.append(f"run it on a machine with at least {needed_gb:g} GB (this one has {machine_bytes / GIB:.3g})")
    return options
