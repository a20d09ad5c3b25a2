"""One writer per output, and every sample stored once per data directory (issue 18).

Real processes throughout: two `namsa` commands on one --out, or the test process holding the
output lock (workflow.outlock, a flock: another process sees it exactly as it would see another
`namsa`) while a `namsa` subprocess tries the same --out. Concurrent `namsa simulate` workers with
different --of on one data directory check the claims (stage.claims).
"""
from __future__ import annotations

import csv
import fcntl
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import stage
from stage_helpers import CONFIG_HASH, make_samples
from workflow import data_runners
from workflow.cli import main
from workflow.config import load_config
from workflow.outlock import HELD_ENV, NOT_RECORDED, OutputBusy, hold_output, lock_path

REPO = Path(__file__).resolve().parents[1]
MICRO = str(REPO / "configs" / "micro.yaml")
NAMSA = str(Path(sys.executable).parent / "namsa")
#: a training long enough (steps logged one by one) for a second process to start meanwhile
STEPS = 300
TRAIN_SETS = ("--set", f"training.max_steps={STEPS}", "--set", "training.log_every=1", "--set",
              "training.eval_every=100", "--set", "training.checkpoint_every=100")


def _env() -> dict[str, str]:
    """The environment of a `namsa` child that is NOT part of this test's lock holding."""
    env = {k: v for k, v in os.environ.items() if k != HELD_ENV}
    env["OMP_NUM_THREADS"] = "1"
    return env


