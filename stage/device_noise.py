"""Shot noise drawn on the training device (``data.dose_augmentation.on_device``).

The host path (`stage.dose`) draws the Poisson counts in numpy in the loader, for every training
sample; at high throughput that is the loader's largest cost. With ``on_device`` the loader
delivers the clean patterns as stored (untransformed) and the training step calls
`noisy_batch_to_device`: it moves the batch, draws counts ~ Poisson(N * I) per detector pixel with
torch on that device, delivers counts / N on the stored scale, and only then applies the input
transform (pattern minimum, log1p/sqrt, standardisation), the order of the host path.

Per sample, the dose comes from `SampleDataset.device_noise_draws`: the dose the host path draws
for the same (seed, epoch, sample id), and a seed drawn next from that stream for the counts'
torch.Generator, so a run is reproducible on one device. torch's Poisson sampler is not numpy's:
the counts differ draw by draw from the host path's but follow the same law. With symmetry
augmentation the noise is drawn after the rotation instead of before: the pixels' draws are
independent, so the law is the same. With ``data.camera_augmentation`` a sample drawn for the camera
(`SampleDataset.device_camera_draws`: the host path's sigma and read noise) is recorded through it
right after its counts (`stage.camera_augmentation.camera_batch`, its read noise from a generator of
its own seed); the camera's blur is isotropic and its noise independent per pixel, so the turn
commutes with it too.
"""
from __future__ import annotations

from typing import Any

import torch

from .camera_augmentation import CameraDraw, camera_batch
from .dataset import SampleDataset, batch_to_device
from .normalize import Normalizer


def add_shot_noise_torch(cbed: torch.Tensor, electrons: float, generator: torch.Generator,
                         scale: float = 1.0) -> torch.Tensor:
    """`stage.dose.add_shot_noise` in torch, in place on a float32 tensor (..., P, P) of
    intensities times ``scale``: counts ~ Poisson(``electrons`` * I) delivered as counts /
    ``electrons`` on that scale; negative rounding residue counts as zero intensity."""
    lam = (cbed * (electrons / scale)).clamp_(min=0.0)
    return cbed.copy_(torch.poisson(lam, generator=generator).mul_(scale / electrons))


def add_shot_noise_batch(cbed: torch.Tensor, electrons: torch.Tensor, generator: torch.Generator,
                         scale: float = 1.0) -> torch.Tensor:
    """`add_shot_noise_torch` for a whole batch in one draw: ``cbed`` float32 (B, ...) intensities
    times ``scale``, ``electrons`` float (B,) on its device, sample b's electrons per probe position
    (0: sample b stays clean). Returns a new tensor: counts ~ Poisson(electrons[b] * I) as counts /
    electrons[b] on ``scale``, or the clean sample itself."""
    shape = (-1,) + (1,) * (cbed.dim() - 1)
    per_sample = electrons.to(cbed.dtype).view(shape)
    noisy = per_sample > 0
    safe = torch.where(noisy, per_sample, torch.ones_like(per_sample))
    lam = (cbed * (safe / scale)).clamp_(min=0.0)
    counts = torch.poisson(lam, generator=generator).mul_(scale / safe)
    return torch.where(noisy, counts, cbed)


def noisy_batch_to_device(batch: dict[str, Any], device: torch.device | str, normalizer: Normalizer | None,
                          dataset: SampleDataset) -> dict[str, Any]:
    """`stage.dataset.batch_to_device` for a clean training batch of ``dataset`` (dose
    augmentation on_device): the noise of each sample (``batch["index"]``, at the dataset's
    current epoch) is drawn on ``device`` before ``normalizer``'s transform (None: none)."""
    out = batch_to_device(batch, device, None)
    # a fresh float32 copy: the noise is drawn in place, never into the loader's own buffer
    x = out["cbed"].to(torch.float32, copy=True)
    scale = float(batch["cbed_scale"][0]) if "cbed_scale" in batch else 1.0
    indices = batch["index"].tolist()
    cameras = dataset.device_camera_draws(indices)
    for i, (electrons, seed) in enumerate(dataset.device_noise_draws(indices)):
        if electrons > 0:
            generator = torch.Generator(device=x.device).manual_seed(seed)
            add_shot_noise_torch(x[i], electrons, generator, scale)
            if cameras[i] is not None:
                x[i] = camera_one(x[i], electrons, cameras[i], scale)
    out["cbed"] = normalizer.cbed(x, stored_scale=scale) if normalizer is not None else x
    return out


def camera_one(x: torch.Tensor, electrons: float, draw: CameraDraw, scale: float = 1.0) -> torch.Tensor:
    """One sample's (S, P, P) counts / ``electrons`` times ``scale`` recorded through the camera ``draw``
    (`stage.camera_augmentation.camera_batch`), its read noise from a generator seeded with ``draw.seed``."""
    device = x.device
    generator = torch.Generator(device=device).manual_seed(draw.seed)
    one = torch.ones(1, device=device)
    out = camera_batch(x.unsqueeze(0), one * electrons, one * draw.sigma_px, one * draw.read_noise_e,
                       torch.ones(1, dtype=torch.bool, device=device), generator, scale)
    return out[0]


__all__ = ["add_shot_noise_torch", "add_shot_noise_batch", "noisy_batch_to_device", "camera_one"]
