"""The training loss of Laanait et al. (2019): Huber on standardised targets plus an L2 term.

Huber (Huber 1964; TF's ``huber_loss`` and torch's ``huber_loss`` agree):
0.5 * r^2 where |r| <= delta, delta * (|r| - 0.5 * delta) elsewhere, averaged over all elements.
The L2 term follows TF's ``l2_loss``: 0.5 * weight_decay * sum(w^2) over all parameters.
"""
from __future__ import annotations

from collections.abc import Iterable

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
