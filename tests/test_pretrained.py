"""Pretrained reconstructors: publishing a finished run, and the ones shipped with the package."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import models
from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from _publish_fixture import finished_run  # noqa: F401  (session fixture)
from evaluation.views import FIELD
from models.reconstructor import ReconstructorInputError
from namsa.config import MACHINE_FIELDS
from namsa.errors import UserError
from workflow import pretrained
from workflow.cli import main


def test_publish_a_run_and_load_it_back(finished_run, tiny_trained_model, tiny_data_dir, tmp_path):  # noqa: F811
    import stage

    run = finished_run
    assert main(["publish", str(run), "tiny-test", "--out", str(tmp_path / "shipped")]) == 0   # `namsa publish`
    dest = tmp_path / "shipped" / "tiny-test"
    card = json.loads((dest / "model_card.json").read_text())
    assert card["name"] == "tiny-test"
    assert card["expects_input"]["scan_shape"] == [8, 8] and card["expects_input"]["energy_kv"] == 200.0
    assert set(card["held_out_evaluation"]["headline"]["potential"]) >= {"network", "mean", "icom"}
    # how its figures were made travels with them: the slow card test re-makes them the same way
    assert card["held_out_evaluation"]["symmetry_average"] is True
    assert absolute_paths(card) == []                           # no paths of the machine it was made on
    assert card["simulation_config"]["scan_shape"] == [8, 8] and "dose_augmentation" in card["trained_on"]
    # the physics, not the machine: a card published from a GPU node re-simulates on any machine
    assert not set(MACHINE_FIELDS) & set(card["simulation_config"])
    checks = card["check_samples"]   # the thinnest held-out samples of each element class, with their figures
    assert checks and len(checks) <= 2 * len({c["element_class"] for c in checks})
    assert all(0 < c["network_rel_l2"]["potential"] < 10 for c in checks)
    rec = models.load_reconstructor(dest)
    cbed = np.asarray(stage.open_stores([tiny_data_dir])[0].cbed, np.float32)
    assert np.array_equal(rec.predict(cbed), models.load_reconstructor(tiny_trained_model.model_dir).predict(cbed))
    with pytest.raises(UserError, match="run the whole pipeline first"):
        pretrained.publish(tmp_path / "nothing", "x", root=tmp_path / "shipped")
    for bad in ("", "../elsewhere", ".hidden"):
        with pytest.raises(UserError, match="must be a plain folder name"):
            pretrained.publish(run, bad, root=tmp_path / "shipped")


def absolute_paths(value) -> list[str]:
    """Every string in a JSON value that is an absolute path (a place on the machine that made it)."""
    if isinstance(value, dict):
        return [p for v in value.values() for p in absolute_paths(v)]
    if isinstance(value, list):
        return [p for v in value for p in absolute_paths(v)]
    return [value] if isinstance(value, str) and value.startswith("/") else []


def test_shipped_cards_hold_no_paths_of_the_build_machine():
    for card_file in sorted((Path(models.__file__).parent / "pretrained").glob("*/model_card.json")):
        assert absolute_paths(json.loads(card_file.read_text())) == [], card_file


def test_shipped_reconstructors_load_and_say_what_they_expect():
    names = models.pretrained_names()
    assert names, "the package ships at least one pretrained reconstructor (make pretrained)"
    for name in names:
        rec = models.load_reconstructor(f"pretrained:{name}", device="cpu")
        expects = rec.card.expects_input
        sy, sx = expects.scan_shape
        p = expects.pattern_px
        out = rec.predict(np.full((sy * sx, p, p), 1.0 / (p * p), np.float32))
        assert out.shape == (len(rec.targets), expects.target_px, expects.target_px)
        assert np.isfinite(out).all()
        headline = rec.card.held_out_evaluation.headline["potential"]
        # the field view of a card scored since issue 30, the legacy values of an older one; the mean image
        # where its evaluation had the training split, else iCoM
        rel_l2 = {m: (entry.get(FIELD) or entry)["rel_l2"] for m, entry in headline.items()}
        assert rel_l2["network"] < rel_l2["mean" if "mean" in rel_l2 else "icom"]


def test_small_runs_point_to_the_study_flagships_result_from_its_card():
    from evaluation.verdict import STUDY_PRETRAINED, study_reference
    from evaluation.views import headline_scores

    card = models.pretrained_card(STUDY_PRETRAINED)
    _, scores = headline_scores(card.held_out_evaluation.aggregates["potential"])
    sentence = study_reference("potential")
    named = {"network": "network", "icom": "iCoM", "ptycho": "ptychography", "mean": "mean training target"}
    assert "network" in scores and "icom" in scores
    for method in scores.keys() & named.keys():
        assert f"{named[method]} {scores[method]['rel_l2'].value:.3f}" in sentence
    assert f"pretrained:{STUDY_PRETRAINED}" in sentence and "structure types it never saw" in sentence
    assert f"configs/{card.trained_on.config_name}.yaml" in sentence
    assert study_reference("no-such-target") is None


def test_unknown_pretrained_name_lists_the_shipped_ones():
    with pytest.raises(ReconstructorInputError, match="no pretrained reconstructor 'nope'; shipped: "):
        models.load_reconstructor("pretrained:nope")


def test_a_model_trained_on_the_old_targets_is_compared_at_the_targets_resolution(tiny_trained_model, tmp_path):  # noqa: F811
    """A model whose card predates the Gaussian targets (its code_version has no +targets2 tag): the
    evaluation brings its maps to the targets' resolution; a model trained now is scored as it predicts."""
    import shutil

    from evaluation.scoring import _as_trained
    from namsa.sample_meta import SampleMeta
    from namsa.targets import TARGETS_VERSION

    shutil.copytree(tiny_trained_model.model_dir, tmp_path / "old")
    card_path = tmp_path / "old" / "model_card.json"
    card = json.loads(card_path.read_text())
    card["code_version"] = card["code_version"].split("+")[0]   # as written before the targets changed
    card_path.write_text(json.dumps(card))
    old, new = models.load_reconstructor(tmp_path / "old"), models.load_reconstructor(tiny_trained_model.model_dir)
    assert old.targets_version == 1 and new.targets_version == TARGETS_VERSION == 2
    rng = np.random.default_rng(0)
    pred = rng.random((32, 32)).astype(np.float32)
    meta = SampleMeta(scan_shape=(32, 32), fov_A=(0.0, 0.0, 12.0, 12.0), target_fwhm_A=0.9)
    assert np.array_equal(_as_trained(new, meta, pred), pred)
    smoothed = _as_trained(old, meta, pred)
    assert smoothed.std() < 0.5 * pred.std() and np.isclose(smoothed.mean(), pred.mean(), rtol=1e-5)
