"""The augmentation draws of a resident training set (``data.resident``), one epoch at a time, ahead.

A resident set (`stage.resident`) draws each sample's symmetry operation and dose exactly as the
streaming path does: from (seed, epoch, sample id) through `stage.dose.augmentation_rng`
(`DoseAugmentation.device_draw` for the dose, `SymmetryAugmentation.draw` over the operations
`stage.symmetry.allowed_ops` gives the sample), so a sample gets the same operation and dose on
either path. Those draws cost tens of microseconds a sample on the host (numpy's SeedSequence),
too much to pay inside a step; `DrawsAhead` computes a whole epoch's on one background thread while
the previous epoch trains, and the loader uploads them to the device once per epoch.

The Poisson counts themselves are drawn on the device, one generator per batch
(`batch_noise_seed`), not per sample: the counts of a batch depend on (dose seed, the batch's
ordinal in the run, rank), so a run, and a resumed run, draws the same counts; they follow the law
of the host path (Poisson(N I) per pixel) but are other draws. With ``data.camera_augmentation`` each
noisy sample's camera (whether it is seen through one, its point spread and read noise) is drawn the
host path's way too (`stage.camera_augmentation.CameraAugmentation.draw`); its read noise is drawn on
the device from the batch's generator, after the counts.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from namsa.random_streams import TrainingStream, training_seed
from namsa.sample_meta import SampleMeta

from .camera_augmentation import CameraAugmentation
from .config import CameraAugmentationConfig, DoseAugmentationConfig, SymmetryAugmentationConfig
from .dose import DoseAugmentation
from .symmetry import OPS, SymmetryAugmentation, allowed_ops

#: the background thread releases the GIL after every this many samples, for YIELD_S seconds, so the
#: training thread, which needs it to launch kernels, never waits a switch interval (5 ms) for it
YIELD_EVERY, YIELD_S = 8, 1e-4


class Draws(NamedTuple):
    """One epoch's draws per dataset position (positions not resident: 0 and 0).

    electrons: float32, the electrons per probe position N = dose * dy * dx (0: delivered clean);
    ops:       int64, the index into `stage.symmetry.OPS` of the operation (0: identity);
    seen:      bool, whether a noisy sample is seen through the camera (all False without camera augmentation);
    sigma_px, read_noise_e: float32, its camera's point spread (model pattern pixels) and read noise
               (electrons per pixel), 0 where not seen."""

    electrons: np.ndarray
    ops: np.ndarray
    seen: np.ndarray
    sigma_px: np.ndarray
    read_noise_e: np.ndarray


class EpochDraws:
    """The draws of ``metas`` (one per position in ``positions``, from `SampleDataset.position_metas`)
    for any epoch; ``dose`` / ``symmetry`` None or disabled: none drawn (all clean / identity).
    ``stack_shape`` (S, P, P) and ``map_shape`` (T, T) are the stored grids: a sample whose grids the
    operations cannot map onto themselves is refused here with `stage.symmetry.allowed_ops`'s line.
    ``camera`` (enabled, with ``dose``): the cameras of the noisy samples are drawn too."""

    def __init__(self, size: int, positions: Sequence[int], metas: Sequence[SampleMeta],
                 dose: DoseAugmentationConfig | None, symmetry: SymmetryAugmentationConfig | None,
                 stack_shape: tuple[int, ...], map_shape: tuple[int, ...],
                 camera: CameraAugmentationConfig | None = None):
        self.size = int(size)
        self.positions = list(positions)
        self.metas = list(metas)
        self.dose = DoseAugmentation(dose) if dose is not None and dose.enabled else None
        self.symmetry = SymmetryAugmentation(symmetry) if symmetry is not None and symmetry.enabled else None
        with_camera = self.dose is not None and camera is not None and camera.enabled
        self.camera = CameraAugmentation(camera) if with_camera else None
        #: per position, the operations its scan grid allows (all 8, or the 4 that keep the axes)
        self.allowed = ([allowed_ops(m, stack_shape, map_shape) for m in self.metas] if self.symmetry is not None
                        else [])

    @property
    def active(self) -> bool:
        """Whether anything is drawn (dose or symmetry augmentation on)."""
        return self.dose is not None or self.symmetry is not None

    def compute(self, epoch: int, pause: bool = False) -> Draws:
        """The draws of ``epoch``; ``pause``: release the GIL now and then (on a background thread)."""
        out = Draws(np.zeros(self.size, np.float32), np.zeros(self.size, np.int64), np.zeros(self.size, bool),
                    np.zeros(self.size, np.float32), np.zeros(self.size, np.float32))
        electrons, ops = out.electrons, out.ops
        for k, (position, meta) in enumerate(zip(self.positions, self.metas)):
            if self.dose is not None:
                dose, _ = self.dose.device_draw(meta, epoch)
                electrons[position] = 0.0 if dose is None else dose * meta.scan_step_area_A2
                if dose is not None and self.camera is not None:
                    self._draw_camera(out, position, meta, epoch)
            if self.symmetry is not None:
                ops[position] = OPS.index(self.symmetry.draw(meta, epoch, self.allowed[k]))
            if pause and k % YIELD_EVERY == YIELD_EVERY - 1:
                time.sleep(YIELD_S)
        return out

    def _draw_camera(self, out: Draws, position: int, meta: SampleMeta, epoch: int) -> None:
        """Fill ``out``'s camera fields at ``position`` with the host path's draw for (epoch, sample)."""
        draw, _ = self.camera.draw(meta, epoch)
        if draw is not None:
            out.seen[position] = True
            out.sigma_px[position], out.read_noise_e[position] = draw.sigma_px, draw.read_noise_e


class DrawsAhead:
    """`EpochDraws` of epoch e handed over when asked, and epoch e + 1 started on one background
    thread right then, so from the second epoch on the training thread never waits for them."""

    def __init__(self, draws: EpochDraws):
        self.draws = draws
        self._pending: dict[int, Future] = {}
        self._executor: ThreadPoolExecutor | None = None

    def get(self, epoch: int) -> Draws:
        """The draws of ``epoch`` (computed now unless a background thread has them), then the next
        epoch's begun in the background."""
        future = self._pending.pop(int(epoch), None)
        result = future.result() if future is not None else self.draws.compute(int(epoch))
        for stale in self._pending.values():
            stale.cancel()
        self._pending = {}
        if self.draws.active:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="resident-draws")
            self._pending[int(epoch) + 1] = self._executor.submit(self.draws.compute, int(epoch) + 1, True)
        return result

    def close(self) -> None:
        """Stop the background thread (a computation under way finishes first)."""
        for future in self._pending.values():
            future.cancel()
        self._pending = {}
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


def batch_noise_seed(seed: int, ordinal: int, rank: int, world_size: int) -> int:
    """The torch seed of the Poisson counts of one resident training batch: ``seed`` the dose
    augmentation's, ``ordinal`` the batch's number in the run (epoch * batches per epoch + batch),
    on its own stream of `namsa.random_streams` (`TrainingStream.BATCH_SHOT_NOISE`)."""
    return training_seed(seed, TrainingStream.BATCH_SHOT_NOISE, ordinal, rank, world_size)


__all__ = ["Draws", "EpochDraws", "DrawsAhead", "batch_noise_seed"]
