"""The GPU study's check and collect scripts on what a killed or damaged step leaves (issue 39, item 4).

Only a check that ran and found cuda broken (a JSON boolean ``cuda_ok: false``) sends the study's
simulation to the CPU; any other check.json is no evidence, said in one line. collect gathers what
each step left field by field, says in study.json's ``notes`` what was missing or damaged, always
writes study.json, and reads nothing through a link."""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
CHECK = SCRIPTS / "gpu_study_check.py"


def _load(name: str) -> ModuleType:
    """A script of scripts/ as a module, registered under its name (the check imports the collector so)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


collector = _load("gpu_study_collect")
checker = _load("gpu_study_check")
SCORES = {"rel_l2_contrast": 0.1, "rel_l2": 0.2, "rel_l2_level": 0.3}


def _json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def _metrics(*sample_ids: str) -> dict[str, Any]:
    network = {"network": {collector.LEGACY_VIEW: SCORES}}
    return {"samples": [{"sample_id": s, "metrics": {"potential": network, "density": network}} for s in sample_ids]}


def _csv(path: Path, rows: list[tuple[Any, ...]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([("step", "step_s", "compute_s", "other_s"), *rows])


def _finished_run(run: Path) -> Path:
    """What the study's steps leave when none was killed (the files collect reads, small)."""
    _json(run / "check.json", {"cuda_ok": True, "rel_l2": 1.7e-6})
    _json(run / "data" / "simulate-000.json", {"written": 5})
    _csv(run / "train" / "metrics.csv", [(1, 0.2, 0.05, 0.15), (2, 0.2, 0.05, 0.15), (3, 0.2, 0.05, 0.15),
                                          (3, "", "", "")])   # a dev evaluation's row: no step timing
    _json(run / "train" / "train-summary.json", {"steps": 3, "started_at": 100.0, "finished_at": 110.0})
    (run / "train" / "model").mkdir(parents=True)
    (run / "train" / "model" / "model.safetensors").write_bytes(b"weights")
    _json(run / "train" / "model" / "model_card.json", {"name": "new"})
    for name in ("eval-new", "eval-flagship"):
        _json(run / name / "metrics.json", _metrics("s1", "s2"))
    return run


def _collect(run: Path, out: Path) -> dict[str, Any]:
    """collect's exit status is 0 and what it wrote: study.json, read back."""
    assert collector.main([str(run), str(out)]) == 0
    return json.loads((out / "study.json").read_text())


def _noted(study: dict[str, Any], *words: str) -> bool:
    return any(all(w in note for w in words) for note in study["notes"])


