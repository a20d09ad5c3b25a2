"""Named execution profiles -> Parsl `Config` factories (Parsl has no config-file loader).

Every profile builds two executors:

* ``workers`` runs simulation chunks and evaluation (one task per worker);
* ``train`` runs the training job, a shell command from `train_command` (one process locally,
  `torchrun --standalone` for several local ranks, or an MPI/torchrun launch across nodes).

Profiles: ``local`` (thread pools, starts instantly; the embedded default), ``local-htex``
(HighThroughputExecutor bound to 127.0.0.1, one worker per GPU via ``available_accelerators``),
``slurm`` (SlurmProvider + SrunLauncher for the workers; MPIExecutor with srun for training) and
``pbs`` (PBSProProvider + MpiExecLauncher; MPIExecutor with mpiexec). Cluster blocks start at
zero and Parsl's "simple" strategy requests them when tasks are waiting, so no idle job is queued. Every site-specific value
(partition, account, queue, walltime, worker_init, nodes, GPUs per node) comes from the YAML.
"""
from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path
from typing import Callable

from parsl.addresses import address_by_interface
from parsl.config import Config
from parsl.dataflow.memoization import BasicMemoizer
from parsl.executors import HighThroughputExecutor, MPIExecutor, ThreadPoolExecutor
from parsl.launchers import MpiExecLauncher, SimpleLauncher, SrunLauncher
from parsl.launchers.base import Launcher
from parsl.providers import LocalProvider, PBSProProvider, SlurmProvider
from parsl.providers.base import ExecutionProvider

from .apps import TRAIN, WORKERS
from .config import PROFILE_NAMES, ClusterSite, ExecutionConfig
#: rendezvous port of multi-node training (torch.distributed MASTER_PORT).
MASTER_PORT = 29500
#: the prefix of every Python command a profile starts: ``python -m`` (and a ``-c`` or spawned
#: multiprocessing child) puts the working directory first on sys.path, so a ``yaml.py`` or
#: ``workflow/`` lying where the user stands would be imported and run. The variable (Python >=
#: 3.11, as ``-P``) is inherited, so it also covers the ranks torchrun re-launches with ``-m``, and
#: ``env`` sets it on the far side of srun/mpiexec, which need not pass the driver's environment on.
SAFE_PATH = "env PYTHONSAFEPATH=1"


def _common(exec_cfg: ExecutionConfig, run_dir: Path, executors: list, max_idletime: float = 120.0) -> Config:
    """Settings every profile shares (see FACTS.md, Parsl 2026.10.26).

    exit_mode='wait': the default abandons running tasks on exit; usage_tracking=0: no phoning
    home. ``max_idletime``: seconds a block with nothing to do keeps its nodes before Parsl
    cancels it (a cluster site sets it: `ClusterSite.max_idletime`). No memoisation and no
    checkpoint files (`NO_MEMO`): Parsl's checkpoints are pickles it loads from every
    runinfo/*/checkpoint/tasks.pkl at start, so a run directory someone sent would execute code;
    the stores and the stage summaries already decide what is done.
    """
    return Config(
        executors=executors,
        run_dir=str(Path(run_dir) / "runinfo"),
        retries=exec_cfg.retries,
        retry_handler=retry_only_simulation,
        memoizer=no_memoizer(),
        exit_mode="wait",
        usage_tracking=0,
        strategy="simple",
        strategy_period=1,
        max_idletime=max_idletime,
        initialize_logging=True,
    )


def no_memoizer() -> BasicMemoizer:
    """A memoizer that neither looks up, records, writes nor reads anything.

    ``checkpoint_files=[]`` is what keeps Parsl from globbing runinfo/ for pickles to load;
    ``checkpoint_mode=None`` keeps it from writing any; ``memoize=False`` turns the lookup off.
    """
    return BasicMemoizer(memoize=False, checkpoint_files=[], checkpoint_mode=None)


def retry_only_simulation(exc: BaseException, task_record: dict) -> float:
    """Parsl retry cost: simulation tasks retry (a lost worker is worth another try); training and
    evaluation fail at once, since their failures are deterministic and their logs say why."""
    return 1.0 if task_record["func_name"] == "simulate_app" else float("inf")


