"""Non-finite values from a model and in its scores (issue 32, E): a model whose maps overflow is an
error of the model (one line) in `Reconstructor.predict` and `namsa evaluate`, never a silent NaN
map; non-finite input is refused by `predict`; a metric that has no value for some samples (a vacuum
sample's relative L2 divides by zero) is reported as missing with a warning line, and `namsa
evaluate` no longer dies comparing None with a float (the network-vs-iCoM count did).

The model directories are real (`test_hostile_model_dirs.make_run`: a tiny network saved and
exported by the trainer's code); the stores are real `stage.StoreWriter` stores.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import models
import stage
from evaluation.aggregation import missing_metrics, network_vs_reference, worst_records
from evaluation.config import EvaluationConfig
from evaluation.verdict import verdict
from models import checkpoint as ckpt
from models.reconstructor import ModelOutputError, ReconstructorInputError
from stage_helpers import CONFIG_HASH, make_samples
from test_hostile_model_dirs import MICRO, make_run, record_weights
from workflow.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("values_run"))


def _store(root: Path, vacuum: bool = False) -> Path:
    """A store of three samples the tiny network takes (8 x 8 scan of 16 px); with ``vacuum`` the
    first one's potential is zero everywhere (its relative L2 has no value)."""
    with stage.StoreWriter(root / "store-000", config_hash=CONFIG_HASH) as writer:
        for i, sample in enumerate(make_samples(3, variants=1, scan=(8, 8), px=16)):
            if vacuum and i == 0:
                sample = dataclasses.replace(sample, potential=np.zeros_like(sample.potential))
            writer.put(sample)
    return root


def _evaluate(data: Path, model: Path, out: Path, capsys) -> tuple[int, list[str]]:
    rc = main(["evaluate", MICRO, "--data", str(data), "--model", str(model), "--out", str(out),
               "--set", "evaluation.split=train", "--set", "evaluation.n_bootstrap=20"])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_a_model_whose_maps_overflow_is_an_error_of_the_model(run, tmp_path, capsys):
    """Finite but absurd head weights pass every load check; the maps they give overflow float32."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(run / "model", model)
    state = load_file(str(model / ckpt.MODEL_FILE))
    state["head.weight"].fill_(3e38)
    save_file(state, str(model / ckpt.MODEL_FILE))
    record_weights(model)
    rec = models.load_reconstructor(model, device="cpu")
    cbed = make_samples(1, scan=(8, 8), px=16)[0].cbed
    with pytest.raises(ModelOutputError, match="non-finite values .* in its potential map") as info:
        rec.predict(cbed)
    assert "\n" not in str(info.value)
    rc, err = _evaluate(_store(tmp_path / "data"), model, tmp_path / "e", capsys)
    assert rc == 2 and len(err) == 1 and "the model produced" in err[0] and err[0].startswith("namsa: error: "), err
    assert not (tmp_path / "e").exists()


def test_non_finite_input_is_refused_and_finite_input_gives_finite_maps(run):
    rec = models.load_reconstructor(run / "model", device="cpu")
    cbed = make_samples(1, scan=(8, 8), px=16)[0].cbed
    assert np.isfinite(rec.predict(cbed)).all()
    cbed[3, 2, 1] = np.nan
    with pytest.raises(ReconstructorInputError, match="cbed holds 1 non-finite values"):
        rec.predict(torch.from_numpy(cbed))


def test_evaluate_reports_a_missing_metric_and_does_not_crash(run, tmp_path, capsys):
    """A vacuum sample: relative L2 divides by a zero norm, so it has no value (None in metrics.json).
    Before issue 32 network_vs_icom compared that None with iCoM's float: a TypeError traceback."""
    rc, err = _evaluate(_store(tmp_path / "data", vacuum=True), run / "model", tmp_path / "e", capsys)
    assert rc == 0, err
    warned = [line for line in err if line.startswith("namsa: warning: potential: the network scores")]
    assert warned and "rel_l2 for 1 of 3 samples" in warned[0], err
    doc = json.loads((tmp_path / "e" / "metrics.json").read_text())
    overall = doc["network_vs_icom"]["potential"]["overall"]
    assert overall["n"] == 2 and overall["n_missing"] == 1
    assert any("rel_l2 for 1 of 3" in w for w in doc["warnings"])
    assert doc["aggregates"]["potential"]["network"]["field"]["rel_l2"]["n_nonfinite"] == 1


def _record(net: float | None, icom: float | None) -> dict:
    scores = {m: {"field": {"rel_l2": v, "psnr_db": 10.0, "ssim": 0.5, "pearson_r": 0.5}}
              for m, v in (("network", net), ("icom", icom))}
    return {"metrics": {"potential": scores}, "z_class": "light", "thickness_class": "thin", "material_id": "a"}


def test_missing_values_are_no_win_no_loss_and_sort_last():
    records = [_record(None, 0.3), _record(0.2, 0.3), _record(math.nan, 0.3), _record(0.4, 0.3)]
    overall = network_vs_reference(records, "potential", EvaluationConfig())["overall"]
    assert (overall["n"], overall["network_wins"], overall["n_missing"]) == (2, 1, 2)
    assert [r["metrics"]["potential"]["network"]["field"]["rel_l2"]
            for r in worst_records(records, "potential", 2)] == [0.4, 0.2]
    assert missing_metrics(records, ["potential"]) == [
        "potential: the network scores have no value of rel_l2 for 2 of 4 samples; those are reported as missing "
        "and left out of the means and the verdict"]


def test_a_nan_aggregate_is_missing_in_the_verdict():
    entry = {"value": 0.1, "low": 0.05, "high": 0.15, "n": 5, "n_groups": 5}
    net = {"rel_l2": {**entry, "value": math.nan}, "psnr_db": entry, "ssim": entry, "pearson_r": entry}
    base = {m: dict(entry) for m in net}
    v = verdict({"network": {"field": net}, "icom": {"field": base}}, "icom")
    assert v.missing == ["rel_l2"] and not v.beats and "no value for rel. L2" in v.sentence
