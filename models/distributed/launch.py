"""One launch path for torchrun, mpirun/mpiexec (Open MPI, MPICH/Hydra, Parsl's MPI launcher),
Slurm srun and horovodrun: derive rank, world size, local rank and node from the environment.

Parsl's MPI launchers (``PARSL_MPI_PREFIX``) run ``mpiexec``/``srun``, so their ranks see the same
variables as a hand-typed ``mpiexec``/``srun``. torch.distributed needs ``MASTER_ADDR`` and
``MASTER_PORT`` (torchrun sets them; with MPI/Slurm export them before launching).
"""
from __future__ import annotations

import contextlib
import datetime
import os
import re
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import torch

from models.distributed.config import DistributedConfig
from models.distributed.errors import DistributedConfigError, HorovodMissingError, PeerFailureError


@dataclass(frozen=True)
class LaunchEnv:
    """What the launcher told this process; ``None`` where it said nothing."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int | None = None
    local_size: int | None = None
    node_rank: int | None = None


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise DistributedConfigError(
                    f"environment variable {name}={value!r} is not an integer; fix the launcher setup") from None
    return None


def _slurm_tasks_on_node(env: Mapping[str, str]) -> int | None:
    """Tasks on this node from SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ('4(x2),3')."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node = _int(env, "SLURM_NODEID") or 0
    if not spec:
        return None
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node] if node < len(counts) else None


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchEnv:
    """Rank/size/local rank from torchrun, horovodrun, Open MPI, MPICH/PMI (incl. Parsl) or srun.

    No launcher variables: a single process (world size 1).
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun / torch.distributed.launch
        return LaunchEnv("torchrun", _int(env, "RANK"), _int(env, "WORLD_SIZE"),
                         _int(env, "LOCAL_RANK"), _int(env, "LOCAL_WORLD_SIZE"), _int(env, "GROUP_RANK"))
    if "HOROVOD_RANK" in env and "HOROVOD_SIZE" in env:
        return LaunchEnv("horovodrun", _int(env, "HOROVOD_RANK"), _int(env, "HOROVOD_SIZE"),
                         _int(env, "HOROVOD_LOCAL_RANK"), _int(env, "HOROVOD_LOCAL_SIZE"),
                         _int(env, "HOROVOD_CROSS_RANK"))
    if "OMPI_COMM_WORLD_RANK" in env:
        return LaunchEnv("openmpi", _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"),
                         _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
                         _int(env, "OMPI_COMM_WORLD_NODE_RANK"))
    if "PMI_RANK" in env and "PMI_SIZE" in env:  # MPICH / Intel MPI Hydra; Parsl's mpiexec launcher
        return LaunchEnv("mpich", _int(env, "PMI_RANK"), _int(env, "PMI_SIZE"),
                         _int(env, "MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
                         _int(env, "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"))
    if "PALS_RANKID" in env:  # Cray PALS (aprun successor); Parsl's mpiexec on PBS/Cray
        return LaunchEnv("pals", _int(env, "PALS_RANKID"), _int(env, "PALS_SIZE", "PMI_SIZE") or 1,
                         _int(env, "PALS_LOCAL_RANKID"), _int(env, "PALS_LOCAL_SIZE"), _int(env, "PALS_NODEID"))
    if "SLURM_PROCID" in env and ("SLURM_STEP_NUM_TASKS" in env or "SLURM_NTASKS" in env):
        # Inside an sbatch script but outside srun, the batch step has one task.
        return LaunchEnv("srun", _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
                         _int(env, "SLURM_LOCALID"), _slurm_tasks_on_node(env), _int(env, "SLURM_NODEID"))
    return LaunchEnv("none", 0, 1, 0, 1, 0)


@dataclass
class DistContext:
    """This process's place in the job.

    ``node_rank``/``local_rank``/``local_size`` describe the node (from the launcher, the hostnames,
    or ``DistributedConfig.node_size`` to simulate nodes on one machine). ``backend`` is ``nccl``,
    ``gloo``, ``horovod`` or ``none`` (world size 1).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node_rank: int = 0
    backend: str = "none"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    launcher: str = "none"
    notices: list[str] = field(default_factory=list)

    @property
    def is_main(self) -> bool:
        """True on rank 0 (the rank that writes checkpoints and logs)."""
        return self.rank == 0

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_size))

    def barrier(self) -> None:
        """Wait for every rank (no-op with world size 1)."""
        if self.world_size == 1:
            return
        with self.collective("barrier"):
            if self.backend == "horovod":
                import horovod.torch as hvd

                hvd.barrier()
            else:
                import torch.distributed as dist

                dist.barrier()

    @contextlib.contextmanager
    def collective(self, what: str) -> Iterator[None]:
        """Run one collective (``what`` names it); a peer that died or lost its connection, which gloo,
        NCCL and Horovod report as a RuntimeError wherever this rank meets it next, becomes one
        `PeerFailureError` line that says to resume. Every collective the training loop runs goes
        through here or through the overlapped engines' reduction (which says the same); the DDP engine's
        runs inside torch's backward hook, where its error is left as torch raises it (wrapping backward
        would call a genuine backward error a lost peer)."""
        try:
            yield
        except RuntimeError as exc:
            text = str(exc).strip()
            raise PeerFailureError(
                f"rank {self.rank}: {what} failed ({text.splitlines()[0][:160] if text else type(exc).__name__}): "
                "another rank died or lost its connection; restart the job with --resume") from exc

    def notice(self, message: str) -> None:
        """Say something once (on rank 0): fallbacks and their reasons."""
        if message in self.notices:
            return
        self.notices.append(message)
        if self.is_main:
            print(f"[models.distributed] {message}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Leave the process group (safe to call twice)."""
        import torch.distributed as dist

        if self.backend in ("gloo", "nccl") and dist.is_initialized():
            dist.destroy_process_group()


def _pick_backend(cfg: DistributedConfig) -> str:
    if cfg.backend != "auto":
        return cfg.backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def _device_for(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl" or (backend == "horovod" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank % max(1, torch.cuda.device_count()))
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def first_device_guess(launch: LaunchEnv, device_count: int) -> int:
    """The GPU index a rank takes before the ranks have exchanged hostnames: the launcher's local
    rank, else the global rank modulo the node's GPU count. The fallback is exact on one node and for
    the usual blocks of consecutive ranks per node; it never puts every rank on cuda:0 (which NCCL
    refuses as duplicate GPUs). `init_distributed` corrects it once the node layout is known."""
    if launch.local_rank is not None:
        return launch.local_rank
    return launch.rank % max(1, device_count)


def _settle_device(ctx: DistContext) -> None:
    """Move a CUDA rank to the GPU of its node-local rank when the first guess was another one."""
    if ctx.device.type != "cuda" or ctx.backend == "horovod":
        return
    wanted = ctx.local_rank % max(1, torch.cuda.device_count())
    if wanted != ctx.device.index:
        ctx.notice(f"ranks moved to the GPU of their node-local rank (rank {ctx.rank}: cuda:{ctx.device.index} -> "
                   f"cuda:{wanted}); set LOCAL_RANK in the launcher to place them directly")
        ctx.device = _device_for(ctx.backend, ctx.local_rank)


def _node_layout(ctx: DistContext, launch: LaunchEnv, cfg: DistributedConfig, hosts: list[str]) -> None:
    """Fill node_rank/local_rank/local_size: config override > launcher > hostnames."""
    if cfg.node_size is not None:
        if ctx.world_size % cfg.node_size:
            raise DistributedConfigError(
                f"distributed.node_size={cfg.node_size} does not divide world size {ctx.world_size}; "
                "pick a divisor or unset it")
        ctx.local_size, ctx.local_rank, ctx.node_rank = cfg.node_size, ctx.rank % cfg.node_size, ctx.rank // cfg.node_size
        return
    order = list(dict.fromkeys(hosts))
    same = [r for r, h in enumerate(hosts) if h == hosts[ctx.rank]]
    ctx.local_size = launch.local_size or len(same)
    ctx.local_rank = launch.local_rank if launch.local_rank is not None else same.index(ctx.rank)
    ctx.node_rank = launch.node_rank if launch.node_rank is not None else order.index(hosts[ctx.rank])


def _check_same_config(ctx: DistContext, digests: list[Any], what: str) -> None:
    odd = [r for r, d in enumerate(digests) if d != digests[0]]
    if odd:
        raise DistributedConfigError(
            f"{what} differs across ranks (rank 0 has {digests[0]}, ranks {odd} differ); "
            "launch every rank with the same config")


def all_gather_objects(ctx: DistContext, obj: Any) -> list[Any]:
    """Gather one picklable object from every rank (world size 1: ``[obj]``)."""
    if ctx.world_size == 1:
        return [obj]
    with ctx.collective("gathering an object from every rank"):
        if ctx.backend == "horovod":
            import horovod.torch as hvd

            return hvd.allgather_object(obj)
        import torch.distributed as dist

        out: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(out, obj)
        return out


def _init_torch(ctx: DistContext, cfg: DistributedConfig, launch: LaunchEnv) -> None:
    import torch.distributed as dist

    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise DistributedConfigError(
            f"{launch.launcher} started {ctx.world_size} ranks but {' and '.join(missing)} is not set; "
            "export MASTER_ADDR=<rank-0 host> MASTER_PORT=<free port> before launching (torchrun sets them)")
    ctx.backend = _pick_backend(cfg)
    if ctx.backend == "nccl" and not torch.cuda.is_available():
        raise DistributedConfigError("distributed.backend=nccl but no CUDA GPU is visible; use backend: gloo")
    ctx.device = _device_for(ctx.backend, first_device_guess(launch, torch.cuda.device_count()))
    if not dist.is_initialized():
        dist.init_process_group(ctx.backend, rank=ctx.rank, world_size=ctx.world_size,
                                init_method="env://", timeout=datetime.timedelta(seconds=cfg.timeout_s))


def _init_horovod(ctx: DistContext, cfg: DistributedConfig) -> None:
    hvd = import_horovod()
    # Horovod reads its knobs from the environment at init; the config wins over horovodrun flags.
    knobs = {"HOROVOD_FUSION_THRESHOLD": str(int(cfg.fusion_threshold_mb * 2**20)),
             "HOROVOD_CYCLE_TIME": str(cfg.cycle_time_ms), "HOROVOD_CACHE_CAPACITY": str(cfg.cache_capacity)}
    overridden = [f"{k}={os.environ[k]}" for k, v in knobs.items() if os.environ.get(k, v) != v]
    os.environ.update(knobs)
    hvd.init()
    if overridden and hvd.rank() == 0:
        print(f"[models.distributed] distributed config overrides {', '.join(overridden)}", file=sys.stderr)
    ctx.rank, ctx.world_size, ctx.backend = hvd.rank(), hvd.size(), "horovod"
    ctx.device = _device_for("horovod", hvd.local_rank())


def import_horovod():
    """``horovod.torch``, or a one-line error saying how to install it."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise HorovodMissingError(
            f"distributed.engine=horovod but Horovod is not importable ({exc}); "
            "install it with `make horovod` (builds the C++17-patched 0.28.1 wheel)") from None
    return hvd


def init_from_env(cfg: DistributedConfig | None = None) -> DistContext:
    """Join the job the launcher started (or run alone) and check every rank has the same config.

    World size 1 needs no process group. Backend: NCCL with GPUs, gloo on CPUs (or ``cfg.backend``).
    With ``engine='horovod'`` Horovod is initialised instead of torch.distributed.
    """
    cfg = (cfg or DistributedConfig()).resolved()
    launch = detect_launch()
    if launch.world_size < 1 or not 0 <= launch.rank < launch.world_size:
        raise DistributedConfigError(
            f"{launch.launcher} gave rank {launch.rank} of world size {launch.world_size}; check the launcher")
    ctx = DistContext(rank=launch.rank, world_size=launch.world_size, launcher=launch.launcher)
    if cfg.engine == "horovod" and launch.world_size > 1:
        _init_horovod(ctx, cfg)
    elif launch.world_size > 1:
        _init_torch(ctx, cfg, launch)
    else:
        ctx.device = torch.device("cuda", 0) if torch.cuda.is_available() and cfg.backend != "gloo" else torch.device("cpu")
        return ctx
    gathered = all_gather_objects(ctx, (socket.gethostname(), cfg.digest()))
    _check_same_config(ctx, [d for _, d in gathered], "the distributed config (hash)")
    _node_layout(ctx, launch, cfg, [h for h, _ in gathered])
    _settle_device(ctx)
    return ctx
