"""The Parsl DAG end to end on configs/micro.yaml: real simulation, LMDB stores, training, evaluation.

Each test runs the real pipeline (thread pools, or the local HighThroughputExecutor on 127.0.0.1)
and asserts on what it leaves on disk: the stores, the checkpoint, the metrics and the report.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import stage
from workflow.config import load_config
from workflow.pipeline import Pipeline, run_pipeline
from workflow.errors import EXIT_BAD_INPUT, EXIT_FAILED, NotEnoughSamples, StageFailed

MICRO = Path(__file__).resolve().parents[1] / "configs" / "micro.yaml"
MICRO_IDS = 8  # 4 materials x 2 zone axes
#: one simulation worker and samples slow enough (16x16 scans, 80 A thick, frozen phonons, so
#: the probe-by-probe path with no cross-sample caching: about 1 s each) that an interruption after
#: the first sample always lands before the last one, even though the main thread may notice the
#: signal only at its next 0.5 s wake-up
SEQUENTIAL = ("execution.workers=1", "simulation.scan_shape=[16, 16]", "model.in_channels=256",
              "simulation.thickness_A=80", "simulation.variations.frozen_phonon=true")


def micro(*overrides: str):
    return load_config(MICRO, list(overrides))


def stored(data_dir: Path) -> list[str]:
    with stage.open_stores(stage.find_stores(data_dir)) as stores:
        return sorted(stores.ids())


def snapshot(run_dir: Path) -> dict[str, int]:
    """mtime of every data/checkpoint/model/eval file: a rerun that does no work changes none."""
    files = [p for sub in ("data", "checkpoints", "model", "eval") for p in (run_dir / sub).rglob("*")
             if p.is_file() and p.name not in ("lock.mdb", "writer.lock")]
    return {str(p): p.stat().st_mtime_ns for p in files}


def assert_complete_run(summary, run_dir: Path) -> None:
    """The store, the checkpoint, the exported model, the metrics and the report are all there."""
    assert summary.available == MICRO_IDS and len(stored(run_dir / "data")) == MICRO_IDS
    assert len(stage.find_stores(run_dir / "data")) == 2  # one store per simulation task
    checkpoint = Path(summary.best_checkpoint)
    assert checkpoint.parent == run_dir / "checkpoints" and any(checkpoint.iterdir())
    assert (run_dir / "model" / "model_card.json").exists()
    metrics = json.loads(Path(summary.metrics_json).read_text())
    assert Path(summary.metrics_json) == run_dir / "eval" / "metrics.json"
    assert Path(summary.report_html).stat().st_size > 1000
    network = summary.headline["potential"]["network"]["field"]["rel_l2"]
    mean = summary.headline["potential"]["mean"]["field"]["rel_l2"]
    assert network > 0 and mean > 0 and metrics  # real numbers from a real evaluation
    resolved = load_config(run_dir / "config.resolved.yaml")
    assert resolved.simulation == summary_cfg(run_dir).simulation


def summary_cfg(run_dir: Path):
    return load_config(run_dir / "config.resolved.yaml")


def test_dag_threads_end_to_end_bad_structure_and_rerun(tmp_path):
    bad = load_config(MICRO, ["simulation.materials=[Si-diamond, GaAs-zincblende, MgO-rocksalt, Cu-fcc, "
                              "no-such-material]"])
    run_dir = tmp_path / "run"
    summary = run_pipeline(bad, run_dir, progress=False)
    assert summary.stages_run == ["simulate", "train", "evaluate"]
    assert_complete_run(summary, run_dir)
    # The bad structure is recorded (in the summary and in the failure log) and the run completed.
    assert [who for who, _ in summary.failures] == ["no-such-material"]
    log = json.loads((run_dir / "logs" / "simulate-failures.json").read_text())
    assert "unknown structure id 'no-such-material'" in log["failures"]["no-such-material"]
    assert json.loads((run_dir / "summary.json").read_text())["stages_run"] == summary.stages_run

    # A rerun after completion does no work: no stage runs and no output file changes.
    before = snapshot(run_dir)
    again = run_pipeline(bad, run_dir, progress=False)
    assert again.stages_run == [] and again.written == 0
    assert snapshot(run_dir) == before
    assert again.metrics_json == summary.metrics_json and again.best_checkpoint == summary.best_checkpoint

    # The same evaluation by hand through the CLI, on the run's data and model.
    from workflow.cli import main

    out = tmp_path / "eval-by-hand"
    assert main(["evaluate", str(MICRO), "--data", str(run_dir / "data"), "--model", summary.model_dir,
                 "--out", str(out)]) == 0
    assert json.loads((out / "metrics.json").read_text()) and (out / "report.html").exists()


def test_dag_on_local_high_throughput_executor(tmp_path):
    run_dir = tmp_path / "run"
    summary = run_pipeline(micro("execution.profile=local-htex"), run_dir, progress=False)
    assert summary.stages_run == ["simulate", "train", "evaluate"]
    assert_complete_run(summary, run_dir)
    # The simulation ran in HTEX worker processes, not in this one.
    workers = list((run_dir / "runinfo").rglob("worker_*.log"))
    assert workers and any("Completed executor task" in w.read_text() for w in workers)


def _simulated_so_far(run_dir: Path) -> int:
    total = 0
    for progress in (run_dir / "logs").glob("store-*.progress.json"):
        try:
            total += json.loads(progress.read_text())["written"]
        except (ValueError, KeyError):
            pass
    return total


def test_rerun_after_killed_simulation_finishes_only_what_is_missing(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [arg for override in SEQUENTIAL for arg in ("--set", override)]
    proc = subprocess.Popen([sys.executable, "-m", "workflow.cli", "run", str(MICRO), "--out", str(run_dir),
                             "--no-progress", *overrides], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while _simulated_so_far(run_dir) < 1 and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)  # kill -9: no clean-up of any kind
    finally:
        proc.wait()
    before = stored(run_dir / "data")
    assert 0 < len(before) < MICRO_IDS, "the kill should land during the simulation"

    pipeline = Pipeline(micro(*SEQUENTIAL), run_dir, progress=False, retry_failed=False)
    pipeline.paths.create()
    try:
        pipeline.simulate()
    finally:
        pipeline.close(wait=True)
    assert pipeline.summary.written == MICRO_IDS - len(before)
    after = stored(run_dir / "data")
    assert len(after) == MICRO_IDS and set(before) <= set(after)


def test_ctrl_c_stops_cleanly_and_the_stores_stay_usable(tmp_path):
    run_dir = tmp_path / "run"
    cfg = micro(*SEQUENTIAL)

    def interrupt_after_first_sample() -> None:
        deadline = time.time() + 120
        while _simulated_so_far(run_dir) < 1 and time.time() < deadline:
            time.sleep(0.005)
        signal.raise_signal(signal.SIGINT)  # what Ctrl-C delivers to the main thread

    watcher = threading.Thread(target=interrupt_after_first_sample, daemon=True)
    watcher.start()
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(cfg, run_dir, progress=False)
    watcher.join()
    kept = stored(run_dir / "data")  # opens cleanly: manifest and records agree
    assert 0 < len(kept) < MICRO_IDS
    assert not (run_dir / "train_run.json").exists()  # training never started


def test_not_enough_samples_stops_before_training(tmp_path):
    cfg = micro("simulation.materials=[Si-diamond, no-such-material]", "simulation.zone_axes=[[0, 0, 1]]",
                "execution.min_success_fraction=0.9")
    with pytest.raises(NotEnoughSamples, match=r"only 1 of about 2 planned samples exist \(50% < "
                                               r"execution.min_success_fraction 90%; the first failure: no-such-material: "
                                               r"unknown structure id"):
        run_pipeline(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "train_run.json").exists()


def test_the_run_keeps_the_training_child_s_kind(tmp_path, capsys):
    """Training runs as a `namsa train` child: a bad input there exits 2 with the child's own line, as
    `namsa train` does, also under torchrun (which exits 1 whatever its ranks did); a training that
    fails (here: it diverges) exits 1 with the log's tail."""
    from workflow.cli import main

    run = ["run", str(MICRO), "--out", str(tmp_path / "run"), "--no-progress"]
    code = main([*run, "--set", f"training.init_from={tmp_path / 'no-such-model'}",
                 "--set", "execution.train_processes_per_node=2"])
    assert code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("namsa: error: model path ")
    assert "no-such-model does not exist" in err
    # the same data (simulated once), a training that diverges at its first step
    code = main([*run, "--set", "training.optimizer=adam", "--set", "training.lr0=1e30",
                 "--set", "training.max_nonfinite=1", "--set", "training.max_steps=20"])
    assert code == EXIT_FAILED
    first, *tail = capsys.readouterr().err.strip().splitlines()
    assert first.startswith("namsa: error: training failed") and str(tmp_path / "run" / "logs" / "train.log") in first
    # The trainer's own one-line reason, quoted from the log tail; training is not retried.
    assert sum("non-finite losses or gradients in a row" in line for line in tail) == 1


