"""The baseline: torch DistributedDataParallel with a configurable bucket size.

A DDP communication hook counts collectives and bytes and times each bucket's all_reduce; with
compression it casts (fp16/bf16) or 8-bit codes the bucket (our own code: torch's built-in
quantisation hook fails on CPU and its bf16 hook needs NCCL; see FACTS.md).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from models.distributed.config import DistributedConfig
from models.distributed.engines.base import Engine, GradientLag
from models.distributed.engines.reducers import FlatReducer
from models.distributed.launch import DistContext


class DDPEngine(Engine):
    name = "ddp"

    def __init__(self, cfg: DistributedConfig, model: nn.Module, ctx: DistContext):
        super().__init__(cfg, model, ctx)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.module = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=cfg.bucket_mb)
        self.reducer = FlatReducer(cfg, ctx, group=None, recorder=self.recorder)
        self.module.register_comm_hook(None, self._hook)
        self._lag = GradientLag() if cfg.gradient_lag else None

    def _hook(self, _state, bucket):  # no annotation: DDP checks it against an exact type
        flat = bucket.buffer()
        if self.cfg.compression != "none":
            # Compressed reductions run synchronously inside the hook; DDP only needs a Future.
            with self.recorder.span("communication", f"bucket{bucket.index()}"):
                out = self.reducer.allreduce_mean([flat], [bucket.index()])[0]
            fut: torch.futures.Future = torch.futures.Future()
            fut.set_result(out)
            return fut
        start = time.perf_counter()
        flat.div_(self.ctx.world_size)
        self.recorder.add(collectives=1, bytes_sent=flat.numel() * flat.element_size())
        work = dist.all_reduce(flat, async_op=True)

        def done(f):
            end = time.perf_counter()
            self.recorder.add(communication_s=end - start)
            self.recorder.event(f"bucket{bucket.index()}", start, end, "communication")
            return f.value()[0]

        return work.get_future().then(done)

    def _synchronize(self) -> bool:
        # DDP already averaged the gradients during backward.
        return self._lag.swap(self.params()) if self._lag else True