def local_config(exec_cfg: ExecutionConfig, run_dir: Path) -> Config:
    """Thread pools in this process: no start-up cost, right for a laptop and for tests."""
    return _common(exec_cfg, run_dir, [
        ThreadPoolExecutor(label=WORKERS, max_threads=exec_cfg.workers),
        ThreadPoolExecutor(label=TRAIN, max_threads=1),
    ])


def _venv_script(name: str) -> str:
    """Absolute path of a Parsl entry script next to this interpreter (the venv may not be on PATH)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    return shutil.which(name) or name


def _interchange_cmd() -> list[str]:
    """The interchange runs beside the driver, with the driver's interpreter."""
    return [sys.executable, "-P", _venv_script("interchange.py")]   # -P: see SAFE_PATH


def _set_interchange_cmd(executor: MPIExecutor) -> None:
    # MPIExecutor annotates interchange_launch_cmd as a str (typeguard rejects the list HTEX
    # needs, and Popen cannot run a str with arguments), so set it after construction.
    executor.interchange_launch_cmd = _interchange_cmd()


def local_htex_config(exec_cfg: ExecutionConfig, run_dir: Path) -> Config:
    """A HighThroughputExecutor on this machine, loopback only; one worker per GPU if any."""
    site = exec_cfg.local_htex
    gpus = site.gpus_per_node
    htex = HighThroughputExecutor(
        label=WORKERS,
        # Without an explicit address HTEX probes an external service for 30 s (FACTS.md).
        address="127.0.0.1",
        loopback_address="127.0.0.1",
        max_workers_per_node=gpus or exec_cfg.workers,
        available_accelerators=gpus,
        cores_per_worker=site.cores_per_worker,
        # Workers and interchange are found through PATH; the venv need not be activated.
        launch_cmd=f"{SAFE_PATH} {shlex.quote(sys.executable)} {shlex.quote(_venv_script('process_worker_pool.py'))} "
        + _DEFAULT_LAUNCH_ARGS,
        interchange_launch_cmd=_interchange_cmd(),
        provider=LocalProvider(init_blocks=1, min_blocks=0, max_blocks=1),
        heartbeat_period=5,
        heartbeat_threshold=30,
        poll_period=10,
        encrypted=False,
    )
    return _common(exec_cfg, run_dir, [htex, ThreadPoolExecutor(label=TRAIN, max_threads=1)])


def _launch_args() -> str:
    """HTEX's default worker launch arguments without the leading script name."""
    from parsl.executors.high_throughput.executor import DEFAULT_LAUNCH_CMD

    return DEFAULT_LAUNCH_CMD.split(" ", 1)[1]


_DEFAULT_LAUNCH_ARGS = _launch_args()
#: a cluster node's worker pool: Parsl's default command (found through PATH there), without the
#: working directory on sys.path of the pool and the workers it spawns
_SAFE_LAUNCH_CMD = f"{SAFE_PATH} process_worker_pool.py {_DEFAULT_LAUNCH_ARGS}"


def slurm_config(exec_cfg: ExecutionConfig, run_dir: Path) -> Config:
    """Slurm: an HTEX worker pool launched by srun, and an MPIExecutor (srun) for training."""
    site = exec_cfg.slurm

    def provider(nodes: int, max_blocks: int, walltime: str, launcher: Launcher,
                 tasks_per_node: int | None = None) -> SlurmProvider:
        return _TasksSlurmProvider(
            tasks_per_node=tasks_per_node, nodes_per_block=nodes, init_blocks=0, min_blocks=0,
            max_blocks=max_blocks,
            walltime=walltime, launcher=launcher, partition=site.partition, account=site.account,
            qos=site.qos, constraint=site.constraint, exclusive=site.exclusive,
            worker_init=site.worker_init, cores_per_node=site.cores_per_node,
            mem_per_node=site.mem_per_node_gb,
            scheduler_options=_gpu_sbatch(site.scheduler_options, site.gpus_per_node))

    return _cluster_config(exec_cfg, run_dir, site, provider, SrunLauncher(), "srun")