def simulate_stage(cfg, run_dir: Path) -> Pipeline:
    """Run only the DAG's simulation stage (real Parsl fan-out) and return the pipeline."""
    pipeline = Pipeline(cfg, run_dir, progress=False, retry_failed=False)
    pipeline.paths.create()
    try:
        pipeline.simulate()
    finally:
        pipeline.close(wait=True)
    return pipeline


def test_failed_simulation_task_is_retried_then_recorded_and_skipped(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "data").mkdir(parents=True)
    (run_dir / "data" / "store-001").write_text("not a store")  # task 1 cannot open its store
    pipeline = simulate_stage(micro("execution.retries=1"), run_dir)
    summary = pipeline.summary
    assert summary.available == MICRO_IDS // 2 and len(stored(run_dir / "data")) == MICRO_IDS // 2
    reasons = {why for _, why in summary.failures}
    assert len(summary.failures) == MICRO_IDS // 2 and len(reasons) == 1
    assert reasons.pop().startswith("simulation task failed after 1 retries: ")
    parsl_log = next((run_dir / "runinfo").rglob("parsl.log")).read_text()
    assert "Task 1 changing state from launched to fail_retryable" in parsl_log  # Parsl retried it
    assert "Task 1 failed after 1 retry attempts" in parsl_log
    pipeline.check_enough_samples()  # 50% >= micro's min_success_fraction: training may go on
    # The failures are remembered: a rerun does not try them again unless asked to.
    assert simulate_stage(micro(), run_dir).summary.written == 0


