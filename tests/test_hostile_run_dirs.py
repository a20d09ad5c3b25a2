"""Run directories and output directories that someone else prepared, and faults while writing.

* a symlinked part of a run directory (logs/, data/, checkpoints/, eval/, model/) is refused
  before anything is written through it; data/ may only be namsa's own link to execution.data_dir;
* a forged train summary cannot send the DAG to a model outside the run directory, and a model
  card's ``metrics_csv`` is never opened where it points;
* `namsa evaluate` replaces --out as a whole: real ``kill -9`` of an evaluate process into an --out
  holding an earlier result leaves the earlier result or the new one, never a mix;
* a full disk (RLIMIT_FSIZE in a subprocess, SIGXFSZ ignored, so writes fail with EFBIG) while
  evaluate writes its outputs is one line, exit 2, and the earlier result stays as it was.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workflow import model_runners
from workflow.cli import main
from workflow.config import load_config
from workflow.rundir import RunPaths

REPO = Path(__file__).resolve().parents[1]
MICRO = str(REPO / "configs" / "micro.yaml")


def one_error_line(capsys, rc: int) -> str:
    """The single ``namsa: error:`` line of an exit-2 command (asserted)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("namsa: error: "), (rc, err)
    return err[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A micro data set, a model trained on it by `namsa train`, and one evaluation of it."""
    root = tmp_path_factory.mktemp("hostile_runs")
    assert main(["simulate", MICRO, "--out", str(root / "data"), "--no-progress"]) == 0
    assert main(["train", MICRO, "--data", str(root / "data"), "--out", str(root / "train"), "--no-progress"]) == 0
    assert main(["evaluate", MICRO, "--data", str(root / "data"), "--model", str(root / "train" / "model"),
                 "--out", str(root / "eval")]) == 0
    return {"root": root, "data": root / "data", "model": root / "train" / "model", "eval": root / "eval"}


# -- symlinked run-directory parts ------------------------------------------------------------

@pytest.mark.parametrize("part", ["logs", "data", "checkpoints", "eval", "model"])
def test_a_symlinked_run_directory_part_is_refused_before_anything_is_written(part, tmp_path, capsys):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / part).symlink_to(outside, target_is_directory=True)
    rc = main(["run", MICRO, "--out", str(run), "--no-progress"])
    line = one_error_line(capsys, rc)
    assert f"{part} is a symbolic link to {outside}" in line and "choose another --out" in line
    assert list(outside.iterdir()) == []


def test_data_may_be_namsas_own_link_to_the_configured_data_dir(tmp_path):
    cfg = load_config(MICRO, [f"execution.data_dir={tmp_path / 'scratch'}"])
    paths = RunPaths.for_config(cfg, tmp_path / "run")
    paths.create()
    assert (tmp_path / "run" / "data").resolve() == (tmp_path / "scratch").resolve()
    paths.create()   # the second run accepts the link it made
    other = RunPaths.for_config(load_config(MICRO, []), tmp_path / "run")
    with pytest.raises(Exception, match="data is a symbolic link"):
        other.create()   # without execution.data_dir the same link is someone else's


# -- paths read from summaries and model cards -----------------------------------------------

def test_a_forged_train_summary_cannot_point_the_dag_outside_the_run_directory(trained, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["simulate", MICRO, "--out", str(run / "data"), "--no-progress"]) == 0
    cfg = load_config(MICRO, [])
    forged = {"model_dir": str(trained["model"]), "metrics_csv": "/etc/passwd", "best_checkpoint": None,
              "steps": 2, "final_dev_loss": 0.1, "finished_at": time.time(),
              "data_fingerprint": model_runners.data_fingerprint([run / "data"]),
              "config_hash": model_runners.section_hash(cfg, *model_runners.TRAIN_SECTIONS)}
    (run / model_runners.TRAIN_SUMMARY).write_text(json.dumps(forged))
    rc = main(["run", MICRO, "--out", str(run), "--no-progress"])
    line = one_error_line(capsys, rc)
    assert "lies outside the run directory" in line and str(trained["model"]) in line
    assert not (run / "eval" / "metrics.json").exists()


def test_a_model_cards_metrics_csv_is_not_followed_outside_the_model(trained, tmp_path):
    from evaluation.evaluate import _find_metrics_csv

    secret = tmp_path / "secret.csv"
    secret.write_text("step,loss\n1,2\n")
    model = tmp_path / "model"
    model.mkdir()
    assert _find_metrics_csv(None, model, {"metrics_csv": str(secret)}) is None
    assert _find_metrics_csv(None, model, {"metrics_csv": "../secret.csv"}) is None
    (model / "metrics.csv").symlink_to(secret)
    assert _find_metrics_csv(None, model, {}) is None   # a link out of the model directory is not read
    # the layout namsa train writes (metrics.csv beside model/, an absolute path in the card) still works
    assert _find_metrics_csv(None, trained["model"], {"metrics_csv": "/nowhere/metrics.csv"}) == \
        trained["model"].parent / "metrics.csv"


# -- evaluate replaces --out atomically --------------------------------------------------------

def _tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def _complete(path: Path) -> bool:
    """A whole evaluation: its summary names files that all exist, and nothing else is there."""
    summary = json.loads((path / model_runners.EVAL_SUMMARY).read_text())
    named = {Path(summary["metrics_json"]).name, Path(summary["report_html"]).name, model_runners.EVAL_SUMMARY}
    named |= {str(Path(f).relative_to(path)) for f in summary["figures"]}
    return set(_tree(path)) == named and json.loads((path / "metrics.json").read_text())["samples"]


def _evaluate_cmd(trained: dict[str, Path], out: Path) -> list[str]:
    return [str(Path(sys.executable).parent / "namsa"), "evaluate", MICRO, "--data", str(trained["data"]),
            "--model", str(trained["model"]), "--out", str(out)]


@pytest.mark.timeout(600)
def test_kill_9_of_evaluate_leaves_the_old_result_or_the_new_one(trained, tmp_path):
    out = tmp_path / "eval"
    subprocess.run(["cp", "-a", str(trained["eval"]), str(out)], check=True)
    with open(out / "report.html", "a") as fh:   # only the earlier tree has the marker
        fh.write("<!-- old-marker: the earlier result -->")
    before = _tree(out)
    staging = out.parent / f".{out.name}.tmp-"
    for delay in (None, 0.3, 0.05):   # None: kill when the new tree is being written
        proc = subprocess.Popen(_evaluate_cmd(trained, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 300
        if delay is None:
            while time.time() < deadline and proc.poll() is None and \
                    not any(p.name.startswith(staging.name) and any(p.rglob("*.png")) for p in out.parent.iterdir()):
                time.sleep(0.01)
        else:
            while time.time() < deadline and proc.poll() is None and \
                    not any(p.name.startswith(staging.name) and (p / "metrics.json").exists()
                            for p in out.parent.iterdir()):
                time.sleep(0.005)
            time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert out.is_dir() or any(p.name.startswith(f".{out.name}.old-") for p in out.parent.iterdir())
        if not out.is_dir():   # killed between the fallback's two renames: the next writer restores it
            from workflow.replace_out import clean_leftovers
            clean_leftovers(out)
        assert _tree(out) == before or ("old-marker" not in (out / "report.html").read_text() and _complete(out))
    done = subprocess.run(_evaluate_cmd(trained, out), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "old-marker" not in (out / "report.html").read_text() and _complete(out)
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    assert leftovers in ([], [f".{out.name}.lock"])   # the out lock (workflow.outlock) stays beside --out


# -- a full disk while evaluate writes -----------------------------------------------------------

FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # writes past the limit fail with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (15000, 15000))
from workflow.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_full_disk_while_evaluate_writes_is_one_line_and_keeps_the_earlier_result(trained, tmp_path):
    out = tmp_path / "eval"
    subprocess.run(["cp", "-a", str(trained["eval"]), str(out)], check=True)
    before = _tree(out)
    done = subprocess.run([sys.executable, "-c", FULL_DISK, *_evaluate_cmd(trained, out)[1:]],
                          capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"namsa: error: evaluate writing under {out}: ") and "File too large" in lines[0] and "ulimit -f" in lines[0]
    assert _tree(out) == before
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    assert leftovers in ([], [f".{out.name}.lock"])   # the out lock (workflow.outlock) stays beside --out


def test_stores_larger_than_the_free_disk_are_refused_before_a_store_is_made(tmp_path):
    from workflow.plansize import PlanTooLargeError, check_disk

    cfg = load_config(MICRO, [])
    with pytest.raises(PlanTooLargeError, match="GB free"):
        check_disk(cfg.simulation, cfg.data, 10**13, tmp_path / "data" / "store-000")
    check_disk(cfg.simulation, cfg.data, 8, tmp_path / "data" / "store-000")   # the micro plan fits
    assert not (tmp_path / "data").exists()
