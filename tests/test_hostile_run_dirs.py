"""Run directories and output directories that someone else prepared, and faults while writing.

* a symlinked part of a run directory (logs/, data/, checkpoints/, eval/, model/) is refused
  before anything is written through it; data/ may only be namsa's own link to execution.data_dir;
* a forged train summary cannot send the DAG to a model outside the run directory, and a model
  card's ``metrics_csv`` is never opened where it points;
* `namsa evaluate` replaces --out as a whole: real ``kill -9`` of an evaluate process into an --out
  holding an earlier result leaves the earlier result or the new one, never a mix;
* a full disk (RLIMIT_FSIZE in a subprocess, SIGXFSZ ignored, so writes fail with EFBIG) while
  evaluate writes its outputs is one line, exit 2, and the earlier result stays as it was;
* issue 32 (A): a link at any depth below a run directory's parts is refused and its target left
  alone; an --out holding a user's files under output names is refused and kept; --out a mount
  point or below a read-only parent (real mounts in a private mount namespace) is written inside;
  a swap that fails with EXDEV/EBUSY moves the result in; a run directory moved with `mv` continues
  without retraining, started from a directory of planted modules that are never imported.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from namsa.errors import UserError
from workflow import model_runners
from workflow.cli import main
from workflow.config import load_config
from workflow.run_paths import RunPaths

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


@pytest.mark.parametrize("inner", ["logs/run.log", "logs/train.log", "data/store-000", "data/.claims",
                                   "data/.claims/abc.claim", "checkpoints/step-00000002", "eval/metrics.json",
                                   "runinfo/000"])
def test_a_link_deeper_in_a_run_directory_is_refused_and_its_target_untouched(inner, tmp_path, capsys):
    """One level down (or two): every place namsa writes or reads below a run directory's parts."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    target = outside / "target"
    target.write_text("the user's own file\n")
    run = tmp_path / "run"
    (run / inner).parent.mkdir(parents=True)
    (run / inner).symlink_to(target)
    rc = main(["run", MICRO, "--out", str(run), "--no-progress"])
    line = one_error_line(capsys, rc)
    assert f"{inner} is a symbolic link to {target}" in line and "choose another --out" in line
    assert target.read_text() == "the user's own file\n" and sorted(p.name for p in outside.iterdir()) == ["target"]


def test_a_link_planted_where_a_log_is_appended_is_not_followed(tmp_path):
    """The kernel's check (O_NOFOLLOW) behind the walk: the pipeline's log and the training metrics."""
    from models.training.logs import MetricsLog
    from stage.nofollow import open_no_follow

    target = tmp_path / "target"
    target.write_text("kept\n")
    (tmp_path / "run.log").symlink_to(target)
    with pytest.raises(OSError) as caught:
        open_no_follow(tmp_path / "run.log")
    assert caught.value.errno == errno.ELOOP
    out = tmp_path / "train"
    out.mkdir()
    (out / "metrics.csv").symlink_to(target)
    with pytest.raises(OSError):
        MetricsLog(out, type("Main", (), {"is_main": True})()).log({"step": 1})
    assert target.read_text() == "kept\n"


def test_data_may_be_namsas_own_link_to_the_configured_data_dir(tmp_path):
    cfg = load_config(MICRO, [f"execution.data_dir={tmp_path / 'scratch'}"])
    paths = RunPaths.for_config(cfg, tmp_path / "run")
    paths.create()
    assert (tmp_path / "run" / "data").resolve() == (tmp_path / "scratch").resolve()
    paths.create()   # the second run accepts the link it made
    other = RunPaths.for_config(load_config(MICRO, []), tmp_path / "run")
    with pytest.raises(Exception, match="data is a symbolic link"):
        other.create()   # without execution.data_dir the same link is someone else's


