"""Files that came from elsewhere (a run directory someone sent, a spec on a command line) are data,
never code: nothing in them is unpickled.

Each test plants a pickle whose loading would create a marker file and runs the real entry point
in a subprocess; the marker must not appear. Without the fix (Parsl's task_exit memoizer, which
unpickles every runinfo/*/checkpoint/tasks.pkl at start; the Horovod tuning worker's pickled
problem) each marker is created.
"""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from workflow.config import ExecutionConfig
from workflow.profiles import build_parsl_config

REPO = Path(__file__).resolve().parents[1]
MICRO = REPO / "configs" / "micro.yaml"


class _Payload:
    """Unpickling this calls open(marker, "w"): the file appears if anything loads the pickle."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant_memo_payload(run_dir: Path, marker: Path) -> Path:
    """A Parsl checkpoint file as an attacker would leave it: runinfo/000/checkpoint/tasks.pkl."""
    tasks = run_dir / "runinfo" / "000" / "checkpoint" / "tasks.pkl"
    tasks.parent.mkdir(parents=True)
    tasks.write_bytes(pickle.dumps(_Payload(marker)))
    return tasks


def test_the_planted_payload_runs_when_unpickled(tmp_path):
    """The payload is live: loading it does create the marker (so the tests below can fail)."""
    marker = tmp_path / "pwned"
    tasks = plant_memo_payload(tmp_path / "run", marker)
    pickle.loads(tasks.read_bytes()).close()
    assert marker.exists()


@pytest.mark.parametrize("profile", ["local", "local-htex", "slurm", "pbs"])
def test_no_profile_reads_or_writes_memo_checkpoints(profile, tmp_path):
    memoizer = build_parsl_config(ExecutionConfig(profile=profile), tmp_path).memoizer
    assert memoizer.checkpoint_files == [] and memoizer.checkpoint_mode is None and not memoizer.memoize


def plant_truncated_memo(run_dir: Path) -> Path:
    """A memo file cut short by a kill during its write (it broke every later `namsa run`)."""
    tasks = run_dir / "runinfo" / "001" / "checkpoint" / "tasks.pkl"
    tasks.parent.mkdir(parents=True)
    tasks.write_bytes(pickle.dumps({"hash": "x" * 64, "result": list(range(100))})[:40])
    return tasks


def test_parsl_start_does_not_unpickle_a_planted_memo_file(tmp_path):
    """parsl.load with our profile on a run directory holding a payload and a truncated memo
    file: nothing runs, nothing fails."""
    run_dir, marker = tmp_path / "run", tmp_path / "pwned"
    plant_memo_payload(run_dir, marker)
    plant_truncated_memo(run_dir)
    code = ("import sys, parsl\n"
            "from pathlib import Path\n"
            "from workflow.config import ExecutionConfig\n"
            "from workflow.profiles import build_parsl_config\n"
            "dfk = parsl.load(build_parsl_config(ExecutionConfig(), Path(sys.argv[1])))\n"
            "dfk.cleanup()\n")
    done = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()


@pytest.mark.slow  # a whole micro pipeline run (~1 min)
def test_namsa_run_on_a_run_directory_with_a_planted_or_truncated_memo_file(tmp_path):
    """`namsa run --out DIR` on a DIR whose runinfo holds a payload and a half-written memo file
    (a kill during its write): the run completes, nothing is executed, no memo file is written."""
    run_dir, marker = tmp_path / "run", tmp_path / "pwned"
    planted = plant_memo_payload(run_dir, marker)
    truncated = plant_truncated_memo(run_dir)
    done = subprocess.run([sys.executable, "-m", "workflow.cli", "run", str(MICRO), "--out", str(run_dir),
                           "--no-progress"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    written = [p for p in (run_dir / "runinfo").rglob("tasks.pkl") if p not in (planted, truncated)]
    assert written == []


def test_horovod_tuning_worker_does_not_unpickle_its_spec(tmp_path):
    """The Horovod tuning worker (`python -c HOROVOD_WORKER FILE`) takes JSON only: a pickle (bare,
    or base64 inside the old JSON spec) is refused before anything in it runs."""
    import base64

    from models.distributed.tuning import HOROVOD_WORKER

    marker = tmp_path / "pwned"
    bare = tmp_path / "spec.pkl"
    bare.write_bytes(pickle.dumps(_Payload(marker)))
    old_style = tmp_path / "spec.json"
    old_style.write_text(json.dumps({"cfg": {}, "problem": base64.b64encode(pickle.dumps(_Payload(marker))).decode(),
                                     "steps": 1, "warmup": 0, "out": str(tmp_path / "out")}))
    for spec in (bare, old_style):
        done = subprocess.run([sys.executable, "-c", HOROVOD_WORKER, str(spec)],
                              capture_output=True, text=True, timeout=120, cwd=REPO)
        assert done.returncode != 0
        assert not marker.exists()


def test_benchmark_problems_round_trip_through_json():
    from models.distributed.measure import BenchProblem, PresetProblem, problem_from_json

    for problem in (BenchProblem(width=8, depth=2, batch=3, px=8), PresetProblem("tiny", batch=2, px=16)):
        again = problem_from_json(json.loads(json.dumps(problem.to_json())))
        assert type(again) is type(problem) and again.to_json() == problem.to_json()
        x, y = again.make_batch(0, 0)
        x0, y0 = problem.make_batch(0, 0)
        assert (x == x0).all() and (y == y0).all()
