"""Horovod's DistributedOptimizer with gradient groups, as the paper ran it.

Horovod reduces during backward through its own hooks; its response cache (the bitvector
coordination, HOROVOD_CACHE_CAPACITY), tensor fusion (HOROVOD_FUSION_THRESHOLD) and cycle time
(HOROVOD_CYCLE_TIME) come from our config and are set before ``hvd.init()``. The engine API does
not see the trainer's optimizer, so the DistributedOptimizer wraps a zero-learning-rate SGD used
only as a carrier for Horovod's hooks; ``synchronize()`` calls its ``synchronize()``, which leaves
the averaged gradients in ``.grad`` for the trainer's real optimizer.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from models.distributed.config import DistributedConfig
from models.distributed.engines.base import Engine, GradientLag
from models.distributed.engines.grouping import make_groups
from models.distributed.launch import DistContext, import_horovod


class HorovodEngine(Engine):
    name = "horovod"

    def __init__(self, cfg: DistributedConfig, model: nn.Module, ctx: DistContext):
        super().__init__(cfg, model, ctx)
        hvd = import_horovod()
        self.hvd = hvd
        self.groups = make_groups(model, cfg)
        compression = {"fp16": hvd.Compression.fp16}.get(cfg.compression, hvd.Compression.none)
        if cfg.compression not in ("none", "fp16"):
            ctx.notice(f"Horovod offers fp16 compression only; distributed.compression={cfg.compression} "
                       "is not applied by the horovod engine (use grouped/bitvector for it)")
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        carrier = torch.optim.SGD([p for _, p in named], lr=0.0)
        self.optimizer = hvd.DistributedOptimizer(
            carrier, named_parameters=named, compression=compression,
            groups=[g.params for g in self.groups])
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self._lag = GradientLag() if cfg.gradient_lag else None

    def _synchronize(self) -> bool:
        start = time.perf_counter()
        self.optimizer.synchronize()
        end = time.perf_counter()
        # Horovod does not expose per-step counters; report what it reduced (one grouped
        # allreduce per group) and the time spent waiting for it.
        nbytes = sum(g.nbytes for g in self.groups)
        self.recorder.add(communication_s=end - start, collectives=len(self.groups), bytes_sent=nbytes)
        return self._lag.swap(self.params()) if self._lag else True