def _usable(check: Path) -> tuple[bool, str]:
    """What gpu_study.sh's simulate step decides from ``check`` (True: cuda), and the script's stderr."""
    done = subprocess.run([sys.executable, str(CHECK), "--cuda-usable", str(check)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr
    return done.returncode == 0, done.stderr


def _link_to_false(check: Path) -> None:
    _json(check.parent / "elsewhere.json", {"cuda_ok": False})
    check.symlink_to(check.parent / "elsewhere.json")


#: check.json as a killed, damaged or foreign check leaves it: none holds a verdict
HOSTILE_CHECKS: dict[str, Callable[[Path], Any]] = {
    "missing": lambda p: None,
    "empty": lambda p: p.write_bytes(b""),
    "truncated": lambda p: p.write_text('{"cuda_ok": fal'),
    "list-shaped": lambda p: _json(p, [{"cuda_ok": False}]),
    "directory": lambda p: p.mkdir(),
    "string false": lambda p: _json(p, {"cuda_ok": "false"}),
    "number 0": lambda p: _json(p, {"cuda_ok": 0}),
    "no cuda_ok": lambda p: _json(p, {"reason": "CUDARuntimeError"}),
    "a link to a false verdict": _link_to_false,
}


@pytest.mark.parametrize("case", sorted(HOSTILE_CHECKS))
def test_a_check_json_without_a_boolean_verdict_is_no_evidence_against_cuda(tmp_path, case):
    check = tmp_path / "check.json"
    HOSTILE_CHECKS[case](check)
    usable, stderr = _usable(check)
    assert usable, case
    assert len(stderr.strip().splitlines()) == 1 and "no evidence against cuda" in stderr, stderr


def test_only_a_boolean_false_from_a_check_that_ran_sends_the_study_to_the_cpu(tmp_path):
    check = tmp_path / "check.json"
    _json(check, {"cuda_ok": False, "reason": "CUDARuntimeError: no device"})
    assert _usable(check) == (False, "")
    _json(check, {"cuda_ok": True})
    assert _usable(check) == (True, "")


def test_a_config_error_in_the_check_is_one_line_and_recorded_as_no_verdict(tmp_path):
    config, check = tmp_path / "bad.yaml", tmp_path / "check.json"
    config.write_text("simulation:\n  nonsense_key: 1\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(CHECK), str(config), "--json", str(check)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("gpu_study_check: error:")]
    assert len(errors) == 1 and "nonsense_key" in errors[0], done.stderr
    record = json.loads(check.read_text())
    assert record["cuda_ok"] is None and "nonsense_key" in record["error"]
    usable, stderr = _usable(check)
    assert usable and "nonsense_key" in stderr   # unknown is not broken: the study keeps cuda


def test_collect_on_a_whole_run_brings_every_figure_and_notes_nothing(tmp_path):
    study = _collect(_finished_run(tmp_path / "run"), tmp_path / "out")
    assert study["notes"] == []
    assert study["check"]["cuda_ok"] is True and study["simulate"] == {"simulate-000.json": {"written": 5}}
    assert study["train_timing"] == pytest.approx({"step_s": 0.2, "compute_s": 0.05, "other_s": 0.15,
                                                   "outside_steps_s": 10 - 3 * 0.2})
    assert study["compare"]["samples"] == 2 and study["compare"]["potential"]["rel_l2"] == pytest.approx(
        {"new": 0.2, "flagship": 0.2})
    assert study["files"] == ["study.json", "model.safetensors", "model_card.json"]
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == b"weights"


def test_collect_on_a_training_killed_at_its_step_limit_returns_what_it_left(tmp_path):
    run = _finished_run(tmp_path / "run")
    (run / "train" / "train-summary.json").unlink()   # written only by a training that finished
    for name in collector.MODEL_FILES:
        (run / "train" / "model" / name).unlink()   # the export comes last
    study = _collect(run, tmp_path / "out")
    assert study["train"] == {} and _noted(study, "train/train-summary.json", "missing")
    assert study["train_timing"] == pytest.approx({"step_s": 0.2, "compute_s": 0.05, "other_s": 0.15})
    assert _noted(study, "model.safetensors", "missing", "not copied") and study["files"] == ["study.json"]
    assert study["compare"]["samples"] == 2 and study["check"]["cuda_ok"] is True


def test_collect_on_a_training_summary_without_finished_at_keeps_the_step_figures(tmp_path):
    run = _finished_run(tmp_path / "run")
    _json(run / "train" / "train-summary.json", {"steps": 3, "started_at": 100.0})
    study = _collect(run, tmp_path / "out")
    assert study["train"]["steps"] == 3 and "outside_steps_s" not in study["train_timing"]
    assert study["train_timing"]["step_s"] == pytest.approx(0.2) and _noted(study, "finished_at")


#: a list where an object was, one place at a time: (file, how it is damaged, samples still compared,
#: the words of the note that says so; None where nothing is damage: a target the network did not score)
LISTS_WHERE_OBJECTS_WERE = {
    "metrics.json whole": ("eval-new/metrics.json", lambda m: [m], 0, ("eval-new/metrics.json", "JSON list")),
    "metrics.json samples": ("eval-new/metrics.json", lambda m: {"samples": {"s1": m["samples"][0]}}, 0,
                             ("eval-new/metrics.json", "samples is a JSON dict")),
    "one sample's metrics": ("eval-new/metrics.json",
                             lambda m: {"samples": [{**m["samples"][0], "metrics": []}, m["samples"][1]]}, 1,
                             ("eval-new/metrics.json", "1 of 2 sample records damaged")),
    "one target's network": ("eval-flagship/metrics.json",
                             lambda m: {"samples": [{**m["samples"][0], "metrics": {"potential": {"network": []}}},
                                                    m["samples"][1]]}, 1, None),
    "train-summary.json": ("train/train-summary.json", lambda s: [s], 2, ("train/train-summary.json", "JSON list")),
    "check.json": ("check.json", lambda c: [c], 2, ("check.json", "JSON list")),
}


@pytest.mark.parametrize("case", sorted(LISTS_WHERE_OBJECTS_WERE))
def test_collect_takes_a_list_where_an_object_was_as_damage_and_keeps_the_rest(tmp_path, case):
    name, damage, samples_left, note = LISTS_WHERE_OBJECTS_WERE[case]
    run = _finished_run(tmp_path / "run")
    _json(run / name, damage(json.loads((run / name).read_text())))
    study = _collect(run, tmp_path / "out")
    assert study["compare"]["samples"] == samples_left
    assert study["simulate"] and study["train_timing"]["step_s"] == pytest.approx(0.2)
    assert study["files"][1:] == ["model.safetensors", "model_card.json"]
    assert _noted(study, *note) if note else study["notes"] == [], study["notes"]


def test_collect_skips_the_rows_of_metrics_csv_with_a_non_number_and_notes_them(tmp_path):
    run = _finished_run(tmp_path / "run")
    _csv(run / "train" / "metrics.csv", [(1, 0.2, 0.05, 0.15), (2, "fast", 0.05, 0.15), (3, 0.4, "nan", 0.1),
                                         (4, 0.2, 0.05, "")])
    study = _collect(run, tmp_path / "out")
    assert study["train_timing"]["step_s"] == pytest.approx(0.2)
    assert _noted(study, "metrics.csv", "3 of 4")


@pytest.mark.parametrize("what", ["model file", "model folder"])
def test_collect_copies_no_model_file_through_a_link_out_of_the_run(tmp_path, what):
    run = _finished_run(tmp_path / "run")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.safetensors").write_bytes(b"someone else's file")
    (outside / "model_card.json").write_text("{}")
    model = run / "train" / "model"
    if what == "model file":
        (model / "model.safetensors").unlink()
        (model / "model.safetensors").symlink_to(outside / "model.safetensors")
    else:
        for name in collector.MODEL_FILES:
            (model / name).unlink()
        model.rmdir()
        model.symlink_to(outside, target_is_directory=True)
    study = _collect(run, tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists() and "model.safetensors" not in study["files"]
    assert _noted(study, "model.safetensors", "symbolic link", "not copied")
    assert ("model_card.json" in study["files"]) == (what == "model file")   # the file beside it is the run's


def test_collect_writes_study_json_when_the_run_left_nothing(tmp_path):
    study = _collect(tmp_path / "no-run", tmp_path / "out")
    assert study["files"] == ["study.json"] and study["compare"] == {"samples": 0}
    for part in ("check.json", "simulate-*.json", "train-summary.json", "metrics.csv", "eval-new/metrics.json"):
        assert _noted(study, part), (part, study["notes"])


def test_collect_says_in_one_line_when_it_cannot_write(tmp_path, capsys):
    (tmp_path / "out").write_text("a file where OUT should be")
    assert collector.main([str(tmp_path / "run"), str(tmp_path / "out")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


LEAF = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
JSON = st.recursive(LEAF, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids,
                                                                                     max_size=3), max_leaves=8)
#: metrics.json near its real shape, any value anywhere
SCORED = st.dictionaries(st.sampled_from(collector.RULE), LEAF, max_size=3)
NETWORK = st.fixed_dictionaries({"network": JSON | st.fixed_dictionaries({collector.LEGACY_VIEW: JSON | SCORED})})
TARGETS = st.dictionaries(st.sampled_from(["potential", "density"]), NETWORK | JSON, max_size=2)
RECORD = JSON | st.fixed_dictionaries({"sample_id": st.sampled_from(["s1", "s2"]) | JSON, "metrics": JSON | TARGETS})
METRICS = JSON | st.fixed_dictionaries({"samples": JSON | st.lists(RECORD, max_size=4)})
SUMMARY = JSON | st.dictionaries(st.sampled_from(["started_at", "finished_at", "steps"]), LEAF, max_size=3)
CELL = st.sampled_from(["", "0.1", "nan", "inf", "-1", "fast", "1e999"]) | st.text(max_size=4)
FILE = st.binary(max_size=40) | JSON.map(lambda v: json.dumps(v).encode())


@fuzz_settings(40)
@given(raw=FILE | st.fixed_dictionaries({"cuda_ok": LEAF}).map(lambda v: json.dumps(v).encode()))
def test_fuzz_only_a_json_false_verdict_takes_cuda_away(raw):
    with tempfile.TemporaryDirectory() as tmp:
        check = Path(tmp) / "check.json"
        check.write_bytes(raw)
        try:
            value = json.loads(raw.decode("utf-8", errors="replace"))
        except ValueError:
            value = None
        broken = isinstance(value, dict) and value.get("cuda_ok") is False
        verdict = checker.read_verdict(check)
        assert (verdict.cuda_ok is False) == broken
        assert verdict.cuda_ok is not None or verdict.why_none   # no verdict always says why


@fuzz_settings(40)
@given(check=FILE, summary=SUMMARY, new=METRICS, flagship=METRICS,
       rows=st.lists(st.tuples(CELL, CELL, CELL, CELL), max_size=5))
def test_fuzz_collect_always_writes_what_it_has(check, summary, new, flagship, rows):
    with tempfile.TemporaryDirectory() as tmp:
        run, out = _finished_run(Path(tmp) / "run"), Path(tmp) / "out"
        (run / "check.json").write_bytes(check)
        _json(run / "train" / "train-summary.json", summary)
        _json(run / "eval-new" / "metrics.json", new)
        _json(run / "eval-flagship" / "metrics.json", flagship)
        _csv(run / "train" / "metrics.csv", rows)
        study = _collect(run, out)
        assert all(isinstance(note, str) for note in study["notes"])
        assert isinstance(study["compare"]["samples"], int) and isinstance(study["train_timing"], dict)
        assert study["files"] == ["study.json", "model.safetensors", "model_card.json"]