def namsa(*argv: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([NAMSA, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), **kw)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("namsa: error: "), err
    return lines[0]


def wait_for_holder(out: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``proc`` has recorded itself in the lock of ``out`` (it holds it from then on)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if json.loads(lock_path(out).read_text()).get("pid") == proc.pid:
                return
        except (FileNotFoundError, ValueError):
            pass
        assert proc.poll() is None, finish(proc)
        time.sleep(0.05)
    raise AssertionError(f"{proc.args} never took the lock of {out}")


def steps_logged(metrics_csv: Path) -> list[int]:
    with open(metrics_csv, newline="") as fh:
        return [int(row["step"]) for row in csv.DictReader(fh)]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A data directory of 12 small samples in micro.yaml's shapes (4x4 scan, 16 px)."""
    root = tmp_path_factory.mktemp("one_writer") / "data"
    with stage.StoreWriter(root / "store-000", config_hash=CONFIG_HASH) as writer:
        for sample in make_samples(6, variants=2, scan=(4, 4), px=16):
            writer.put(sample)
    return root


# --------------------------------------------------------------------------------------------
# the --out lock


def test_the_lock_lives_beside_the_output(tmp_path):
    assert lock_path(tmp_path / "runs" / "a") == tmp_path / "runs" / ".a.lock"
    assert lock_path("/") == Path("/.namsa-out.lock")


def _lock_unrecorded(out: Path):
    """The lock of ``out`` taken the way a holder takes it, before it writes its details."""
    lock_path(out).parent.mkdir(parents=True, exist_ok=True)
    fh = open(lock_path(out), "a+")
    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fh


def test_a_contender_waits_for_the_holder_to_record_itself(tmp_path):
    """The holder locks first and writes its details just after: a contender that reads the file
    in between (seen in CI) re-reads it and names the holder instead of 'not recorded yet'."""
    out = tmp_path / "train"
    fh = _lock_unrecorded(out)
    details = {"pid": 4242, "host": "node7", "command": "namsa train", "started": time.time()}
    writer = threading.Timer(0.3, lambda: (fh.write(json.dumps(details)), fh.flush()))
    writer.start()
    try:
        with pytest.raises(OutputBusy, match=r"in use by `namsa train` \(pid 4242 on node7"):
            with hold_output(out, "namsa test"):
                pass
    finally:
        writer.join()
        fh.close()


def test_a_holder_that_never_records_itself_is_still_named(tmp_path):
    out = tmp_path / "train"
    fh = _lock_unrecorded(out)
    try:
        with pytest.raises(OutputBusy) as busy:
            with hold_output(out, "namsa test"):
                pass
        assert NOT_RECORDED in str(busy.value)
    finally:
        fh.close()


def test_two_trainings_on_one_out_one_runs_the_other_exits_2(tmp_path, data):
    """Started together: whichever locks first trains, the other exits 2 naming it."""
    out = tmp_path / "train"
    both = [namsa("train", MICRO, "--data", str(data), "--out", str(out), "--no-progress", *TRAIN_SETS)
            for _ in range(2)]
    (rc_ok, _, err_ok), (rc_busy, _, err_busy) = sorted((finish(p) for p in both), key=lambda r: r[0])
    assert (rc_ok, rc_busy) == (0, 2), (err_ok, err_busy)
    line = one_error_line(err_busy)
    assert "is in use by `namsa train` (pid " in line and "wait for it or pass --wait" in line
    steps = steps_logged(out / "metrics.csv")
    assert steps == sorted(set(steps)) and steps[-1] == STEPS  # every step once


def test_two_resumes_at_once_one_resumes_the_other_exits_2(tmp_path, data):
    out = tmp_path / "train"
    rc, _, err = finish(namsa("train", MICRO, "--data", str(data), "--out", str(out), "--no-progress",
                              *TRAIN_SETS, "--set", "training.max_steps=10"))
    assert rc == 0, err
    both = [namsa("train", MICRO, "--data", str(data), "--out", str(out), "--resume", "--no-progress", *TRAIN_SETS)
            for _ in range(2)]
    results = sorted((finish(p) for p in both), key=lambda r: r[0])
    assert [r[0] for r in results] == [0, 2], results
    assert "is in use by `namsa train`" in one_error_line(results[1][2])
    steps = steps_logged(out / "metrics.csv")
    assert steps == sorted(set(steps)) and steps[-1] == STEPS


def test_two_resumes_through_a_symlinked_name_share_one_lock(tmp_path, data):
    """The lock is keyed on the directory's real path: `--out link` and `--out train` are one output."""
    out, link = tmp_path / "train", tmp_path / "link"
    rc, _, err = finish(namsa("train", MICRO, "--data", str(data), "--out", str(out), "--no-progress",
                              *TRAIN_SETS, "--set", "training.max_steps=10"))
    assert rc == 0, err
    link.symlink_to(out, target_is_directory=True)
    assert lock_path(link) == lock_path(out)
    both = [namsa("train", MICRO, "--data", str(d), "--out", str(name), "--resume", "--no-progress", *TRAIN_SETS)
            for d, name in ((data, out), (data, link))]
    results = sorted((finish(p) for p in both), key=lambda r: r[0])
    assert [r[0] for r in results] == [0, 2], results
    assert "is in use by `namsa train`" in one_error_line(results[1][2])
    steps = steps_logged(out / "metrics.csv")
    assert steps == sorted(set(steps)) and steps[-1] == STEPS   # every step once


def test_wait_starts_when_the_holder_is_gone(tmp_path, data):
    out = tmp_path / "train"
    with hold_output(out, "namsa test-holder"):
        waiter = namsa("train", MICRO, "--data", str(data), "--out", str(out), "--no-progress", "--wait",
                       "--set", "training.max_steps=2")
        line = ""
        while "waiting" not in line and waiter.poll() is None:
            line = waiter.stderr.readline()
        assert line.startswith("namsa: waiting: output directory") and "`namsa test-holder`" in line, line
        time.sleep(0.5)
        assert waiter.poll() is None and not (out / "metrics.csv").exists()  # still waiting
    rc, stdout, err = finish(waiter)
    assert rc == 0 and stdout.startswith("trained 2 steps"), err
    assert lock_path(out).read_text() == ""  # released: nobody is recorded


@pytest.mark.parametrize("command", ["evaluate", "scaling", "reconstruct"])
def test_every_writing_command_refuses_a_busy_out(tmp_path, data, command):
    out = tmp_path / "out"
    argv = {"evaluate": ["evaluate", MICRO, "--data", str(data), "--model", str(tmp_path / "m")],
            "scaling": ["scaling", MICRO, "--data", str(data)],
            "reconstruct": ["reconstruct", str(tmp_path / "scan.hspy"), "--model", str(tmp_path / "m")]}[command]
    with hold_output(out, "namsa test-holder"):
        rc, _, err = finish(namsa(*argv, "--out", str(out), "--no-progress"))
    assert rc == 2 and f"output directory {out} is in use by `namsa test-holder` (pid {os.getpid()}" \
        in one_error_line(err)
    assert not out.exists()  # nothing was written


def test_a_second_run_on_a_busy_run_directory_is_told_to_wait(tmp_path):
    """A real `namsa run` holds its run directory (its own training child does not wait on it);
    a second `namsa run` there exits 2 naming it."""
    run_dir = tmp_path / "run"
    first = namsa("run", MICRO, "--out", str(run_dir), "--no-progress")
    wait_for_holder(run_dir, first)
    rc, _, err = finish(namsa("run", MICRO, "--out", str(run_dir), "--no-progress"))
    line = one_error_line(err)
    assert rc == 2 and f"run directory {run_dir} is in use by `namsa run` (pid {first.pid}" in line
    assert "wait for it or pass --wait" in line
    rc, out, err = finish(first)
    assert rc == 0 and "stages run: simulate, train, evaluate" in out, err


def test_a_killed_holder_leaves_no_stale_lock(tmp_path, data):
    out = tmp_path / "train"
    first = namsa("train", MICRO, "--data", str(data), "--out", str(out), "--no-progress", *TRAIN_SETS)
    wait_for_holder(out, first)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    rc, _, err = finish(namsa("train", MICRO, "--data", str(data), "--out", str(out), "--resume", "--no-progress",
                              "--set", "training.max_steps=2"))
    assert rc == 0, err


# --------------------------------------------------------------------------------------------
# exactly once per data directory


def _store_counts(data_dir: Path) -> dict[str, int]:
    counts = {}
    for path in stage.find_stores(data_dir):
        with stage.open_store(path, allow_empty=True) as reader:
            counts[path.name] = len(reader)
    return counts


def test_simulate_workers_with_different_splits_store_each_sample_once(tmp_path):
    """`--worker 0 --of 1` and `--worker 0 --of 2` at once: both want store-000 (one takes the next
    free name) and half of their plans overlap; every planned sample ends up stored once."""
    out = tmp_path / "data"
    procs = [namsa("simulate", MICRO, "--out", str(out), "--no-progress", "--worker", "0", "--of", of)
             for of in ("1", "2")]
    results = [finish(p) for p in procs]
    assert all(r[0] == 0 for r in results), results
    counts = _store_counts(out)
    assert sum(counts.values()) == 8 and len(data_runners.stored_ids(out)) == 8, counts
    assert set(counts) <= {"store-000", "store-000-1"}
    rc, report, err = finish(namsa("inspect", "--verify", str(out)))
    assert rc == 0 and "duplicates" not in report, report + err


def test_a_claim_of_a_live_writer_is_respected_and_a_stale_one_taken_over(tmp_path):
    cfg = load_config(MICRO, [])
    planned = data_runners.plan(cfg)
    spec = planned.specs[0]
    sid = spec.sample_id(cfg.simulation)
    out = tmp_path / "data"
    from stage.claims import ClaimBook

    with stage.StoreWriter(out / "store-007", config_hash=cfg.simulation.physics_hash()) as other:
        assert ClaimBook(other.path).claim(sid) is None  # the other writer claims it and is still open
        summary = data_runners.simulate_specs(cfg.simulation, cfg.data, out / "store-000", [spec], planned.sources,
                                              progress=False)
        assert (summary.written, summary.skipped) == (0, 1)  # being written elsewhere: left to it
    # that writer closed without storing the sample: its claim is stale and taken over
    summary = data_runners.simulate_specs(cfg.simulation, cfg.data, out / "store-000", [spec], planned.sources,
                                          progress=False)
    assert (summary.written, summary.skipped) == (1, 0)
    summary = data_runners.simulate_specs(cfg.simulation, cfg.data, out / "store-001", [spec], planned.sources,
                                          progress=False)
    assert (summary.written, summary.skipped) == (0, 1)  # stored in store-000 now


def test_a_writer_whose_share_is_all_stored_elsewhere_leaves_no_empty_store(tmp_path):
    """What CI once caught as a race (`--of 1` stored `--of 2`'s whole share first): the second
    writer's new store held nothing, and `namsa inspect --verify` flagged it EMPTY."""
    cfg = load_config(MICRO, [])
    planned = data_runners.plan(cfg)
    specs = planned.specs[:2]
    out = tmp_path / "data"
    first = data_runners.simulate_specs(cfg.simulation, cfg.data, out / "store-000", specs, planned.sources,
                                        progress=False)
    assert first.written == 2 and first.store == str(out / "store-000")
    again = data_runners.simulate_specs(cfg.simulation, cfg.data, out / "store-001", specs, planned.sources,
                                        progress=False)
    assert (again.written, again.skipped) == (0, 2) and "removed: it stored no sample" in again.store
    assert not (out / "store-001").exists() and (out / "store-000").is_dir()
    rc, report, err = finish(namsa("inspect", "--verify", str(out)))
    assert rc == 0 and "EMPTY" not in report, report + err


def test_an_empty_store_is_removed_on_close_and_a_store_with_samples_kept(tmp_path):
    empty, full = tmp_path / "store-000", tmp_path / "store-001"
    writer = stage.StoreWriter(empty, config_hash=CONFIG_HASH)
    assert writer.close_removing_if_empty() and not empty.exists()
    writer = stage.StoreWriter(full, config_hash=CONFIG_HASH)
    writer.put(make_samples(1, scan=(2, 2), px=8)[0])
    assert not writer.close_removing_if_empty()
    assert len(stage.open_store(full)) == 1
    with stage.StoreWriter(empty, config_hash=CONFIG_HASH) as again:  # the name is free for a new store
        assert len(again) == 0
    # a reader of the empty store still open in this process: the store is kept, and a later writer of
    # the same path writes into real files (not into a cached handle on deleted ones)
    writer = stage.StoreWriter(empty, config_hash=CONFIG_HASH)
    reader = stage.open_store(empty, allow_empty=True)
    assert not writer.close_removing_if_empty() and (empty / "data.mdb").is_file()
    reader.close()
    with stage.StoreWriter(empty, config_hash=CONFIG_HASH) as again:
        again.put(make_samples(1, scan=(2, 2), px=8)[0])
    assert len(stage.open_store(empty)) == 1


def _two_overlapping_stores(root: Path) -> Path:
    samples = make_samples(3, variants=2, scan=(2, 2), px=8)
    for name, part in (("store-000", samples[:4]), ("store-001", samples[2:])):
        with stage.StoreWriter(root / name, config_hash=CONFIG_HASH) as writer:
            for sample in part:
                writer.put(sample)
    return root


def test_training_reads_each_id_once_first_store_wins(tmp_path, caplog):
    data = _two_overlapping_stores(tmp_path / "data")
    with caplog.at_level(logging.WARNING, logger="stage.storeset"), stage.open_stores(data) as stores:
        assert len(stores) == 6 and len(set(stores.ids())) == 6
        assert sum(stores.manifest["counts"].values()) == 6
        assert [len(r) for r in stores.readers] == [4, 2]  # the shared two come from store-000
    assert "2 sample id(s) are stored in more than one store" in caplog.text
    assert "each is counted once, from the first store" in caplog.text


def test_inspect_verify_reports_ids_stored_twice(tmp_path, capsys):
    data = _two_overlapping_stores(tmp_path / "data")
    assert main(["inspect", "--verify", str(data)]) == 1
    out, err = capsys.readouterr()
    assert "duplicates: 2 sample id(s) stored in more than one store" in out and "PROBLEMS FOUND" in out
    assert one_error_line(err).endswith("re-simulate into a fresh directory to keep every id in one store")


# --------------------------------------------------------------------------------------------
# a busy store is not a sample failure; a full disk at store creation is one line


def test_a_busy_store_is_not_recorded_as_a_sample_failure(tmp_path):
    """`namsa run`'s simulation while another live writer holds data/store-000: the task takes the
    next free store name, every sample is made and logs/simulate-failures.json stays empty."""
    from workflow.pipeline import Pipeline

    cfg = load_config(MICRO, ["execution.workers=1"])
    pipeline = Pipeline(cfg, tmp_path / "run", progress=False, retry_failed=False)
    pipeline.paths.create()
    try:
        with stage.StoreWriter(pipeline.paths.data / "store-000", config_hash=cfg.simulation.physics_hash()):
            pipeline.simulate()
    finally:
        pipeline.close(wait=True)
    failures = json.loads((pipeline.paths.logs / "simulate-failures.json").read_text())
    assert failures["failures"] == {} and pipeline.summary.available == 8
    assert _store_counts(pipeline.paths.data) == {"store-000": 0, "store-000-1": 8}


def _fsize_limit(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.parametrize("limit", [2000, 20000])
def test_a_full_disk_at_store_creation_is_one_line(tmp_path, limit):
    """RLIMIT_FSIZE in the child (SIGXFSZ ignored): 2 kB fails creating LMDB's files, 20 kB its first
    commit (which LMDB reports as EIO)."""
    proc = subprocess.run([NAMSA, "simulate", MICRO, "--out", str(tmp_path / "out"), "--no-progress"],
                          capture_output=True, text=True, env=_env(), preexec_fn=_fsize_limit(limit), timeout=300)
    line = one_error_line(proc.stderr)
    assert proc.returncode == 1 and "cannot create store" in line and "the disk is full" in line  # a RunError
    assert "raise the file size limit" in line


def test_a_run_whose_disk_filled_leaves_its_samples_for_the_rerun(tmp_path):
    """`namsa run` whose stores hit a full disk (RLIMIT_FSIZE in the child) fails with exit 1, but its
    samples are not recorded as failed for good: the rerun with room simulates every one of them."""
    run = tmp_path / "run"
    full = subprocess.run([NAMSA, "run", MICRO, "--out", str(run), "--no-progress"], capture_output=True, text=True,
                          env=_env(), preexec_fn=_fsize_limit(20000), timeout=600)
    assert full.returncode == 1, full.stderr[-2000:]
    failures = run / "logs" / "simulate-failures.json"
    assert not failures.exists() or json.loads(failures.read_text())["failures"] == {}
    again = subprocess.run([NAMSA, "run", MICRO, "--out", str(run), "--no-progress"], capture_output=True, text=True,
                           env=_env(), timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((run / "summary.json").read_text())["available"] == 8


def test_a_data_directory_of_other_physics_is_refused_before_simulating(tiny_data_dir, tiny_sim_config):
    """A run whose stores hold samples of other physics (here: another hash, as after namsa's
    Gaussian targets) is told so up front in one line, instead of failing every sample."""
    from namsa.errors import UserError
    from workflow.data_runners import check_same_physics

    check_same_physics(tiny_data_dir, tiny_sim_config.physics_hash())   # the same physics: nothing to say
    with pytest.raises(UserError, match="holds samples of other physics .* use a new --out, or delete"):
        check_same_physics(tiny_data_dir, "0" * 64)
