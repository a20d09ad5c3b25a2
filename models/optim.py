"""Optimisers: LARC/LARS-Adam (the paper's), a LAMB-style variant, and plain Adam/AdamW.

Parameters are grouped by network block (``model.blocks()``): one torch param group per block,
named, so trust ratios are per block with no exclusions (Laanait et al. 2019, FACTS.md).

LARC (You et al. 2017): for each block,
trust = eta * ||w|| / ||g|| over all its parameters together (1 where either norm is 0);
``clip`` mode multiplies the gradient by min(trust, 1) (the paper's "clipped at 1"; NVIDIA apex's
clip mode differs by comparing trust with the learning rate), ``scale`` mode by trust. It runs on the
already-reduced (averaged) gradients, right before Adam (0.9, 0.999). Weight decay is a loss term
(``models.losses.l2_penalty``), so it is already inside g.

LAMB-style (You et al. 2020, phi = identity): Adam's bias-corrected update u is computed first and
the block's step is lr * (||w|| / ||u||) * u, so the trust ratio survives Adam's normalisation
(Adam cancels a constant per-block rescale of g, which is why this is a useful ablation).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .config import TrainConfig

Blocks = Sequence[tuple[str, Sequence[nn.Parameter]]]


def _norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """L2 norm over several tensors together, in float32 (stays on the device)."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.float()) for t in tensors]))


def _safe_ratio(num: torch.Tensor, den: torch.Tensor, eta: float) -> torch.Tensor:
    """eta * num / den elementwise, 1 where either is 0 (no information to scale by)."""
    ok = (num > 0) & (den > 0)
    return torch.where(ok, eta * num / torch.where(ok, den, torch.ones_like(den)), torch.ones_like(num))


def _larc_factors(blocks: Blocks, eta: float, mode: str) -> tuple[list[list[nn.Parameter]], torch.Tensor]:
    """(parameters with gradients per block, per-block factor tensor on the device)."""
    with_grad = [[p for p in params if p.grad is not None] for _, params in blocks]
    live = [ps for ps in with_grad if ps]
    if not live:
        return with_grad, torch.ones(len(with_grad))
    w = torch.stack([_norm([p.detach() for p in ps]) for ps in live])
    g = torch.stack([_norm([p.grad for p in ps]) for ps in live])
    trust = _safe_ratio(w, g, eta)
    if mode == "clip":
        trust = torch.clamp(trust, max=1.0)
    factors = torch.ones(len(with_grad), device=trust.device)
    factors[[i for i, ps in enumerate(with_grad) if ps]] = trust
    return with_grad, factors


def larc_trust_ratios(blocks: Blocks, eta: float, mode: str = "clip") -> list[float]:
    """Per-block LARC factor applied to the gradient (see the module docstring)."""
    return _larc_factors(blocks, eta, mode)[1].tolist()


def apply_larc_(blocks: Blocks, eta: float, mode: str = "clip") -> list[float]:
    """Scale each block's gradients in place by its LARC factor; return the factors (one host sync)."""
    with_grad, factors = _larc_factors(blocks, eta, mode)
    for params, factor in zip(with_grad, factors):
        for p in params:
            p.grad.mul_(factor.to(p.grad.dtype))
    return factors.tolist()


class LambAdam(torch.optim.Optimizer):
    """Adam whose per-group (per-block) update is rescaled by ||w|| / ||update|| (LAMB-style)."""

    def __init__(self, params: Any, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        self.last_ratios: list[torch.Tensor] = []

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # noqa: D401 - torch signature
        self.last_ratios = []
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            params = [p for p in group["params"] if p.grad is not None]
            updates = [self._adam_update(p, beta1, beta2, group["eps"]) for p in params]
            if not params:
                continue
            ratio = _safe_ratio(_norm(params), _norm(updates), 1.0)
            self.last_ratios.append(ratio)
            for p, u in zip(params, updates):
                p.add_((u * ratio).to(p.dtype), alpha=-group["lr"])

    def _adam_update(self, p: torch.Tensor, beta1: float, beta2: float, eps: float) -> torch.Tensor:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        t = float(state["step"])
        g = p.grad
        state["exp_avg"].mul_(beta1).add_(g, alpha=1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1 - beta2)
        m_hat = state["exp_avg"] / (1 - beta1 ** t)
        v_hat = state["exp_avg_sq"] / (1 - beta2 ** t)
        return m_hat / (v_hat.sqrt() + eps)


class BlockOptimizer:
    """The configured optimiser over a model's blocks, with the LR set per step.

    ``step(lr)`` applies LARC first when configured (on the reduced gradients) and returns the
    per-block trust ratios (empty for plain Adam/AdamW). ``l2_in_loss`` says whether weight decay
    belongs in the loss (everything but AdamW, whose decay is decoupled).
    """

    def __init__(self, blocks: Blocks, cfg: TrainConfig):
        self.cfg = cfg
        self.blocks = [(name, list(params)) for name, params in blocks]
        groups = [{"params": params, "name": name} for name, params in self.blocks]
        kind = cfg.optimizer
        common = dict(lr=cfg.lr0, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps)
        if kind == "lamb":
            self.torch_optimizer: torch.optim.Optimizer = LambAdam(groups, **common)
        elif kind == "adamw":
            self.torch_optimizer = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay, **common)
        else:
            self.torch_optimizer = torch.optim.Adam(groups, weight_decay=0.0, **common)
        self.l2_in_loss = kind != "adamw"

    def zero_grad(self) -> None:
        self.torch_optimizer.zero_grad(set_to_none=True)

    def step(self, lr: float) -> list[float]:
        for group in self.torch_optimizer.param_groups:
            group["lr"] = lr
        ratios: list[float] = []
        if self.cfg.optimizer == "larc_adam":
            ratios = apply_larc_(self.blocks, self.cfg.trust_coefficient, self.cfg.larc_mode)
        self.torch_optimizer.step()
        if isinstance(self.torch_optimizer, LambAdam):
            ratios = torch.stack(self.torch_optimizer.last_ratios).tolist() if self.torch_optimizer.last_ratios else []
        return ratios

    def state_dict(self) -> dict[str, Any]:
        return self.torch_optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.torch_optimizer.load_state_dict(state)