def test_samples_of_a_lost_node_are_left_for_the_rerun(tmp_path, monkeypatch):
    """A task whose node went away (scancel, preemption) failed through no fault of its samples:
    they count as failed in that run only, and the rerun simulates them (tests/test_slurm_real.py
    does this on a real Slurm)."""
    import concurrent.futures

    from parsl.executors.high_throughput.errors import ManagerLost

    import workflow.pipeline

    def lost(*_args, **_kwargs):
        future = concurrent.futures.Future()
        future.set_exception(ManagerLost(b"0a1b", "node7"))
        return future

    run_dir = tmp_path / "run"
    monkeypatch.setattr(workflow.pipeline, "simulate_app", lost)
    summary = simulate_stage(micro(), run_dir).summary
    assert summary.written == 0 and len(summary.failures) == MICRO_IDS
    assert all("ManagerLost" in why for _, why in summary.failures)
    assert json.loads((run_dir / "logs" / "simulate-failures.json").read_text())["failures"] == {}
    monkeypatch.undo()
    assert simulate_stage(micro(), run_dir).summary.written == MICRO_IDS


def test_the_stores_decide_what_is_done(tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    assert simulate_stage(micro(), run_dir).summary.written == MICRO_IDS
    shutil.rmtree(run_dir / "data")
    # Same tasks, same arguments: the deleted samples are simulated again (nothing is memoised).
    assert simulate_stage(micro(), run_dir).summary.written == MICRO_IDS
    assert len(stored(run_dir / "data")) == MICRO_IDS


def test_parsl_overhead_counts_only_time_outside_the_tasks():
    from workflow.summary import TaskTiming, parsl_overhead

    tasks = [  # two parallel simulation tasks, then training; times in seconds
        TaskTiming("simulate", submitted=0.0, started=1.0, ended=5.0, resolved=5.5),
        TaskTiming("simulate", submitted=0.0, started=1.5, ended=7.0, resolved=7.2),
        TaskTiming("train", submitted=8.0, started=8.1, ended=20.0, resolved=20.4),
        TaskTiming("evaluate", submitted=21.0),  # never started: no stamps, not counted
    ]
    # simulate: wall 7.2 - span 6.0 = 1.2; train: wall 12.4 - span 11.9 = 0.5
    assert parsl_overhead(tasks) == pytest.approx(1.7)


@pytest.mark.slow  # two full pipeline runs
def test_changed_model_config_retrains_and_keeps_the_old_model(tmp_path):
    run_dir = tmp_path / "run"
    first = run_pipeline(micro(), run_dir, progress=False)
    changed = run_pipeline(micro("model.growth_rate=4"), run_dir, progress=False)
    # The data is reused; training and evaluation run again; the first model is kept aside.
    assert changed.stages_run == ["train", "evaluate"] and changed.written == 0
    archived = list((run_dir / "previous").glob("*/model/model_card.json"))
    assert len(archived) == 1 and first.model_dir == changed.model_dir
    assert json.loads((run_dir / "model" / "model_card.json").read_text()) != json.loads(archived[0].read_text())


def test_summary_prints_the_evaluation_verdict_for_every_baseline():
    """The closing lines repeat evaluation.verdict's sentences: a lower mean rel. L2 alone is no win."""
    from evaluation.verdict import STUDY_PRETRAINED, all_verdicts, study_reference
    from workflow.summary import headline_lines

    def ci(value: float) -> dict:
        return {"value": value, "low": value - 0.1, "high": value + 0.1, "n": 6}

    net = {"rel_l2": ci(0.5), "psnr_db": ci(20.0), "ssim": ci(0.13), "pearson_r": ci(0.19)}
    base = {"rel_l2": ci(0.55), "psnr_db": ci(19.9), "ssim": ci(0.19), "pearson_r": ci(0.21)}
    verdicts = all_verdicts({"potential": {"network": {"field": net}, "mean": {"field": base}}},
                            intervals=True, ci_level=0.95)
    headline = {"potential": {"network": {"field": {"rel_l2": 0.5}, "structure": {"rel_l2": 0.45},
                                          "legacy_network_as_predicted_baselines_fitted": {"rel_l2": 0.6},
                                          "level": {"level_error": 0.08, "level_error_median": 0.05}},
                              "mean": {"field": {"rel_l2": 0.55}, "structure": {"rel_l2": 0.5},
                                       "legacy_network_as_predicted_baselines_fitted": {"rel_l2": 0.58}},
                              "icom": {}}}
    lines = headline_lines(headline, verdicts)
    assert lines == ["potential relative L2 on held-out samples, the field's rule (each map in its own physical "
                     "units, only its mean set to the truth's); lower is better: network 0.500, mean 0.550",
                     "  structure only (one least-squares scale and offset fitted to the truth for every method); "
                     "not used by the verdict: network 0.450, mean 0.500",
                     "  the network's level error |mean(pred) - mean(truth)| / |mean(truth)|: median 0.050, mean "
                     "0.080 (no baseline estimates a map's mean: no verdict)",
                     "  legacy rule (network as predicted, baselines least-squares scaled and offset to the truth); "
                     "not used by the verdict: network 0.600, mean 0.580",
                     "  the network does NOT beat the mean training target: better on rel. L2 and PSNR but intervals "
                     "overlap; worse on SSIM and Pearson r (intervals overlap)",
                     study_reference()]   # and where the study flagship stands (its shipped card)
    assert f"pretrained:{STUDY_PRETRAINED}" in lines[-1]
    # an eval-summary.json of before the field's rule: its flat headline is the legacy rule's, and says so
    old = headline_lines({"density": {"network": {"rel_l2": 0.9}, "mean": {"rel_l2": 0.7}}}, None)
    assert old[0].startswith("density relative L2 on held-out samples, legacy rule (network as predicted")
    assert old[0].endswith("run namsa evaluate again: network 0.900, mean 0.700")
    assert old[1] == "  no verdict: this evaluation predates verdicts; run namsa evaluate again"


@pytest.mark.slow  # the full quickstart: a few minutes on 2 cores
def test_quickstart_model_beats_the_mean_baseline_on_held_out_materials(tmp_path):
    summary = run_pipeline(load_config(), tmp_path / "quickstart", progress=False)
    assert summary.available == summary.planned == 164
    # "beats" as the report says it: better on every headline metric, intervals apart (issue 15's demo goal)
    assert summary.verdicts["potential"]["mean"]["beats"], summary.verdicts["potential"]["mean"]["sentence"]


def test_stores_go_to_execution_data_dir_with_a_link_in_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("NAMSA_TEST_SCRATCH", str(tmp_path / "scratch"))
    run_dir = tmp_path / "run"
    pipeline = simulate_stage(micro("execution.data_dir=$NAMSA_TEST_SCRATCH/data"), run_dir)
    assert pipeline.summary.written == MICRO_IDS
    assert len(stored(tmp_path / "scratch" / "data")) == MICRO_IDS  # $VARS expanded, stores there
    link = run_dir / "data"
    assert link.is_symlink() and link.resolve() == (tmp_path / "scratch" / "data").resolve()


def test_unset_variable_in_the_data_dir_is_a_clear_error(tmp_path, monkeypatch):
    from namsa.errors import UserError
    from workflow.run_paths import RunPaths

    monkeypatch.delenv("NAMSA_UNSET_SCRATCH", raising=False)
    cfg = load_config(None, overrides=["execution.data_dir=$NAMSA_UNSET_SCRATCH/data"])
    with pytest.raises(UserError, match="execution.data_dir .*NAMSA_UNSET_SCRATCH.*not set"):
        RunPaths.for_config(cfg, tmp_path / "run")
    monkeypatch.setenv("NAMSA_UNSET_SCRATCH", str(tmp_path / "scratch"))
    assert RunPaths.for_config(cfg, tmp_path / "run").data == (tmp_path / "scratch" / "data").resolve()
