"""`namsa publish` on run directories and --out folders someone else prepared (issue 39, item 3).

Before: a link planted at ``--out/NAME/model.safetensors`` was written through (the file it points at
overwritten with the weights); the run directory was read through links (another run's metrics.json
published as this model's figures, another model's folder shipped under this run's figures,
config.resolved.yaml -> /etc/passwd read); an alias bomb in config.resolved.yaml hung publish; and
metrics.json as a list, without ``headline``, a sample without ``thickness_A``, 100,000 nested lists
or ``energy_kv: -1`` were tracebacks. Now each is exit 2 with one ``namsa: error:`` line (or, for a
link in an earlier published folder, a publish that replaces the folder and leaves the link's target
alone), run in process through `workflow.cli.main`; the fuzz test mutates a real run's metrics.json
and config and asserts the same of every result.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

import models
from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from _publish_fixture import copy_run, finished_run  # noqa: F401  (session fixture)
from fuzzing import fuzz_settings
from models.card import CARD_FILE, MODEL_FILE
from test_fuzz_model_dirs import json_values, mutate, paths_of
from test_hostile_run_dirs import one_error_line
from test_model_dir_links import OpenWatch
from workflow.cli import main

METRICS = "eval/metrics.json"
CONFIG = "config.resolved.yaml"


@pytest.fixture
def run(finished_run, tmp_path) -> Path:  # noqa: F811
    """A changeable copy of the finished run."""
    return copy_run(finished_run, tmp_path / "run")


def publish(run: Path, out: Path, name: str = "tiny") -> int:
    return main(["publish", str(run), name, "--out", str(out)])


def refused(run: Path, tmp_path: Path, capsys, says: str) -> str:
    """Publish ``run``: one ``namsa: error:`` line holding ``says``, exit 2, nothing written to --out."""
    line = one_error_line(capsys, publish(run, tmp_path / "out"))
    assert says in line, line
    assert not (tmp_path / "out").exists()
    return line


def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(change(doc)))


def edit_yaml(path: Path, change) -> None:
    doc = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump(change(doc), sort_keys=False))


def test_the_finished_run_publishes(run, tmp_path):
    assert publish(run, tmp_path / "out") == 0
    assert models.load_reconstructor(tmp_path / "out" / "tiny", device="cpu").card.name == "tiny"


# -- writing: a link in --out is never written through -----------------------------------------

def test_a_link_at_out_name_weights_is_refused_and_its_target_untouched(run, tmp_path, capsys):
    outside = tmp_path / "precious"
    outside.write_bytes(b"not weights")
    (tmp_path / "out" / "tiny").mkdir(parents=True)
    (tmp_path / "out" / "tiny" / MODEL_FILE).symlink_to(outside)
    line = one_error_line(capsys, publish(run, tmp_path / "out"))
    assert "holds files this command did not write" in line, line
    assert outside.read_bytes() == b"not weights"


def test_a_link_in_an_earlier_published_folder_is_replaced_not_followed(run, tmp_path):
    """An earlier publish (its card marks it ours) whose weights became a link: the folder is replaced
    as a whole, the link removed, the file it pointed at left as it was."""
    assert publish(run, tmp_path / "out") == 0
    outside = tmp_path / "precious"
    outside.write_bytes(b"not weights")
    weights = tmp_path / "out" / "tiny" / MODEL_FILE
    weights.unlink()
    weights.symlink_to(outside)
    assert publish(run, tmp_path / "out") == 0
    assert outside.read_bytes() == b"not weights"
    assert not weights.is_symlink() and weights.read_bytes() == (run / "model" / MODEL_FILE).read_bytes()


def test_out_name_as_a_link_is_refused(run, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tiny").symlink_to(elsewhere, target_is_directory=True)
    line = one_error_line(capsys, publish(run, tmp_path / "out"))
    assert "is a symbolic link" in line, line
    assert list(elsewhere.iterdir()) == []


def test_a_file_at_out_name_is_refused_and_kept(run, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tiny").write_text("a user's notes")
    line = one_error_line(capsys, publish(run, tmp_path / "out"))
    assert "is a file, not a published folder" in line, line
    assert (tmp_path / "out" / "tiny").read_text() == "a user's notes"


# -- reading: the run directory is read through the run-directory link checks -------------------

@pytest.mark.parametrize("rel", [METRICS, CONFIG, f"model/{MODEL_FILE}", f"model/{CARD_FILE}"])
def test_a_linked_run_file_is_refused_before_its_target_is_opened(rel, run, tmp_path, capsys):
    """The target is the genuine file moved out (an outside metrics.json would publish its figures)."""
    target = tmp_path / "outside"
    os.replace(run / rel, target)
    (run / rel).symlink_to(target)
    watch = OpenWatch(target)
    refused(run, tmp_path, capsys, f"{rel} is a symbolic link to {target}")
    assert not watch.opened()


def test_a_linked_model_folder_is_refused(run, finished_run, tmp_path, capsys):  # noqa: F811
    """model/ linked to another model's folder would ship those weights under this run's figures."""
    other = copy_run(finished_run, tmp_path / "other") / "model"
    (run / "model").rename(tmp_path / "moved")
    (run / "model").symlink_to(other, target_is_directory=True)
    refused(run, tmp_path, capsys, f"model is a symbolic link to {other}")


def test_data_may_link_anywhere_publish_reads_nothing_there(run, tmp_path, capsys):
    """execution.data_dir makes data/ a link (perhaps to node-local storage gone since); a loop of
    links there is one line."""
    (run / "data").symlink_to(tmp_path / "scratch-gone", target_is_directory=True)
    assert publish(run, tmp_path / "out") == 0
    (run / "data").unlink()
    (run / "data").symlink_to(run / "b")
    (run / "b").symlink_to(run / "c")
    (run / "c").symlink_to(run / "b")
    line = one_error_line(capsys, publish(run, tmp_path / "out2"))
    assert f"data is a symbolic link to {run / 'b'}" in line, line


def test_config_linked_to_etc_passwd_is_refused(run, tmp_path, capsys):
    (run / CONFIG).unlink()
    (run / CONFIG).symlink_to("/etc/passwd")
    refused(run, tmp_path, capsys, f"{CONFIG} is a symbolic link to /etc/passwd")


@pytest.mark.timeout(30)
def test_an_alias_bomb_in_the_config_is_refused_quickly(run, tmp_path, capsys):
    """Nine levels of nine aliases (9**9 strings) under a real config's section: refused while composed."""
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    text = (run / CONFIG).read_text().replace("simulation:\n", "simulation:\n" + "".join(
        f"  {line}\n" for line in bomb), 1)
    (run / CONFIG).write_text(text)
    refused(run, tmp_path, capsys, "aliases")


