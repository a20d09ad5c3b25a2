"""The `slurm` profile against a real Slurm: a one-node cluster on localhost (scripts/slurm_localhost.sh).

Parsl's SlurmProvider submits the simulation and evaluation blocks with sbatch, the worker pool is
started by srun inside them, training runs as srun over 2 ranks (gloo on CPU) inside its own
block, and a simulation block killed with scancel is recovered by rerunning the same command.
`make test-slurm` installs the packages and runs this file; docs/cluster.md describes it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import stage

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm_localhost.sh"
MICRO = ROOT / "configs" / "micro.yaml"
MICRO_SAMPLES = 8           # 4 materials x 2 zone axes
DAEMONS = ("slurmctld", "slurmd", "munged")
RUN_TIMEOUT_S = 600


def _skip_reason() -> str | None:
    missing = [name for name in DAEMONS if shutil.which(name) is None
               and not Path("/usr/sbin", name).exists()]
    if missing:
        return (f"{', '.join(missing)} not installed: apt-get install -y slurm-wlm munge "
                f"(or make test-slurm)")
    if os.geteuid() != 0:
        return "the localhost Slurm cluster runs its daemons as root; run as root (make test-slurm)"
    return None


@pytest.fixture(scope="module")
def slurm_env():
    """Start the cluster; yield the environment that points sbatch/srun/squeue at it; stop it."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    # A short path: munged's socket lives under it (unix socket paths are limited to 107 bytes).
    cluster = Path(tempfile.mkdtemp(prefix="namsa-slurm-"))
    env = {**os.environ, "PATH": f"{os.environ.get('PATH', '')}:/usr/sbin", "OMP_NUM_THREADS": "1"}
    cluster.chmod(0o755)  # munged wants every directory above its socket searchable
    try:
        subprocess.run(["bash", str(SCRIPT), "start", str(cluster)], env=env, check=True, timeout=120,
                       capture_output=True, text=True)
        env["SLURM_CONF"] = str(cluster / "etc" / "slurm.conf")
        yield env
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"the localhost Slurm cluster did not start: {exc.stderr.strip()}")
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(cluster)], env=env, timeout=120)


def _worker_init() -> str:
    """Runs first in every job: activates the venv this test runs in (the jobs find
    process_worker_pool.py and `python` through PATH)."""
    bin_dir = Path(sys.executable).parent
    activate = bin_dir / "activate"
    return f"source {activate}" if activate.exists() else f"export PATH={bin_dir}:$PATH"


def namsa_run(out: Path, *extra: str) -> list[str]:
    """`namsa run configs/micro.yaml` with the slurm profile pointed at the localhost cluster."""
    namsa = Path(sys.executable).parent / "namsa"
    sets = {
        "execution.profile": "slurm",
        "execution.slurm.partition": "debug",
        "execution.slurm.account": "null",
        "execution.slurm.walltime": "00:10:00",
        "execution.slurm.train_walltime": "00:10:00",
        "execution.slurm.nodes": "1",
        "execution.slurm.train_nodes": "1",
        "execution.slurm.cores_per_node": str(os.cpu_count() or 2),
        "execution.slurm.address": "127.0.0.1",      # the "compute node" is this machine
        "execution.slurm.worker_init": _worker_init(),
        # One node: the idle simulation block must give it up for training (and training for
        # evaluation) within seconds, not Parsl's default 2 minutes.
        "execution.slurm.max_idletime": "5",
        "execution.slurm.heartbeat_threshold": "20",
        "execution.train_processes_per_node": "2",  # srun starts 2 training ranks
        "distributed.backend": "gloo",
    }
    command = [str(namsa), "run", str(MICRO), "--out", str(out), "--no-progress"]
    for key, value in sets.items():
        command += ["--set", f"{key}={value}"]
    for item in extra:
        command += ["--set", item]
    return command


def _run(command: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=ROOT)


def _stored_ids(data_dir: Path) -> list[str]:
    with stage.open_stores(data_dir) as stores:
        return stores.ids()


def test_namsa_run_on_a_real_slurm(slurm_env, tmp_path):
    out = tmp_path / "run"
    result = _run(namsa_run(out), slurm_env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["stages_run"] == ["simulate", "train", "evaluate"]
    assert summary["available"] == summary["planned"] == MICRO_SAMPLES and not summary["failures"]
    assert (out / "model" / "model.safetensors").exists() and (out / "eval" / "report.html").exists()
    assert (out / "eval" / "metrics.json").exists()
    # Training ran as 2 ranks of one process group (srun inside the training block).
    assert json.loads((out / "train_run.json").read_text())["identity"]["world_size"] == 2

    # The job scripts Parsl submitted, by executor label (parsl.<label>.block-<n>.<time>).
    scripts = {p.name.split(".")[1]: p.read_text() for p in (out / "runinfo").rglob("parsl.*.block-*")
               if not p.name.endswith((".stdout", ".stderr"))}
    assert "srun --ntasks 1" in scripts["workers"] and "process_worker_pool.py" in scripts["workers"]
    # The training block asks Slurm for a task per rank, so its srun --ntasks 2 may start them.
    assert "#SBATCH --ntasks-per-node=2" in scripts["train"] and "--mpi-launcher=srun" in scripts["train"]


def _workers_job(env: dict) -> str | None:
    """The Slurm job id of the running simulation block, if any."""
    listing = subprocess.run(["squeue", "--noheader", "--format=%i %j %t"], env=env, capture_output=True,
                             text=True, check=True).stdout
    for line in listing.splitlines():
        job_id, name, state = line.split()
        if name.startswith("parsl.workers.block-") and state == "R":
            return job_id
    return None


def _samples_written(logs: Path) -> int:
    total = 0
    for path in logs.glob("store-*.progress.json"):
        try:
            total += json.loads(path.read_text()).get("written", 0)
        except (json.JSONDecodeError, OSError):
            pass  # being rewritten right now
    return total


def _scancel_after_first_samples(proc: subprocess.Popen, out: Path, env: dict) -> str:
    """Wait until the simulation has written its first samples, then scancel its block."""
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        job = _workers_job(env)
        if job and _samples_written(out / "logs") >= 1:
            subprocess.run(["scancel", job], env=env, check=True)
            return job
        time.sleep(0.2)
    raise AssertionError(f"no simulation block wrote a sample in time (namsa exited {proc.poll()})")


def test_scancelled_simulation_recovers_on_rerun(slurm_env, tmp_path):
    out = tmp_path / "run"
    # Finer sampling and a thicker crystal: about 2 s a sample, so the kill lands mid-simulation.
    # No Parsl retry: the killed block's tasks fail in this run and the rerun has to make them.
    command = namsa_run(out, "simulation.sampling_A=0.05", "simulation.thickness_A=200", "execution.retries=0")
    first = subprocess.Popen(command, env=slurm_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        _scancel_after_first_samples(first, out, slurm_env)
        log, _ = first.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if first.poll() is None:
            first.kill()
    assert len(set(_stored_ids(out / "data"))) < MICRO_SAMPLES, "the kill came after the simulation ended"
    assert first.returncode != 0 or "failed" in log, log[-3000:]

    rerun = _run(command, slurm_env)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert "simulate" in summary["stages_run"] and summary["available"] == MICRO_SAMPLES
    assert (out / "model" / "model.safetensors").exists() and (out / "eval" / "report.html").exists()
    ids = _stored_ids(out / "data")
    assert len(ids) == len(set(ids)) == MICRO_SAMPLES, sorted(ids)
