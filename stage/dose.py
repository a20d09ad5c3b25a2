"""Dose as augmentation: Poisson shot noise drawn in the loader at a random electron dose.

Clean patterns are stored once; each time a training sample is read, a dose D (electrons per
Angstrom^2) is drawn over ``DoseAugmentationConfig.dose_range_e_per_A2`` (or, with probability
``clean_fraction``, none: the pattern stays noise-free). A scan whose probe positions lie on a grid
of step (dy, dx) Angstrom puts N = D * dy * dx electrons into each position, so a pattern of
intensities I (total 1 per pattern: the Sample contract) becomes counts ~ Poisson(N * I) per
detector pixel, delivered as counts / N: the same intensity scale as the clean pattern, mean I,
variance I / N. This is the convention of `namsa.detector.poisson_noise` (the simulator's own
``variations.dose_e_per_A2``), so a dose here means what it means there and in evaluation.

Reproducible from the seed: the dose and the noise of a sample depend only on (seed, epoch,
sample id), through ``numpy.random.SeedSequence([seed, epoch, *sha256(sample id)])``, never on
the worker, the thread or the order in which samples are read. The sample id (not its position
in a dataset) keys the stream, so a sample staged to another store or shard gets the same noise.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np

from namsa.random_streams import AugmentationStream
from namsa.sample_meta import SampleMeta

from .config import DoseAugmentationConfig

#: detector pixels drawn per chunk: bounds the float64 temporaries of a paper-sized stack
#: (1024 x 256 x 256 pixels) to ~8 MiB each.
CHUNK_PIXELS = 1 << 20


def augmentation_rng(seed: int, epoch: int, sample_id: str,
                     stream: AugmentationStream = AugmentationStream.DOSE) -> np.random.Generator:
    """The random ``stream`` of one sample in one epoch: a function of (seed, epoch, sample id) only
    (the streams are numbered in namsa.random_streams)."""
    digest = hashlib.sha256((stream.value + sample_id).encode()).digest()
    words = np.frombuffer(digest, dtype=np.uint32).tolist()
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch), *words]))


def draw_dose(cfg: DoseAugmentationConfig, rng: np.random.Generator) -> float | None:
    """A dose in electrons/A^2 over the configured range, or None (noise-free) with probability
    ``cfg.clean_fraction``. Both numbers are always drawn, so the dose stream does not depend
    on the clean fraction's outcome."""
    clean = rng.random() < cfg.clean_fraction
    low, high = cfg.dose_range_e_per_A2
    u = rng.random()
    if cfg.log_uniform:
        dose = math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
    else:
        dose = low + u * (high - low)
    # exp(log(x)) may round past a bound; a range of one dose gives exactly that dose
    return None if clean else min(max(dose, low), high)


def add_shot_noise(cbed: np.ndarray, electrons: float, rng: np.random.Generator, scale: float = 1.0) -> None:
    """Replace ``cbed`` (..., P, P) in place by counts / ``electrons`` with counts ~
    Poisson(``electrons`` * I), where I = cbed / ``scale`` are the intensities (total 1 per
    pattern; ``scale`` is the storage scale of float16 stores) and the result keeps that scale.
    Works on float16 or float32 buffers; negative rounding residue counts as zero intensity, and
    a count beyond the buffer's largest value (a few electrons per pattern in a float16 buffer of
    scale 2^15) is clipped to it rather than becoming inf."""
    patterns = cbed.reshape(-1, *cbed.shape[-2:])
    step = max(1, CHUNK_PIXELS // (patterns.shape[1] * patterns.shape[2]))
    largest = float(np.finfo(cbed.dtype).max)
    for start in range(0, patterns.shape[0], step):
        chunk = patterns[start: start + step]
        lam = np.clip(chunk.astype(np.float64) * (electrons / scale), 0.0, None)
        chunk[...] = np.minimum(rng.poisson(lam) * (scale / electrons), largest)


class DoseAugmentation:
    """Applies a `DoseAugmentationConfig` to one sample's stack at a time (see the module docstring)."""

    def __init__(self, cfg: DoseAugmentationConfig):
        self.cfg = cfg

    def apply(self, cbed: np.ndarray, meta: SampleMeta, epoch: int, scale: float = 1.0) -> float | None:
        """Draw this (epoch, sample)'s dose and noise ``cbed`` in place; returns the dose
        (electrons/A^2) or None when it stays clean. A sample simulated with noise already
        (meta ``dose_e_per_A2`` set) is left as stored: noise is never drawn twice."""
        if meta.dose_e_per_A2 is not None:
            return None
        rng = augmentation_rng(self.cfg.seed, epoch, str(meta.sample_id))
        dose = draw_dose(self.cfg, rng)
        if dose is not None:
            add_shot_noise(cbed, dose * meta.scan_step_area_A2, rng, scale)
        return dose

    def device_draw(self, meta: SampleMeta, epoch: int) -> tuple[float | None, int]:
        """For noise drawn on the training device (``on_device``): the dose `apply` would draw for
        this (epoch, sample), or None (clean, or noisy as simulated), and a seed for the torch
        generator of its counts, drawn next from the same (seed, epoch, sample id) stream."""
        if meta.dose_e_per_A2 is not None:
            return None, 0
        rng = augmentation_rng(self.cfg.seed, epoch, str(meta.sample_id))
        dose = draw_dose(self.cfg, rng)
        return dose, int(rng.integers(0, 2 ** 63, dtype=np.int64))
