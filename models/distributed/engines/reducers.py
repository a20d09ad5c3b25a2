"""Averaging a list of flat fp32 gradient buffers across a process group, optionally compressed.

``FlatReducer`` fuses the buffers into one collective (fp32 / fp16 / bf16 all_reduce, or an 8-bit
all_gather of codes + scales that every rank decodes and sums: summing 8-bit codes with different
scales inside the collective is not possible). ``HierarchicalReducer`` does Kurth et al.'s
three-step reduction with node subgroups and uses a ``FlatReducer`` for the cross-node step.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from models.distributed.compression import ErrorFeedback, dequantize
from models.distributed.config import DistributedConfig
from models.distributed.instrument import StepRecorder
from models.distributed.launch import DistContext

_CAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def probe_collective(fn) -> str | None:
    """Run a collective once; None if it works, else the backend's one-line complaint.

    A backend that lacks an op rejects it locally on every rank before any data moves, so every
    rank reaches the same verdict.
    """
    try:
        fn()
        return None
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]


# torch 2.13 renamed the tensor forms (the old names still work, with a FutureWarning).
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _premul_sum(factor: float):
    """The scaled-sum reduce op (NCCL >= 2.11), or None where this torch does not offer it."""
    make = getattr(dist, "_make_nccl_premul_sum", None)
    try:
        return make(factor) if make else None
    except (RuntimeError, TypeError):
        return None


def _split(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(torch.split(flat, [t.numel() for t in like]))


class FlatReducer:
    """Mean over the ranks of ``group`` (None = the default group)."""

    def __init__(self, cfg: DistributedConfig, ctx: DistContext, group, recorder: StepRecorder, size: int | None = None):
        self.cfg, self.ctx, self.group, self.recorder = cfg, ctx, group, recorder
        self.size = size or ctx.world_size
        self.feedback = ErrorFeedback(cfg.error_feedback)
        self.premul: object | None = None
        if cfg.compression in ("none", "fp16", "bf16") and self.size > 1:
            # NCCL fuses the 1/P scaling into the sum (ReduceOp.PREMUL_SUM); gloo lacks it: divide
            # first, then all_reduce with SUM (same result, one extra pass over the buffer).
            op = _premul_sum(1.0 / self.size)
            why = "this torch has no PREMUL_SUM" if op is None else probe_collective(
                lambda: dist.all_reduce(torch.zeros(1, device=ctx.device), op=op, group=group))
            self.premul = op if why is None else None
            if why:
                ctx.notice(f"backend {ctx.backend} lacks ReduceOp.PREMUL_SUM ({why}); falling back to "
                           "dividing by the world size, then all_reduce with SUM")

    def allreduce_mean(self, flats: list[torch.Tensor], keys: list[object]) -> list[torch.Tensor]:
        """Average each buffer over the group; ``keys`` name them for error feedback."""
        if self.cfg.compression.startswith("int8"):
            return self._int8(flats, keys)
        flat = torch.cat(flats) if len(flats) > 1 else flats[0].clone()
        dtype = _CAST.get(self.cfg.compression, flat.dtype)
        if self.premul is not None:
            wire = flat.to(dtype)
            dist.all_reduce(wire, op=self.premul, group=self.group)
        else:
            # Divide first so fp16 sums of large gradients do not overflow (as torch's fp16 hook does).
            wire = (flat / self.size).to(dtype)
            dist.all_reduce(wire, group=self.group)
        self.recorder.add(collectives=1, bytes_sent=wire.numel() * wire.element_size())
        return _split(wire.to(flats[0].dtype), flats)

    def _int8(self, flats: list[torch.Tensor], keys: list[object]) -> list[torch.Tensor]:
        code, chunk = self.cfg.compression, self.cfg.quant_chunk
        coded = [self.feedback.quantize(k, f.float(), code, chunk) for k, f in zip(keys, flats)]
        codes = torch.cat([q.codes for q in coded])
        scales = torch.cat([q.scales for q in coded])
        all_codes = [torch.empty_like(codes) for _ in range(self.size)]
        all_scales = [torch.empty_like(scales) for _ in range(self.size)]
        dist.all_gather(all_codes, codes, group=self.group)
        dist.all_gather(all_scales, scales, group=self.group)
        self.recorder.add(collectives=2, bytes_sent=sum(q.nbytes for q in coded))
        out = [torch.zeros_like(f, dtype=torch.float32) for f in flats]
        for rank_codes, rank_scales in zip(all_codes, all_scales):
            c_off = s_off = 0
            for i, q in enumerate(coded):
                part = type(q)(rank_codes[c_off:c_off + q.codes.numel()],
                               rank_scales[s_off:s_off + q.scales.numel()], q.numel)
                out[i] += dequantize(part, code, chunk)
                c_off += q.codes.numel()
                s_off += q.scales.numel()
        return [(o / self.size).to(f.dtype) for o, f in zip(out, flats)]


class HierarchicalReducer:
    """Kurth et al. 2018: reduce-scatter inside the node, all_reduce each slice across nodes (the
    slow link; compression applies here), all-gather inside the node.

    Needs ``intra`` (this node's ranks) and ``cross`` (the ranks with the same local rank on every
    node) subgroups. Where the backend lacks reduce_scatter, each slice is reduced to its owner
    with ``reduce`` instead (same result, L reduces instead of one collective).
    """

    def __init__(self, cfg: DistributedConfig, ctx: DistContext, intra, cross, recorder: StepRecorder):
        self.ctx, self.intra, self.recorder = ctx, intra, recorder
        self.local_size, self.local_rank = ctx.local_size, ctx.local_rank
        self.cross = FlatReducer(cfg, ctx, cross, recorder, size=ctx.num_nodes)
        why = probe_collective(lambda: _reduce_scatter(
            torch.zeros(1, device=ctx.device), torch.zeros(self.local_size, device=ctx.device), group=intra))
        self.has_reduce_scatter = why is None
        if why:
            ctx.notice(f"backend {ctx.backend} lacks reduce_scatter ({why}); hierarchical allreduce "
                       "reduces each slice to its owner with reduce instead")
        self.owners = [dist.get_global_rank(intra, i) for i in range(self.local_size)]

    def allreduce_mean(self, flats: list[torch.Tensor], keys: list[object]) -> list[torch.Tensor]:
        flat = torch.cat(flats) if len(flats) > 1 else flats[0]
        pad = (-flat.numel()) % self.local_size
        # Divide by the node size first; the cross-node reducer divides by the node count.
        padded = torch.nn.functional.pad(flat, (0, pad)) / self.local_size
        slices = padded.view(self.local_size, -1)
        mine = torch.empty_like(slices[0])
        if self.has_reduce_scatter:
            _reduce_scatter(mine, padded, group=self.intra)
            self.recorder.add(collectives=1)
        else:
            for i, owner in enumerate(self.owners):
                part = slices[i].clone()
                dist.reduce(part, dst=owner, group=self.intra)
                if i == self.local_rank:
                    mine = part
            self.recorder.add(collectives=self.local_size)
        self.recorder.add(bytes_sent=padded.numel() * padded.element_size())
        mine = self.cross.allreduce_mean([mine], [tuple(map(str, keys))])[0]
        full = torch.empty_like(padded)
        _all_gather(full, mine.contiguous(), group=self.intra)
        self.recorder.add(collectives=1, bytes_sent=mine.numel() * mine.element_size())
        return _split(full[: flat.numel()], flats)