class _TasksSlurmProvider(SlurmProvider):
    """A SlurmProvider that can ask for ``tasks_per_node`` tasks per node whatever the executor says.

    The MPIExecutor submits its block with one task per node (its one manager, started by
    SimpleLauncher), so Slurm would allocate one task's CPUs, and the training's own
    ``srun --ntasks <ranks>`` inside that block fails on a shared node ("More processors requested
    than permitted"). The training block asks for one task per rank instead; ``cores_per_node`` is
    then split among them (``--cpus-per-task``), as Parsl does for its worker tasks.
    """

    def __init__(self, tasks_per_node: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.tasks_per_node = tasks_per_node

    def submit(self, command: str, tasks_per_node: int, job_name: str = "parsl.slurm") -> str:
        return super().submit(command, self.tasks_per_node or tasks_per_node, job_name)


def pbs_config(exec_cfg: ExecutionConfig, run_dir: Path) -> Config:
    """PBS Pro: an HTEX worker pool launched by mpiexec, and an MPIExecutor (mpiexec) for training."""
    site = exec_cfg.pbs
    select = site.select_options
    if site.gpus_per_node and "ngpus" not in select:
        select = f"{select}:ngpus={site.gpus_per_node}" if select else f"ngpus={site.gpus_per_node}"

    def provider(nodes: int, max_blocks: int, walltime: str, launcher: Launcher,
                 tasks_per_node: int | None = None) -> PBSProProvider:
        # PBS sizes the training block by select/ncpus (cpus_per_node), not by tasks.
        return PBSProProvider(
            nodes_per_block=nodes, init_blocks=0, min_blocks=0, max_blocks=max_blocks,
            walltime=walltime, launcher=launcher, account=site.account, queue=site.queue,
            worker_init=site.worker_init, scheduler_options=site.scheduler_options,
            select_options=select, cpus_per_node=site.cpus_per_node)

    launcher = MpiExecLauncher(bind_cmd=site.mpiexec_bind_cmd, overrides=site.mpiexec_overrides)
    return _cluster_config(exec_cfg, run_dir, site, provider, launcher, "mpiexec")


def _cluster_config(exec_cfg: ExecutionConfig, run_dir: Path, site: ClusterSite,
                    provider: Callable[..., ExecutionProvider],
                    worker_launcher: Launcher, mpi_launcher: str) -> Config:
    """An HTEX pool (one manager per node, started by ``worker_launcher``) for simulation and
    evaluation, and an MPIExecutor whose single manager (SimpleLauncher) starts training ranks
    with ``mpi_launcher``; its block asks for as many tasks per node as training starts there."""
    workers = HighThroughputExecutor(
        label=WORKERS,
        address=_driver_address(site),
        launch_cmd=_SAFE_LAUNCH_CMD,
        interchange_launch_cmd=_interchange_cmd(),
        max_workers_per_node=site.gpus_per_node or exec_cfg.workers,
        available_accelerators=site.gpus_per_node,
        provider=provider(site.nodes, site.max_blocks, site.walltime, worker_launcher),
        **_heartbeat(site),
    )
    train = MPIExecutor(
        label=TRAIN,
        address=_driver_address(site),
        launch_cmd=_SAFE_LAUNCH_CMD,
        mpi_launcher=mpi_launcher,
        max_workers_per_block=1,
        provider=provider(site.train_nodes, 1, site.train_walltime, SimpleLauncher(),
                          tasks_per_node=train_ranks_per_node(exec_cfg)),
        **_heartbeat(site),
    )
    _set_interchange_cmd(train)
    return _common(exec_cfg, run_dir, [workers, train], max_idletime=site.max_idletime)


def _heartbeat(site: ClusterSite) -> dict[str, int]:
    """Heartbeats often enough that a few can be missed before ``heartbeat_threshold`` (Parsl's
    defaults are 30 s and 120 s)."""
    return {"heartbeat_threshold": site.heartbeat_threshold,
            "heartbeat_period": max(1, min(30, site.heartbeat_threshold // 4))}


def _driver_address(site: ClusterSite) -> str | None:
    """Where workers on compute nodes reach the driver: a named interface beats a fixed address."""
    if site.interface:
        return address_by_interface(site.interface)
    return site.address


def _gpu_sbatch(options: str, gpus_per_node: int) -> str:
    """Add ``#SBATCH --gpus-per-node`` unless the site already asks for GPUs its own way."""
    if gpus_per_node and "--gpus" not in options and "--gres" not in options:
        options = (options + "\n" if options else "") + f"#SBATCH --gpus-per-node={gpus_per_node}"
    return options


FACTORIES: dict[str, Callable[[ExecutionConfig, Path], Config]] = {
    "local": local_config,
    "local-htex": local_htex_config,
    "slurm": slurm_config,
    "pbs": pbs_config,
}
assert tuple(FACTORIES) == PROFILE_NAMES, "workflow.config.PROFILE_NAMES and FACTORIES disagree"


def build_parsl_config(exec_cfg: ExecutionConfig, run_dir: str | Path) -> Config:
    """The Parsl Config of the profile named by ``exec_cfg.profile``."""
    return FACTORIES[exec_cfg.profile](exec_cfg, Path(run_dir))


def worker_slots(exec_cfg: ExecutionConfig) -> int:
    """How many `workers` tasks run at once under this profile (the simulation fan-out width)."""
    if exec_cfg.profile == "local":
        return exec_cfg.workers
    if exec_cfg.profile == "local-htex":
        return exec_cfg.local_htex.gpus_per_node or exec_cfg.workers
    site = _site(exec_cfg)
    return (site.gpus_per_node or exec_cfg.workers) * site.nodes * site.max_blocks


# --------------------------------------------------------------------------------------------
# the training command


def train_command(exec_cfg: ExecutionConfig, cli_args: list[str]) -> tuple[str, dict]:
    """Shell command that runs `namsa train <cli_args>` under this profile, and its Parsl resource spec.

    local / local-htex: one process, or ``torchrun --standalone`` with gloo/NCCL for several local
    ranks. slurm / pbs: ``$PARSL_MPI_PREFIX`` (srun or mpiexec, composed by the MPIExecutor) starts
    one rank per GPU, or one torchrun per node that starts the ranks itself. The rank-0 host is the
    first node of the block (``$PARSL_MPI_NODELIST``) and is exported as MASTER_ADDR.
    """
    args = " ".join(shlex.quote(a) for a in cli_args)
    per_node = exec_cfg.train_processes_per_node
    if exec_cfg.profile in ("local", "local-htex"):
        python = f"{SAFE_PATH} {shlex.quote(sys.executable)}"
        if per_node == 1:
            return f"{python} -m workflow.cli train {args}", {}
        return (f"{python} -m torch.distributed.run --standalone --nproc_per_node={per_node} "
                f"-m workflow.cli train {args}"), {}
    site = _site(exec_cfg)
    rendezvous = ('export MASTER_ADDR="${PARSL_MPI_NODELIST%%,*}"; '
                  f"export MASTER_PORT={MASTER_PORT}; ")
    python = f"$PARSL_MPI_PREFIX {SAFE_PATH} python"
    if site.train_launcher == "torchrun":
        command = (rendezvous + f"{python} -m torch.distributed.run "
                   f"--nnodes={site.train_nodes} --nproc_per_node={site.gpus_per_node or per_node} "
                   "--rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT "
                   f"-m workflow.cli train {args}")
        return command, {"num_nodes": site.train_nodes, "ranks_per_node": 1}
    command = rendezvous + f"{python} -m workflow.cli train {args}"
    return command, {"num_nodes": site.train_nodes, "ranks_per_node": train_ranks_per_node(exec_cfg)}


def _site(exec_cfg: ExecutionConfig) -> ClusterSite:
    return exec_cfg.slurm if exec_cfg.profile == "slurm" else exec_cfg.pbs


def train_ranks_per_node(exec_cfg: ExecutionConfig) -> int:
    """Processes the cluster launcher starts per training node: one per GPU (or
    `train_processes_per_node` on CPU nodes), or one torchrun that starts the ranks itself."""
    site = _site(exec_cfg)
    if site.train_launcher == "torchrun":
        return 1
    return site.gpus_per_node or exec_cfg.train_processes_per_node

