"""Assigning parameters to gradient groups (the paper's "grouping").

Groups are listed in backward order (the order gradients become ready: last layers first), and
within a group parameters keep registration order. Every rank computes the same groups from the
same model, which ``build_engine`` checks with a structure hash.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from torch import nn

from models.distributed.config import DistributedConfig


@dataclass
class Group:
    name: str
    params: list[nn.Parameter]

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)


def network_blocks(model: nn.Module) -> list[tuple[str, list[nn.Parameter]]]:
    """``model.blocks()`` (forward order) if the model defines it, else one block per top-level child
    (and one for parameters registered directly on the model)."""
    if hasattr(model, "blocks") and callable(model.blocks):
        return [(name, list(params)) for name, params in model.blocks()]
    blocks = [(name, list(child.parameters())) for name, child in model.named_children()]
    direct = list(model.parameters(recurse=False))
    return ([("_direct", direct)] if direct else []) + blocks


def _trainable_unique(params, seen: set[int]) -> list[nn.Parameter]:
    out = []
    for p in params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _split_by_bytes(params: list[nn.Parameter], count: int) -> list[list[nn.Parameter]]:
    total = sum(p.numel() for p in params)
    count = max(1, min(count, len(params)))
    chunks: list[list[nn.Parameter]] = [[]]
    filled = 0
    for p in params:
        # Start a new chunk once this one holds its share (contiguous, balanced by size).
        if chunks[-1] and filled >= total * len(chunks) / count and len(chunks) < count:
            chunks.append([])
        chunks[-1].append(p)
        filled += p.numel()
    return chunks


def make_groups(model: nn.Module, cfg: DistributedConfig) -> list[Group]:
    """Gradient groups in backward order for ``cfg.grouping``."""
    seen: set[int] = set()
    if cfg.grouping == "per_block":
        groups = [Group(name, ps) for name, raw in network_blocks(model)
                  if (ps := _trainable_unique(raw, seen))]
        rest = _trainable_unique(model.parameters(), seen)
        if rest:
            groups.append(Group("_rest", rest))
        return groups[::-1]
    backward = _trainable_unique(list(model.parameters())[::-1], seen)
    if cfg.grouping == "chunks":
        return [Group(f"chunk{i}", c) for i, c in enumerate(_split_by_bytes(backward, cfg.group_count))]
    threshold = cfg.group_min_mb * 2**20
    chunks: list[list[nn.Parameter]] = [[]]
    size = 0
    for p in backward:
        if size >= threshold:
            chunks.append([])
            size = 0
        chunks[-1].append(p)
        size += p.numel() * p.element_size()
    return [Group(f"bytes{i}", c) for i, c in enumerate(chunks) if c]


def structure_digest(model: nn.Module, groups: list[Group] | None = None) -> str:
    """Hash of parameter names, shapes and the grouping; ranks compare it at start-up."""
    names = {id(p): n for n, p in model.named_parameters()}
    parts = [f"{n}:{tuple(p.shape)}" for n, p in model.named_parameters()]
    if groups is not None:
        parts += [g.name + "=" + ",".join(names.get(id(p), "?") for p in g.params) for g in groups]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