# -- shapes: each wrong shape is one line naming the file and the field --------------------------

def _drop_headline(doc):
    del doc["headline"]
    return doc


def _drop_thickness(doc):
    del doc["samples"][0]["thickness_A"]
    return doc


def _negative_energy(doc):
    doc["simulation"]["energy_kv"] = -1
    return doc


@pytest.mark.parametrize("rel, change, says", [
    (METRICS, lambda doc: doc["samples"], "holds a list, not a mapping of fields"),
    (METRICS, _drop_headline, "missing field headline"),
    (METRICS, _drop_thickness, "missing field samples.0.thickness_A"),
    (CONFIG, _negative_energy, "simulation.energy_kv: Input should be greater than 0"),
], ids=["metrics-a-list", "no-headline", "sample-without-thickness", "energy-kv-negative"])
def test_a_wrong_shape_is_one_line(rel, change, says, run, tmp_path, capsys):
    (edit_json if rel == METRICS else edit_yaml)(run / rel, change)
    line = refused(run, tmp_path, capsys, says)
    assert rel in line, line


def test_100000_nested_lists_in_metrics_are_one_line(run, tmp_path, capsys):
    (run / METRICS).write_text("[" * 100_000 + "]" * 100_000)
    refused(run, tmp_path, capsys, f"{METRICS} nests deeper than 64 levels")


# -- fuzz ---------------------------------------------------------------------------------------

#: the sections publish reads: a mutation anywhere else leaves what it reads as it was
READ = {METRICS: ("config", "data", "headline", "aggregates", "samples"), CONFIG: ("name", "simulation", "data")}


@fuzz_settings(40)
@given(data=st.data(), rel=st.sampled_from(sorted(READ)), action=st.sampled_from(["replace", "delete", "add"]),
       value=json_values, key=st.text(max_size=8))
def test_fuzz_mutated_metrics_and_config(finished_run, data, rel, action, value, key):  # noqa: F811
    """A mutated metrics.json or config: published (and loadable), or exit 2 with one line; nothing
    written outside --out."""
    with tempfile.TemporaryDirectory() as tmp:
        run, out = copy_run(finished_run, Path(tmp) / "run"), Path(tmp) / "out"
        text = (run / rel).read_text()
        doc = json.loads(text) if rel == METRICS else yaml.safe_load(text)
        path = data.draw(st.sampled_from([p for p in paths_of(doc) if not p or p[0] in READ[rel]]))
        doc = mutate(doc, path, action, value, key)
        (run / rel).write_text(json.dumps(doc) if rel == METRICS else yaml.safe_dump(doc))
        rc, err = _publish_capturing(run, out)
        assert rc in (0, 2), (rc, err)
        if rc == 2:
            assert len(err) == 1 and err[0].startswith("namsa: error: "), err
        else:
            models.load_reconstructor(out / "tiny", device="cpu")
        assert sorted(p.name for p in Path(tmp).iterdir()) in (["out", "run"], ["run"])


def _publish_capturing(run: Path, out: Path) -> tuple[int, list[str]]:
    """``namsa publish`` in process, with its stderr lines (capsys is per test, not per example)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = publish(run, out)
    return rc, err.getvalue().strip().splitlines()