def test_data_in_a_loop_of_links_is_one_line(tmp_path, capsys):
    cfg = load_config(MICRO, [f"execution.data_dir={tmp_path / 'scratch'}"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "data").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "c")
    (tmp_path / "c").symlink_to(tmp_path / "b")
    with pytest.raises(UserError, match="data is a symbolic link to"):
        RunPaths.for_config(cfg, run).create()
    rc = main(["run", MICRO, "--out", str(run), "--no-progress"])
    assert "data is a symbolic link" in one_error_line(capsys, rc)


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
    assert _find_metrics_csv(None, model, str(secret)) is None
    assert _find_metrics_csv(None, model, "../secret.csv") is None
    (model / "metrics.csv").symlink_to(secret)
    assert _find_metrics_csv(None, model, None) is None   # a link out of the model directory is not read
    # the layout namsa train writes (metrics.csv beside model/, an absolute path in the card) still works
    assert _find_metrics_csv(None, trained["model"], "/nowhere/metrics.csv") == \
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
    assert done.returncode == 1 and len(lines) == 1, done.stderr   # EFBIG: the environment failed, not the input
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


# -- --out that holds a user's files, a mount point, a read-only parent ------------------------

def test_an_out_holding_a_users_own_output_names_is_refused_and_kept(trained, tmp_path, capsys):
    """`figures/` is one of evaluate's names, but without evaluate's summary it is not an earlier result."""
    out = tmp_path / "mine"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "plot.png").write_text("the user's figure")
    rc = main(["evaluate", MICRO, "--data", str(trained["data"]), "--model", str(trained["model"]), "--out", str(out)])
    line = one_error_line(capsys, rc)
    assert "holds files this command did not write (e.g. 'figures')" in line and "new or empty directory" in line
    assert (out / "figures" / "plot.png").read_text() == "the user's figure"


def test_reconstructs_out_holding_a_users_map_name_is_refused_and_kept(tmp_path):
    from namsa.errors import UserError
    from workflow.reconstruct import INFO_FILE
    from workflow.reconstruct_maps import is_output_name
    from workflow.replace_out import start_replacing

    out = tmp_path / "maps"
    out.mkdir()
    (out / "potential.npy").write_bytes(b"the user's map")
    with pytest.raises(UserError, match="did not write .e.g. 'potential.npy'"):
        start_replacing(out, is_output_name, INFO_FILE)
    assert (out / "potential.npy").read_bytes() == b"the user's map"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["maps"]


