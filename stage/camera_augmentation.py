"""The camera as augmentation: a share of the noisy training samples seen through an integrating camera.

`namsa reconstruct` hands the network what a scintillator-coupled camera recorded (namsa.camera's
model) once its counts are restored (stage.microscope.counts_restore) and each tile is divided by its
mean total (models.scan_fit.normalise_tile). In electrons per pattern pixel that is

    x = max(0, G_sigma * c + n),   c ~ Poisson(N I) (the dose augmentation's counts),
                                   n ~ Normal(0, r^2) per pixel, G_sigma a Gaussian point spread,

whatever the gain: a gain divided out leaves r = read noise / gain electrons, and a gain kept (float
data) scales signal and read noise together, which the tile's normalisation removes. For one sample
(``CameraAugmentationConfig``) this module draws whether it is seen through the camera (probability
``integrating_fraction``), sigma (model pattern pixels) and r (electrons per pixel) uniformly over
their ranges, and applies, after the Poisson draw and before the input transform, on the stored
scale (intensity times ``scale``, counts c delivered as c / N):

1. blur: each pattern multiplied in Fourier space by MTF(f) = exp(-2 pi^2 sigma^2 |f|^2), f in cycles
   per pixel (periodic, as namsa.camera's scintillator; it keeps each pattern's total);
2. read noise: + Normal(0, r / N) per pixel;
3. clip: negatives set to 0, as counts_restore does (it lifts the dark field by ~0.4 r a pixel);
4. total: the stack scaled back to the mean total per pattern it had after step 0, as the tile's
   normalisation at inference leaves a camera's scan and a counted one at the same total.

Clean samples (no dose drawn) and samples simulated with noise are left as they are. Two paths follow
this one law: `apply_camera` on the host (numpy, in the loader) and `camera_batch` on the device
(torch, the streaming device path and the resident set). The draws come from (seed, epoch, sample id)
on the ``camera`` stream (`stage.dose.augmentation_rng`): the same sigma and r on either path; the
read noise itself is numpy's on the host and torch's on the device (other draws of the same law, as
the dose's Poisson counts are). Arrays are (..., S, P, P), [row = ky, col = kx] per pattern.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from namsa.random_streams import AugmentationStream
from namsa.sample_meta import SampleMeta

from .config import CameraAugmentationConfig
from .dose import augmentation_rng

#: patterns blurred per chunk on the host: bounds the float64/complex temporaries of a paper-sized stack
CHUNK_PIXELS = 1 << 20


class CameraDraw(NamedTuple):
    """One sample's camera: point-spread ``sigma_px`` (model pattern pixels), ``read_noise_e``
    (electrons per pixel) and the torch seed of its read noise on the device."""

    sigma_px: float
    read_noise_e: float
    seed: int


def draw_camera(cfg: CameraAugmentationConfig, rng: np.random.Generator) -> CameraDraw | None:
    """The camera of one sample, or None (counted) with probability 1 - ``integrating_fraction``. Every
    number is always drawn, so the stream does not depend on the fraction's outcome."""
    integrating = rng.random() < cfg.integrating_fraction
    (s_lo, s_hi), (r_lo, r_hi) = cfg.psf_sigma_px, cfg.read_noise_e
    sigma = s_lo + rng.random() * (s_hi - s_lo)
    read = r_lo + rng.random() * (r_hi - r_lo)
    seed = int(rng.integers(0, 2 ** 63, dtype=np.int64))
    return CameraDraw(sigma, read, seed) if integrating else None


def frequency_squared(p: int) -> np.ndarray:
    """|f|^2 (cycles per pixel squared) on the (P, P // 2 + 1) grid of an rfft2 of a P x P pattern."""
    return np.fft.fftfreq(p)[:, None] ** 2 + np.fft.rfftfreq(p)[None, :] ** 2


def gaussian_mtf(p: int, sigma_px: float) -> np.ndarray:
    """The scintillator's MTF exp(-2 pi^2 sigma^2 |f|^2) on the rfft2 grid of P x P pixels (MTF(0) = 1)."""
    return np.exp(-2.0 * math.pi ** 2 * sigma_px ** 2 * frequency_squared(p))


