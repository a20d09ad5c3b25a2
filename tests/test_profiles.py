"""Execution profiles build real Parsl configs; Slurm/PBS ones write real submit scripts.

No scheduler is installed here, so `sbatch`/`qsub` (and the status/cancel commands Parsl polls)
are tiny shell scripts on PATH that keep a copy of the script Parsl submits. Everything else is
real Parsl: the DataFlowKernel starts, the interchange starts, the provider renders its template
with our launcher and submits a block.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import parsl
import pytest
from parsl.executors import HighThroughputExecutor, MPIExecutor, ThreadPoolExecutor
from parsl.launchers import MpiExecLauncher, SimpleLauncher, SrunLauncher

from workflow.config import PROFILE_NAMES, ExecutionConfig
from workflow.profiles import FACTORIES, TRAIN, WORKERS, build_parsl_config, train_command

FAKE_SCHEDULER = {
    # sbatch SCRIPT -> keep the script, answer like Slurm does.
    "sbatch": 'cp "${@: -1}" "$FAKE_SCHED_DIR/"; echo "Submitted batch job 4242"',
    "sacct": "exit 1",      # Parsl falls back to squeue
    "squeue": "exit 0",
    "scancel": "exit 0",
    # qsub [-q Q] [-A A] SCRIPT -> keep the script, answer like PBS does.
    "qsub": 'cp "${@: -1}" "$FAKE_SCHED_DIR/"; echo "4242.pbs"',
    "qstat": "echo '{\"Jobs\": {}}'",
    "qdel": "exit 0",
}


@pytest.fixture()
def fake_scheduler(tmp_path, monkeypatch):
    bin_dir, scripts = tmp_path / "bin", tmp_path / "submitted"
    bin_dir.mkdir()
    scripts.mkdir()
    for name, body in FAKE_SCHEDULER.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SCHED_DIR", str(scripts))
    return scripts


def test_every_profile_name_has_a_factory():
    assert tuple(FACTORIES) == PROFILE_NAMES


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_profile_common_settings(profile, tmp_path, fake_scheduler):
    cfg = build_parsl_config(ExecutionConfig(profile=profile, retries=3), tmp_path)
    assert [e.label for e in cfg.executors] == [WORKERS, TRAIN]
    assert cfg.exit_mode == "wait" and cfg.usage_tracking == 0 and cfg.retries == 3
    assert cfg.memoizer.checkpoint_files == [] and cfg.memoizer.checkpoint_mode is None  # no pickles
    # Only simulation tasks are retried; a training failure is reported at once.
    assert cfg.retry_handler(RuntimeError(), {"func_name": "simulate_app"}) == 1.0
    assert cfg.retry_handler(RuntimeError(), {"func_name": "train_app"}) > cfg.retries
    assert cfg.run_dir == str(tmp_path / "runinfo")


def test_local_profile_is_thread_pools():
    cfg = build_parsl_config(ExecutionConfig(profile="local", workers=3), Path("/tmp/unused"))
    workers, train = cfg.executors
    assert isinstance(workers, ThreadPoolExecutor) and workers.max_threads == 3
    assert isinstance(train, ThreadPoolExecutor) and train.max_threads == 1


def test_local_htex_is_loopback_with_one_worker_per_gpu():
    exec_cfg = ExecutionConfig(profile="local-htex", local_htex={"gpus_per_node": 4})
    htex = build_parsl_config(exec_cfg, Path("/tmp/unused")).executors[0]
    assert isinstance(htex, HighThroughputExecutor)
    assert htex.address == "127.0.0.1" and htex.loopback_address == "127.0.0.1"
    assert list(htex.available_accelerators) == ["0", "1", "2", "3"]
    assert htex.max_workers_per_node == 4
    # The worker pool is started with this interpreter, so an unactivated venv works, and without the
    # working directory on its path (issue 32)
    import shlex

    assert htex.launch_cmd.split()[:3] == ["env", "PYTHONSAFEPATH=1", shlex.quote(sys.executable)]
    assert "process_worker_pool.py" in htex.launch_cmd


def _run_dfk_until_submitted(cfg, scripts: Path) -> tuple[str, str]:
    """Start the real DFK, ask each executor for one block, return the submitted scripts."""
    try:
        with parsl.load(cfg) as dfk:
            for label in (WORKERS, TRAIN):
                dfk.executors[label].scale_out_facade(1)
            texts = {p.name: p.read_text() for p in scripts.iterdir() if not p.name.startswith("cmd_")}
    finally:
        parsl.clear()
    assert len(texts) == 2, texts
    # Parsl names each job parsl.<executor label>.block-<n>.<time>.
    by_label = {name.split(".")[1]: text for name, text in texts.items()}
    return by_label[WORKERS], by_label[TRAIN]


def test_slurm_profile_submits_worker_and_training_jobs(tmp_path, fake_scheduler):
    exec_cfg = ExecutionConfig(profile="slurm", slurm=dict(
        partition="gpu", account="mat123", qos="normal", walltime="00:30:00", train_walltime="02:00:00",
        worker_init="module load cuda; source /sw/namsa/bin/activate", nodes=2, train_nodes=4,
        gpus_per_node=4, address="127.0.0.1"))
    cfg = build_parsl_config(exec_cfg, tmp_path)
    workers, train = cfg.executors
    assert isinstance(workers.provider.launcher, SrunLauncher)
    assert isinstance(train, MPIExecutor) and train.mpi_launcher == "srun"
    assert isinstance(train.provider.launcher, SimpleLauncher)

    worker_job, train_job = _run_dfk_until_submitted(cfg, fake_scheduler)
    for script in (worker_job, train_job):
        assert "#SBATCH --partition=gpu" in script and "#SBATCH --account=mat123" in script
        assert "#SBATCH --qos=normal" in script and "#SBATCH --gpus-per-node=4" in script
        assert "module load cuda; source /sw/namsa/bin/activate" in script
    assert "#SBATCH --nodes=2" in worker_job and "#SBATCH --time=30" in worker_job
    assert "srun --ntasks 2" in worker_job and "process_worker_pool.py" in worker_job
    assert "--available-accelerators 0 1 2 3" in worker_job
    assert "#SBATCH --nodes=4" in train_job and "#SBATCH --time=120" in train_job
    # One task per training rank, so the training's `srun --ntasks 16` fits its allocation even on
    # shared nodes (a real Slurm refuses more tasks than the job holds; tests/test_slurm_real.py).
    assert "#SBATCH --ntasks-per-node=4" in train_job and "#SBATCH --ntasks-per-node=1" in worker_job
    # The training block runs one MPI-mode manager (SimpleLauncher) that srun-launches each task.
    last_line = train_job.strip().splitlines()[-1]
    assert last_line.startswith("env PYTHONSAFEPATH=1 process_worker_pool.py") and "--enable_mpi_mode" in last_line
    assert "--mpi-launcher=srun" in last_line


def test_cluster_sites_set_idle_time_and_heartbeats(tmp_path, fake_scheduler):
    exec_cfg = ExecutionConfig(profile="slurm", slurm=dict(max_idletime=5, heartbeat_threshold=20,
                                                           cores_per_node=8, address="127.0.0.1"),
                               train_processes_per_node=2)
    cfg = build_parsl_config(exec_cfg, tmp_path)
    assert cfg.max_idletime == 5
    for executor in cfg.executors:
        assert executor.heartbeat_threshold == 20 and executor.heartbeat_period == 5
    _, train_job = _run_dfk_until_submitted(cfg, fake_scheduler)
    # The cores are split among the training ranks, as Parsl splits them among worker tasks.
    assert "#SBATCH --ntasks-per-node=2" in train_job and "#SBATCH --cpus-per-task=4" in train_job


def test_pbs_profile_submits_worker_and_training_jobs(tmp_path, fake_scheduler):
    exec_cfg = ExecutionConfig(profile="pbs", pbs=dict(
        account="MAT123", queue="prod", walltime="00:30:00", worker_init="module load conda",
        nodes=2, train_nodes=8, cpus_per_node=64, gpus_per_node=4, address="127.0.0.1",
        scheduler_options="#PBS -l filesystems=home:eagle"))
    cfg = build_parsl_config(exec_cfg, tmp_path)
    workers, train = cfg.executors
    assert isinstance(workers.provider.launcher, MpiExecLauncher)
    assert isinstance(train, MPIExecutor) and train.mpi_launcher == "mpiexec"

    worker_job, train_job = _run_dfk_until_submitted(cfg, fake_scheduler)
    assert "#PBS -l select=2:ncpus=64:ngpus=4" in worker_job
    assert "#PBS -l select=8:ncpus=64:ngpus=4" in train_job
    for script in (worker_job, train_job):
        assert "#PBS -l walltime=" in script and "#PBS -l filesystems=home:eagle" in script
        assert "module load conda" in script
    assert "mpiexec --bind-to none" in worker_job and "process_worker_pool.py" in worker_job
    assert "--mpi-launcher=mpiexec" in train_job.strip().splitlines()[-1]


def test_train_command_per_profile():
    args = ["cfg.yaml", "--data", "d", "--out", "o"]
    local, spec = train_command(ExecutionConfig(profile="local"), args)
    assert local.endswith("-m workflow.cli train cfg.yaml --data d --out o") and spec == {}
    multi, _ = train_command(ExecutionConfig(profile="local-htex", train_processes_per_node=2), args)
    assert "torch.distributed.run --standalone --nproc_per_node=2" in multi

    srun, spec = train_command(ExecutionConfig(profile="slurm", slurm={"train_nodes": 4, "gpus_per_node": 4}), args)
    assert "$PARSL_MPI_PREFIX env PYTHONSAFEPATH=1 python -m workflow.cli train" in srun and "MASTER_ADDR" in srun
    assert spec == {"num_nodes": 4, "ranks_per_node": 4}
    torchrun, spec = train_command(ExecutionConfig(profile="pbs", pbs={
        "train_nodes": 2, "gpus_per_node": 4, "train_launcher": "torchrun"}), args)
    assert "--nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d" in torchrun
    assert spec == {"num_nodes": 2, "ranks_per_node": 1}


# -- the training command imports nothing from the caller's directory ---------------------------

#: modules a planted file shadows: the package the command runs, and what it and torchrun import
PLANTED = ("workflow/__init__.py", "workflow/cli.py", "yaml.py", "torch.py", "numpy.py")


def _plant(where: Path) -> Path:
    """A working directory whose every planted module writes ``marker`` when imported."""
    marker = where / "marker"
    for name in PLANTED:
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    return marker


@pytest.mark.parametrize("profile, per_node", [("local", 1), ("local-htex", 2), ("slurm", 1)])
def test_the_training_command_imports_nothing_from_the_working_directory(profile, per_node, tmp_path):
    """The real command a profile builds (single process, torchrun with its re-launched ranks, and a
    cluster rank after $PARSL_MPI_PREFIX), run in a directory of planted modules: none is imported,
    and the real `namsa train` runs (and refuses the missing config)."""
    cwd = tmp_path / "cwd"
    marker = _plant(cwd)
    command, _ = train_command(ExecutionConfig(profile=profile, train_processes_per_node=per_node),
                               [str(tmp_path / "missing.yaml"), "--data", "d", "--out", "o"])
    env = {**os.environ, "PARSL_MPI_PREFIX": "", "PARSL_MPI_NODELIST": "localhost",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONSAFEPATH", None)
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert not marker.exists(), marker.read_text()
    assert "namsa: error: " in done.stderr and "missing.yaml" in done.stderr, done.stderr[-2000:]
