"""One training batch of a resident set, made on its device: gather, symmetry, shot noise, transform.

The streaming path's steps (`stage.dataset`, `stage.symmetry`, `stage.device_noise`,
`stage.normalize`), done on the batch as a whole on the device that holds the set:
- gather: the batch's rows of the resident ``cbed`` (R, S, P, P) and ``target`` (R, C, T, T);
- symmetry: sample b turned by operation ``ops[b]`` of `stage.symmetry.OPS`. Every operation is a
  permutation of the scan positions and, independently, of each pattern's pixels (and of the
  maps' pixels), so `SymmetryTables` holds, per operation, the source index of each output scan
  position (S), pattern pixel (P * P) and map pixel (T * T), made by applying the operation of
  `stage.symmetry` (`turn_stacks`, `turn_maps`) to index arrays; the gather and the turn are then
  one indexing of the resident tensor;
- noise: Poisson counts at ``electrons[b]`` per probe position (0: clean), one draw for the batch
  (`stage.device_noise.add_shot_noise_batch`), after the turn (independent pixels: the same law);
- camera: the noisy samples drawn for it recorded through an integrating camera
  (`stage.camera_augmentation.camera_batch`: blur, read noise from the same generator, clip, total);
- transform: the `Normalizer`'s input transform and standardisation, as `batch_to_device` does.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from .camera_augmentation import camera_batch
from .device_noise import add_shot_noise_batch
from .normalize import Normalizer
from .symmetry import OPS, turn_maps, turn_stacks


class SymmetryTables:
    """Per operation of `OPS` (in that order), on ``device``: ``scan`` (8, S), ``pixel`` (8, P * P)
    and ``maps`` (8, T * T) int64, each output element's source index (square scan, S = n * n)."""

    def __init__(self, stack_shape: tuple[int, ...], map_shape: tuple[int, ...], device: torch.device | str):
        s, p, _ = stack_shape
        t = map_shape[-1]
        if math.isqrt(s) ** 2 != s:
            raise ValueError(f"symmetry tables need a square scan; the stack holds {s} patterns")
        scan = [turn_stacks(op, np.arange(s).reshape(s, 1, 1)).ravel() for op in OPS]
        pixel = [turn_stacks(op, np.arange(p * p).reshape(1, p, p)).ravel() for op in OPS]
        maps = [np.ascontiguousarray(turn_maps(op, np.arange(t * t).reshape(t, t))).ravel() for op in OPS]
        self.scan, self.pixel, self.maps = (torch.from_numpy(np.stack(a).astype(np.int64)).to(device)
                                            for a in (scan, pixel, maps))


class BatchDraws(NamedTuple):
    """What a batch draws, on the set's device: ``ops`` (B,) int64 indices into `OPS` (None: no
    turn), ``electrons`` (B,) float32 (None: all clean), the ``generator`` of the counts (and of the
    cameras' read noise) and ``camera`` (None: none), the (B,) tensors (seen bool, sigma_px, read_noise_e)
    of `stage.camera_augmentation.camera_batch`."""

    ops: torch.Tensor | None = None
    electrons: torch.Tensor | None = None
    generator: torch.Generator | None = None
    camera: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


def gather(cbed: torch.Tensor, target: torch.Tensor, rows: torch.Tensor, ops: torch.Tensor | None = None,
           tables: SymmetryTables | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``rows`` (B,) of ``cbed`` (R, S, P, P) and ``target`` (R, C, T, T), each turned by its
    operation ``ops`` (B,) through ``tables`` (None: as held). New tensors, dtypes kept."""
    if ops is None:
        return cbed.index_select(0, rows), target.index_select(0, rows)
    r, s, p, _ = cbed.shape
    c, t = target.shape[1], target.shape[-1]
    b = rows.numel()
    at = rows.view(b, 1, 1)
    x = cbed.view(r, s, p * p)[at, tables.scan[ops].view(b, s, 1), tables.pixel[ops].view(b, 1, p * p)]
    channels = torch.arange(c, device=target.device).view(1, c, 1)
    y = target.view(r, c, t * t)[at, channels, tables.maps[ops].view(b, 1, t * t)]
    return x.view(b, s, p, p), y.view(b, c, t, t)


def make_batch(cbed: torch.Tensor, target: torch.Tensor, rows: torch.Tensor, draws: BatchDraws,
               tables: SymmetryTables | None, normalizer: Normalizer, storage_scale: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The training step's (x, y) for ``rows`` of a resident set: x float32 (B, S, P, P) normalised
    input, y float32 (B, C, T, T) standardised targets, on the set's device (see the module docstring)."""
    x, y = gather(cbed, target, rows, draws.ops, tables)
    x = x.float()
    if draws.electrons is not None:
        x = add_shot_noise_batch(x, draws.electrons, draws.generator, storage_scale)
        if draws.camera is not None:
            seen, sigma, read = draws.camera
            x = camera_batch(x, draws.electrons, sigma, read, seen & (draws.electrons > 0), draws.generator,
                             storage_scale)
    return normalizer.cbed(x, stored_scale=storage_scale), y


__all__ = ["SymmetryTables", "BatchDraws", "gather", "make_batch"]
