"""Data-parallel training: launch, gradient-reduction engines, instrumentation, performance model.

Use::

    ctx = init_from_env(cfg)                 # torchrun / mpiexec / srun / horovodrun / single process
    engine = build_engine(cfg, model, ctx)   # none | ddp | grouped | bitvector | master_worker | ...
    loss = loss_fn(engine.module(x), y); loss.backward(); engine.synchronize(); optimizer.step()

See docs/distributed.md.
"""
from models.distributed.config import DistributedConfig
from models.distributed.engines import Engine, build_engine
from models.distributed.errors import DistributedConfigError, HorovodMissingError, PeerFailureError
from models.distributed.launch import DistContext, detect_launch, init_from_env

__all__ = ["DistributedConfig", "DistContext", "Engine", "build_engine", "init_from_env", "detect_launch",
           "DistributedConfigError", "PeerFailureError", "HorovodMissingError"]