class CameraAugmentation:
    """Applies a `CameraAugmentationConfig` to one noisy sample at a time (see the module docstring)."""

    def __init__(self, cfg: CameraAugmentationConfig):
        self.cfg = cfg

    def draw(self, meta: SampleMeta, epoch: int) -> tuple[CameraDraw | None, np.random.Generator]:
        """This (epoch, sample)'s camera (None: counted) and the generator its host read noise continues."""
        rng = augmentation_rng(self.cfg.seed, epoch, str(meta.sample_id), AugmentationStream.CAMERA)
        return draw_camera(self.cfg, rng), rng

    def apply(self, cbed: np.ndarray, meta: SampleMeta, epoch: int, electrons: float,
              scale: float = 1.0) -> CameraDraw | None:
        """Record the (S, P, P) counts ``cbed`` (counts / ``electrons`` times ``scale``, the dose
        augmentation's output) through this sample's camera in place; returns its draw (None: counted)."""
        draw, rng = self.draw(meta, epoch)
        if draw is not None:
            apply_camera(cbed, electrons, draw, rng, scale)
        return draw


def apply_camera(cbed: np.ndarray, electrons: float, draw: CameraDraw, rng: np.random.Generator,
                 scale: float = 1.0) -> None:
    """Steps 1-4 of the module docstring on the host, in place on a float16/float32 (..., P, P) stack of
    counts / ``electrons`` (electrons per pattern) times ``scale``; the read noise from ``rng``."""
    patterns = cbed.reshape(-1, *cbed.shape[-2:])
    p = patterns.shape[-1]
    mtf = gaussian_mtf(p, draw.sigma_px)
    noise = draw.read_noise_e * scale / electrons
    before = float(patterns.sum(dtype=np.float64))
    after = 0.0
    largest = float(np.finfo(cbed.dtype).max)
    step = max(1, CHUNK_PIXELS // (p * p))
    for start in range(0, patterns.shape[0], step):
        chunk = patterns[start: start + step]
        seen = np.fft.irfft2(np.fft.rfft2(chunk.astype(np.float64)) * mtf, s=(p, p))
        seen += rng.normal(0.0, noise, seen.shape)
        np.clip(seen, 0.0, largest, out=seen)
        after += float(seen.sum())
        chunk[...] = seen
    if after > 0.0:
        patterns *= np.asarray(before / after, dtype=cbed.dtype)


def camera_batch(x: torch.Tensor, electrons: torch.Tensor, sigma_px: torch.Tensor, read_noise_e: torch.Tensor,
                 seen: torch.Tensor, generator: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Steps 1-4 of the module docstring on the device for a batch: ``x`` float32 (B, S, P, P) counts /
    electrons times ``scale``; per sample b, (B,) tensors on its device: ``electrons`` per pattern,
    ``sigma_px``, ``read_noise_e`` and ``seen`` (bool: through the camera; False leaves the sample as it
    is, bit for bit). The read noise is drawn from ``generator``. Returns a new tensor."""
    b, p = x.shape[0], x.shape[-1]
    shape = (b, 1, 1, 1)
    f2 = torch.from_numpy(frequency_squared(p)).to(device=x.device, dtype=x.dtype)
    mtf = torch.exp(-2.0 * math.pi ** 2 * sigma_px.to(x.dtype).view(shape) ** 2 * f2)
    out = torch.fft.irfft2(torch.fft.rfft2(x) * mtf, s=(p, p))
    safe = torch.where(electrons > 0, electrons, torch.ones_like(electrons)).to(x.dtype)
    noise = torch.randn(out.shape, generator=generator, device=x.device, dtype=x.dtype)
    out = out.add_(noise.mul_((read_noise_e.to(x.dtype) * (scale / safe)).view(shape))).clamp_(min=0.0)
    before = x.sum(dim=(1, 2, 3), dtype=torch.float64)
    after = out.sum(dim=(1, 2, 3), dtype=torch.float64)
    factor = torch.where(after > 0, before / after.clamp(min=1e-300), torch.ones_like(after)).to(x.dtype)
    return torch.where(seen.view(shape), out.mul_(factor.view(shape)), x)


__all__ = ["CameraDraw", "CameraAugmentation", "draw_camera", "gaussian_mtf", "frequency_squared", "apply_camera",
           "camera_batch"]
