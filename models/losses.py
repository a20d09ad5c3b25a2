"""The training loss of Laanait et al. (2019): Huber on standardised targets plus an L2 term.

Huber (Huber 1964; TF's ``huber_loss`` and torch's ``huber_loss`` agree):
0.5 * r^2 where |r| <= delta, delta * (|r| - 0.5 * delta) elsewhere, averaged over all elements.
The L2 term follows TF's ``l2_loss``: 0.5 * weight_decay * sum(w^2) over all parameters.

``training.loss_weighting`` (`data_loss`): ``absolute`` is the paper's loss on targets
standardised by one global mean and std, where a sample weighs in proportion to its squared
amplitude (a light material of half a heavy one's contrast counts a quarter, and with the default
delta every residual sits in Huber's L2 zone); ``relative`` divides each (sample, target)'s
residual by the RMS of that sample's own target in physical units, so the loss is the squared
relative L2 error the evaluation reports and every sample weighs the same whatever its amplitude.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F


def huber_loss(pred: torch.Tensor, target: torch.Tensor, delta: float) -> torch.Tensor:
    """Mean Huber loss in float32 (also under autocast), pred/target (B, C, T, T)."""
    return F.huber_loss(pred.float(), target.float(), delta=float(delta), reduction="mean")


def l2_penalty(params: Iterable[torch.Tensor], weight_decay: float) -> torch.Tensor:
    """0.5 * weight_decay * sum of squares of ``params`` (float32 scalar)."""
    params = list(params)
    total = torch.stack([p.float().pow(2).sum() for p in params]).sum()
    return 0.5 * weight_decay * total


#: a target whose RMS is below this (in standardised units) is treated as this: no division by ~0
MIN_TARGET_RMS = 1e-3


def relative_huber_loss(pred: torch.Tensor, target: torch.Tensor, delta: float,
                        offsets: torch.Tensor) -> torch.Tensor:
    """Mean Huber loss of residuals relative to each (sample, channel)'s target RMS in physical units.

    pred/target (B, C, T, T) standardised, y_n = (y - mean_c) / std_c; ``offsets`` (C,) holds
    mean_c / std_c, so rms(y_n + offset_c) = rms(y) / std_c and a residual divided by it is the
    physical residual over rms(y): the loss is about 0.5 * relative L2^2 per sample.
    """
    t = target.float()
    scale = (t + offsets.to(t).view(1, -1, 1, 1)).pow(2).mean(dim=(2, 3), keepdim=True).sqrt()
    scale = scale.clamp_min(MIN_TARGET_RMS)
    return F.huber_loss(pred.float() / scale, t / scale, delta=float(delta), reduction="mean")


def data_loss(weighting: str, normalizer: Any, targets: Sequence[str]
              ) -> Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]:
    """The data term ``loss(pred, target, delta)`` for ``training.loss_weighting`` (module docstring);
    ``normalizer`` (a `stage.Normalizer`) gives each target's standardisation."""
    if weighting == "absolute":
        return huber_loss
    if weighting != "relative":
        raise ValueError(f"unknown loss weighting {weighting!r}; use absolute or relative")
    stats = [normalizer.targets[name] for name in targets]
    offsets = torch.tensor([mean / std for mean, std in stats], dtype=torch.float32)
    return functools.partial(relative_huber_loss, offsets=offsets)
