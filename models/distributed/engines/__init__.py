"""Gradient-reduction engines; ``build_engine`` picks one from the config."""
from __future__ import annotations

import torch
from torch import nn

from models.distributed.config import DistributedConfig
from models.distributed.engines.base import Engine, NoopEngine
from models.distributed.engines.grouping import make_groups, structure_digest
from models.distributed.errors import DistributedConfigError
from models.distributed.launch import DistContext, _check_same_config, all_gather_objects


def _engine_class(name: str) -> type[Engine]:
    # Imported lazily: torch.distributed engines need a process group, horovod its own install.
    if name == "ddp":
        from models.distributed.engines.ddp import DDPEngine
        return DDPEngine
    if name == "horovod":
        from models.distributed.engines.horovod_engine import HorovodEngine
        return HorovodEngine
    from models.distributed.engines import overlapped
    return {"grouped": overlapped.GroupedEngine, "bitvector": overlapped.BitvectorEngine,
            "master_worker": overlapped.MasterWorkerEngine, "hierarchical": overlapped.HierarchicalEngine}[name]


def build_engine(cfg: DistributedConfig, model: nn.Module, ctx: DistContext) -> Engine:
    """The engine named by ``cfg.engine`` around ``model`` (already on ``ctx.device``).

    World size 1 or ``engine='none'``: a no-op engine. With several ranks, every rank must build
    the same model and grouping; a mismatch is reported at start-up. Parameters are broadcast
    from rank 0 so all ranks start identical.
    """
    cfg = cfg.resolved()
    if ctx.world_size == 1 or cfg.engine == "none":
        return NoopEngine(cfg, model, ctx)
    if cfg.engine == "horovod" and ctx.backend != "horovod":
        raise DistributedConfigError(
            "distributed.engine=horovod needs a Horovod launch (horovodrun --gloo -np N ...), "
            f"but this job was started by {ctx.launcher}; launch with horovodrun or pick another engine")
    if cfg.engine != "horovod" and ctx.backend == "horovod":
        raise DistributedConfigError(
            f"distributed.engine={cfg.engine} needs torch.distributed but this job runs under horovodrun; "
            "set engine: horovod or launch with torchrun/mpiexec/srun")
    digest = structure_digest(model, make_groups(model, cfg))
    _check_same_config(ctx, all_gather_objects(ctx, digest), "the model structure or gradient grouping")
    if ctx.backend != "horovod":  # Horovod's engine broadcasts through Horovod itself
        broadcast_from_rank0(list(model.parameters()) + list(model.buffers()), ctx)
    return _engine_class(cfg.engine)(cfg, model, ctx)


def broadcast_from_rank0(tensors: list[torch.Tensor], ctx: DistContext) -> None:
    """Overwrite ``tensors`` (in place) on every rank with rank 0's values; a no-op with one rank.
    One collective per dtype: the tensors are flattened into one buffer each."""
    if ctx.world_size == 1 or not tensors:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        with ctx.collective("broadcasting rank 0's parameters"):
            if ctx.backend == "horovod":
                import horovod.torch as hvd

                flat = hvd.broadcast(flat, root_rank=0)
            else:
                import torch.distributed as dist

                dist.broadcast(flat, src=0)
        with torch.no_grad():
            for t, part in zip(group, torch.split(flat, [t.numel() for t in group])):
                t.copy_(part.view_as(t))


__all__ = ["Engine", "NoopEngine", "broadcast_from_rank0", "build_engine", "make_groups"]
