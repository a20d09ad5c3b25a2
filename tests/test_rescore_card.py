"""A published card's held-out figures replaced by a newer evaluation of the same weights
(`workflow.rescore_card`): the figures and check samples become the new evaluation's, nothing else of the
card changes, and an evaluation of other weights or of a non-held-out split is refused in one line."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from _publish_fixture import finished_run  # noqa: F401  (session fixture)

from evaluation.views import LEGACY
from models import load_reconstructor
from namsa.errors import UserError
from workflow import pretrained
from workflow.rescore_card import REPLACED, rescore_published

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "card_rescore.py"


@pytest.fixture(scope="module")
def single_pass(finished_run, tiny_data_dir, tmp_path_factory):  # noqa: F811
    """The published tiny model and an evaluation of its single pass (the publish run averaged 8 turns)."""
    import stage
    from evaluation import EvaluationConfig, evaluate

    root = tmp_path_factory.mktemp("rescore")
    folder = pretrained.publish(finished_run, "tiny-rescore", root=root / "shipped")
    evaluate(EvaluationConfig(n_bootstrap=20, n_panels=1, worst_k=1, symmetry_average=False), stage.DataConfig(),
             [tiny_data_dir], folder, root / "eval-single")
    return folder, root / "eval-single"


def _copy(folder: Path, dest: Path) -> Path:
    shutil.copytree(folder, dest)
    return dest


def test_the_card_takes_the_new_evaluations_figures_and_keeps_the_rest(single_pass, tmp_path):
    published, evaluation = single_pass
    folder = _copy(published, tmp_path / "model")
    before = json.loads((folder / "model_card.json").read_text())
    assert before["held_out_evaluation"]["symmetry_average"] is True
    done = subprocess.run([sys.executable, str(SCRIPT), str(folder), str(evaluation)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    after = json.loads((folder / "model_card.json").read_text())
    metrics = json.loads((evaluation / "metrics.json").read_text())
    assert after["held_out_evaluation"]["symmetry_average"] is False
    assert after["held_out_evaluation"]["headline"] == metrics["headline"]
    assert {k: v for k, v in after.items() if k not in REPLACED} == {k: v for k, v in before.items()
                                                                     if k not in REPLACED}
    single = {s["sample_id"]: s for s in metrics["samples"]}
    for check in after["check_samples"]:   # the per-sample figures the slow card test re-makes
        assert check["network_rel_l2"]["potential"] == single[check["sample_id"]]["metrics"]["potential"][
            "network"][LEGACY]["rel_l2"]
    load_reconstructor(folder, device="cpu")


def _edited(evaluation: Path, dest: Path, edit) -> Path:
    dest.mkdir()
    doc = json.loads((evaluation / "metrics.json").read_text())
    edit(doc)
    (dest / "metrics.json").write_text(json.dumps(doc))
    return dest


@pytest.mark.parametrize("bad, message", [
    (lambda d: d["model_card"]["files"]["model.safetensors"].update(xxh3_128="0" * 32), "scored other weights"),
    (lambda d: d.pop("model_card"), "does not say which weights"),
    (lambda d: d["config"].update(split="dev"), "held-out figures only"),
])
def test_an_evaluation_it_cannot_use_is_refused_and_the_card_is_left_alone(single_pass, tmp_path, bad, message):
    published, evaluation = single_pass
    folder = _copy(published, tmp_path / "model")
    text = (folder / "model_card.json").read_text()
    with pytest.raises(UserError, match=message):
        rescore_published(folder, _edited(evaluation, tmp_path / "eval", bad))
    assert (folder / "model_card.json").read_text() == text


def test_a_missing_evaluation_is_one_line(single_pass, tmp_path):
    published, _ = single_pass
    folder = _copy(published, tmp_path / "model")
    done = subprocess.run([sys.executable, str(SCRIPT), str(folder), str(tmp_path / "nowhere")],
                          capture_output=True, text=True)
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1 and "is missing; run namsa evaluate" in err