def _in_namespace(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``script`` (sh) in a private mount namespace, where it may mount; skipped where that is not allowed."""
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs none {tmp_path}"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here (unshare -rm: {probe.stderr.decode().strip()})")
    return subprocess.run(["unshare", "-rm", "sh", "-ec", script], capture_output=True, text=True, timeout=300)


def test_evaluate_into_a_mount_point_writes_inside_it(trained, tmp_path):
    """--out is a mounted file system (a container volume): it cannot be renamed, so the result is
    written inside it; the second run replaces the first there."""
    out, listing = tmp_path / "volume", tmp_path / "listing"
    out.mkdir()
    cmd = " ".join(_evaluate_cmd(trained, out))
    done = _in_namespace(f"mount -t tmpfs none {out}; {cmd} >/dev/null; echo again > {out}/figures/.old; "
                         f"{cmd} >/dev/null; ls -a {out} {out}/figures > {listing}", tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    names = listing.read_text().split()
    assert {"metrics.json", "report.html", "figures", model_runners.EVAL_SUMMARY} <= set(names)
    assert ".old" not in names and not any(n.startswith(".namsa.tmp-") for n in names)


def test_a_writable_out_under_a_read_only_parent_is_used(trained, tmp_path):
    """The parent is a read-only file system (root cannot write it either): the lock and the result
    live inside --out."""
    parent, listing = tmp_path / "ro", tmp_path / "listing"
    parent.mkdir()
    out = parent / "out"
    cmd = " ".join(_evaluate_cmd(trained, out))
    done = _in_namespace(f"mount -t tmpfs none {parent}; mkdir {out}; mount -t tmpfs none {out}; "
                         f"mount -o remount,ro,bind {parent}; ! touch {parent}/x 2>/dev/null; {cmd} >/dev/null; "
                         f"ls -a {out} > {listing}", tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert {"metrics.json", model_runners.EVAL_SUMMARY, ".namsa-out.lock"} <= set(listing.read_text().split())


@pytest.mark.parametrize("code", [errno.EXDEV, errno.EBUSY])
def test_a_swap_refused_at_the_end_moves_the_result_in(code, tmp_path, monkeypatch):
    """A mount point that was not seen beforehand: renaming --out fails (EXDEV or EBUSY) after the
    work; the result is moved in instead, the earlier one is gone, nothing else is touched."""
    from stage import dir_swap
    from workflow import replace_out

    out = tmp_path / "out"
    out.mkdir()
    (out / "result.json").write_text("old")
    (out / "figures").mkdir()
    (out / "figures" / "old.png").write_text("old")
    tmp = replace_out.start_replacing(out, lambda name: True, "result.json")
    (tmp / "result.json").write_text("new")
    (tmp / "a.png").write_text("new")
    real_rename = os.rename

    def rename(src, dst, *args, **kwargs):
        if Path(src) == out or Path(dst) == out:
            raise OSError(code, os.strerror(code), str(src))
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(dir_swap, "exchange", lambda a, b: False)   # a file system without renameat2
    replace_out.finish_replacing(tmp, out, "result.json")
    assert sorted(p.name for p in out.iterdir()) == ["a.png", "result.json"]
    assert (out / "result.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# -- a run directory moved with mv ----------------------------------------------------------------

@pytest.mark.timeout(600)
def test_a_moved_run_directory_continues_without_retraining(tmp_path):
    """`namsa run`, `mv` of the run directory, `namsa run` on the new path: nothing is trained or
    evaluated again. Both runs start in a directory of planted modules (yaml.py, workflow/ ...),
    none of which the run or its training child imports."""
    from test_profiles import _plant

    cwd = tmp_path / "cwd"
    marker = _plant(cwd)
    env = {k: v for k, v in os.environ.items() if k not in ("NAMSA_OUT_LOCKS_HELD", "PYTHONSAFEPATH")}
    namsa = str(Path(sys.executable).parent / "namsa")

    def run(where: Path) -> subprocess.CompletedProcess:
        return subprocess.run([namsa, "run", MICRO, "--out", str(where), "--no-progress"], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=500)

    first = run(tmp_path / "run")
    assert first.returncode == 0 and "stages run: simulate, train, evaluate" in first.stdout, first.stderr
    checkpoints = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "run" / "checkpoints").iterdir()}
    (tmp_path / "run").rename(tmp_path / "moved")
    again = run(tmp_path / "moved")
    assert again.returncode == 0 and "stages run: none" in again.stdout, again.stderr
    assert f"model: {tmp_path / 'moved' / 'model'}" in again.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "moved" / "checkpoints").iterdir()} == checkpoints
    assert not marker.exists()


def test_a_result_half_moved_in_when_killed_is_replaced_by_the_next_run(tmp_path):
    """Killed while moving entries in: outputs without their marker, but marked as being moved in."""
    from workflow import replace_out

    out = tmp_path / "out"
    (out / "figures").mkdir(parents=True)
    (out / replace_out.MOVING).touch()
    tmp = replace_out.start_replacing(out, lambda name: name == "figures", "result.json")
    (tmp / "result.json").write_text("new")
    replace_out.finish_replacing(tmp, out, "result.json")
    assert sorted(p.name for p in out.iterdir()) == ["result.json"]
    (out / "figures").mkdir()
    (out / "result.json").unlink()   # the same names without the marker and without the mark: not ours
    with pytest.raises(Exception, match="did not write"):
        replace_out.start_replacing(out, lambda name: name == "figures", "result.json")
