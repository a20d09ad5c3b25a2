"""evaluation on a tiny really-trained reconstructor and the lead's tiny real data set."""
from __future__ import annotations

import json
from html import escape as html_escape
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from _evaluated_fixture import evaluated  # noqa: F401  (session fixture)
from _models_fixture import tiny_train_configs, tiny_trained_model  # noqa: F401  (session fixture)
from evaluation import EvaluationConfig, EvaluationInputError, evaluate
from evaluation import metrics as M
from evaluation.views import FIELD, LEGACY, LEVEL, STRUCTURE, field_map
from workflow.scaling import ScalingInputError, scaling_study, training_sizes
from namsa.errors import UserError



def test_evaluate_writes_metrics_figures_and_report(evaluated, tiny_data_dir):
    import stage

    result, doc = evaluated
    n_test = len(stage.open_stores([tiny_data_dir]).indices("test"))
    assert result.n_samples == n_test == len(doc["samples"]) > 0
    assert result.report_html.is_file() and result.metrics_json.is_file()
    for method in ("network", "mean", "icom"):
        own = {LEVEL} if method == "network" else set()
        assert set(result.headline["potential"][method]) == {FIELD, STRUCTURE, LEGACY} | own
        assert set(result.headline["potential"][method][FIELD]) == {"rel_l2", "psnr_db", "ssim", "pearson_r"}
        agg = doc["aggregates"]["potential"][method]
        assert set(agg) == {FIELD, STRUCTURE, LEGACY} | own
        ci = agg[FIELD]["rel_l2"]
        assert ci["low"] <= ci["value"] <= ci["high"]
    names = {Path(p).name for p in result.figures}
    assert {"hist_rel_l2_potential.png", "rel_l2_vs_thickness_potential.png", "learning_curves.png",
            "sample_0_potential.png"} <= names
    first = [r["index"] for r in doc["samples"][:2]]
    for rank, index in enumerate(doc["worst"]["potential"]):   # a worst case already drawn is not drawn again
        assert (f"worst_{rank}_potential.png" in names) == (index not in first)
    for path in result.figures:
        image = imread(path)   # decodes as PNG or raises
        assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50


def test_report_names_baselines_and_links_figures(evaluated):
    result, doc = evaluated
    html = result.report_html.read_text()
    assert "no class" not in html
    for text in ("mean training target", "iCoM", "least-squares", "network", "Worst cases", "is better on most",
                 "By material", "By zone axis", "element class", "Model card", "Data manifest"):
        assert text in html, text
    for rel in doc["figures"].values():
        assert f"srcset='{rel} 2x'" in html
        assert (result.out_dir / rel).is_file()
    # held-out materials are named in the manifest section
    for material in doc["data"]["materials"]["test"]:
        assert material in html
    # and it says where the study flagship's held-out result stands, read from its shipped card
    from evaluation.verdict import STUDY_PRETRAINED

    assert "For scale, the study" in html and f"pretrained:{STUDY_PRETRAINED}" in html   # (the apostrophe is escaped)


def test_per_sample_metrics_match_an_independent_recomputation(evaluated, tiny_trained_model, tiny_data_dir):
    import models
    import stage

    result, doc = evaluated
    record = doc["samples"][0]
    stores = stage.open_stores([tiny_data_dir])
    sample = stores[record["index"]]
    rec = models.load_reconstructor(tiny_trained_model.model_dir)
    pred = np.asarray(rec.predict(sample.cbed.astype(np.float32))).reshape(sample.potential.shape)
    net = record["metrics"]["potential"]["network"]
    field = field_map(pred, sample.potential)
    assert net[FIELD]["rel_l2"] == pytest.approx(M.relative_l2(field, sample.potential), rel=1e-4)
    assert net[FIELD]["ssim"] == pytest.approx(M.ssim(field, sample.potential), rel=1e-4, abs=1e-6)
    assert net[LEGACY]["rel_l2"] == pytest.approx(M.relative_l2(pred, sample.potential), rel=1e-4)
    # the legacy view's error split into the map's mean and its contrast adds up; a fitted baseline's level is ~0
    parts = M.level_and_contrast(pred, sample.potential)
    assert net[LEGACY]["rel_l2_level"] == pytest.approx(parts["rel_l2_level"], rel=1e-4, abs=1e-7)
    assert net[LEGACY]["rel_l2_level"] ** 2 + net[LEGACY]["rel_l2_contrast"] ** 2 == pytest.approx(
        net[LEGACY]["rel_l2"] ** 2, rel=1e-4)
    # the field view's error is the legacy view's contrast part: only the mean differs
    assert net[FIELD]["rel_l2"] == pytest.approx(net[LEGACY]["rel_l2_contrast"], rel=1e-4)
    assert record["metrics"]["potential"]["icom"][LEGACY]["rel_l2_level"] < 1e-5
    assert "from the map&#x27;s mean" in result.report_html.read_text()  # the legacy table's row (escaped)
    # mean baseline: the pixel-wise mean of the training targets
    train = [stores[i].potential.astype(np.float64) for i in stores.indices("train")]
    mean_map = np.mean(train, axis=0)
    assert record["metrics"]["potential"]["mean"][LEGACY]["rel_l2"] == pytest.approx(
        M.relative_l2(mean_map, sample.potential), rel=1e-4)
    assert record["metrics"]["potential"]["mean"][FIELD]["rel_l2"] == pytest.approx(
        M.relative_l2(field_map(mean_map, sample.potential), sample.potential), rel=1e-4)
    # in the structure view every method is fitted with two scalars; a least-squares fit never does worse
    # than the best constant map
    constant = M.relative_l2(np.full_like(sample.potential, sample.potential.mean()), sample.potential)
    for method in ("network", "mean", "icom"):
        assert record["metrics"]["potential"][method][STRUCTURE]["rel_l2"] <= constant + 1e-6
    # iCoM's legacy map is that fit (its structure map)
    assert record["metrics"]["potential"]["icom"][LEGACY]["rel_l2"] == \
        record["metrics"]["potential"]["icom"][STRUCTURE]["rel_l2"]
    # the fit's scale is never negative; the unconstrained one is recorded beside it
    for r in doc["samples"]:
        for name in ("icom_fit", "ptycho_fit"):
            fit = r[name]
            assert fit["scale"] >= 0 and np.isfinite(fit["signed_scale"])
            assert fit["scale"] == (fit["signed_scale"] if fit["signed_scale"] >= 0 else 0.0)


def test_breakdowns_and_network_vs_icom(evaluated):
    _, doc = evaluated
    by_material = doc["breakdowns"]["potential"]["material_id"]
    assert sum(g["n"] for g in by_material.values()) == len(doc["samples"])
    assert set(doc["breakdowns"]["potential"]) == {"material_id", "zone_axis", "element_class", "heaviest_element",
                                                   "thickness_class"}
    versus = doc["network_vs_icom"]["potential"]["overall"]
    wins = sum(1 for r in doc["samples"] if r["metrics"]["potential"]["network"][FIELD]["rel_l2"]
               < r["metrics"]["potential"]["icom"][FIELD]["rel_l2"])
    assert versus["n"] == len(doc["samples"]) and versus["network_wins"] == wins
    # worst cases: the largest network errors, worst first
    errors = {r["index"]: r["metrics"]["potential"]["network"][FIELD]["rel_l2"] for r in doc["samples"]}
    worst = doc["worst"]["potential"]
    assert len(worst) == min(2, len(errors))
    assert [errors[i] for i in worst] == sorted(errors.values(), reverse=True)[: len(worst)]


def test_evaluate_rejects_targets_the_model_does_not_predict(tiny_trained_model, tiny_data_dir, tmp_path):  # noqa: F811
    import stage

    with pytest.raises(EvaluationInputError, match="predicts only"):
        evaluate(EvaluationConfig(targets=["density"]), stage.DataConfig(), [tiny_data_dir],
                 tiny_trained_model.model_dir, tmp_path)


def test_evaluation_config_forbids_unknown_keys():
    assert EvaluationConfig.model_validate({}) == EvaluationConfig()
    with pytest.raises(Exception, match="extra"):
        EvaluationConfig.model_validate({"n_bootstraps": 3})


def test_training_sizes():
    assert training_sizes(10, (0.125, 0.25, 0.5, 1.0)) == [2, 3, 5, 10]
    assert training_sizes(3, (0.1, 0.2, 1.0)) == [1, 3]
    assert training_sizes(8, (0.125, 0.25, 1.0), min_size=2) == [2, 8]   # at least one batch
    with pytest.raises(ScalingInputError, match="batch"):
        training_sizes(1, (1.0,), min_size=2)
    with pytest.raises(ScalingInputError):
        training_sizes(10, (0.0, 1.0))
    with pytest.raises(UserError):
        training_sizes(0, (1.0,))


def test_scaling_study_plots_error_against_training_size(tiny_data_dir, tmp_path):
    model_cfg, train_cfg, dist_cfg, data_cfg = tiny_train_configs()
    train_cfg = train_cfg.model_copy(update={"max_steps": 2, "eval_every": 2, "checkpoint_every": 2})
    eval_cfg = EvaluationConfig(n_bootstrap=50, n_panels=0, worst_k=0, icom=False)
    summary = scaling_study(model_cfg, train_cfg, dist_cfg, data_cfg, eval_cfg, [tiny_data_dir], tmp_path,
                            fractions=(0.5, 1.0))
    sizes = [r["n_train"] for r in summary["rows"]]
    assert sizes == sorted(sizes) and len(sizes) == 2 and sizes[-1] == summary["n_train_total"]
    assert imread(summary["figure"]).ndim == 3
    saved = json.loads(Path(summary["json"]).read_text())
    assert [r["n_train"] for r in saved["rows"]] == sizes
    for row in saved["rows"]:
        assert row["potential"]["network"]["value"] > 0
        assert (Path(row["eval_dir"]) / "report.html").is_file()
    # the learning-curve report: the figure, one table row per size, each linking to its own report
    html = Path(summary["report"]).read_text()
    assert f"srcset='{Path(summary['figure']).name} 2x'" in html
    for row in saved["rows"]:
        assert f"<td class='l'>{row['n_train']:,}</td>" in html
        assert f"href='{Path(row['eval_dir']).relative_to(tmp_path) / 'report.html'}'" in html


def _restore(tiny_data_dir: Path, dest: Path, split_fractions: tuple[float, float, float]) -> Path:
    """Copy the tiny data's test samples into a new store whose splits follow ``split_fractions``."""
    import stage

    src = stage.open_stores([tiny_data_dir])
    config_hash = src.manifests[0]["config_hash"]
    data_cfg = stage.DataConfig(cbed_dtype="float32", split_fractions=split_fractions)
    with stage.StoreWriter(dest / "store-0", config_hash=config_hash, data_cfg=data_cfg) as writer:
        for i in src.indices("test"):
            writer.put(src[i])
    return dest


def test_evaluate_without_training_samples_leaves_out_the_mean_baseline(
        tiny_trained_model, tiny_data_dir, tmp_path):  # noqa: F811
    import stage

    data = _restore(tiny_data_dir, tmp_path / "data", (0.0, 0.0, 1.0))
    result = evaluate(EvaluationConfig(n_bootstrap=20, n_panels=0, worst_k=0), stage.DataConfig(), [data],
                      tiny_trained_model.model_dir, tmp_path / "eval")
    assert set(result.headline["potential"]) == {"network", "icom"}
    why = "the evaluated stores hold no training samples to average"
    assert "mean-training-target baseline is absent: not computed: " + why in result.report_html.read_text()
    doc = json.loads(result.metrics_json.read_text())
    assert why in doc["absent_baselines"]["mean"]
    # the verdicts and the closing lines of namsa run / namsa evaluate say it too
    mean = result.verdicts["potential"]["mean"]
    assert mean["status"] == "absent" and not mean["beats"]
    assert mean["sentence"].startswith("no verdict against the mean training target: not computed: " + why)
    from workflow.summary import headline_lines

    assert f"  {mean['sentence']}" in headline_lines(result.headline, result.verdicts)


def test_evaluate_split_all_scores_every_sample_and_says_it_is_not_held_out(
        tiny_trained_model, tiny_data_dir, tmp_path):  # noqa: F811
    import stage

    cfg = EvaluationConfig(split="all", n_bootstrap=20, n_panels=0, worst_k=0, icom=False)
    result = evaluate(cfg, stage.DataConfig(), [tiny_data_dir], tiny_trained_model.model_dir, tmp_path)
    stores = stage.open_stores([tiny_data_dir])
    assert result.n_samples == len(stores.indices()) > len(stores.indices("test"))
    doc = json.loads(result.metrics_json.read_text())
    assert sorted(r["index"] for r in doc["samples"]) == stores.indices()
    assert doc["data"]["evaluated_split"] == "all"
    assert "training materials included: this is not a held-out figure" in result.report_html.read_text()


def test_evaluate_rejects_data_without_the_split(tiny_trained_model, tiny_data_dir, tmp_path):  # noqa: F811
    import stage

    data = _restore(tiny_data_dir, tmp_path / "data", (1.0, 0.0, 0.0))
    with pytest.raises(EvaluationInputError, match="no 'test' samples"):
        evaluate(EvaluationConfig(), stage.DataConfig(), [data], tiny_trained_model.model_dir, tmp_path / "eval")


def test_ptycho_baseline_and_compute_times_reach_metrics_and_report(evaluated):
    from evaluation.methods import method

    result, doc = evaluated
    assert "ptycho" in result.headline["potential"] and "ptycho" in doc["methods"]["potential"]
    for r in doc["samples"]:
        fit = r["ptycho_fit"]
        assert np.isfinite(fit["scale"]) and fit["seconds"] > 0 and np.isfinite(fit["error"])
        assert set(r["seconds"]) == {"network", "icom", "ptycho"} and min(r["seconds"].values()) > 0
        assert r["seconds"]["ptycho"] == fit["seconds"]
        for view in (FIELD, STRUCTURE, LEGACY):
            assert set(r["metrics"]["potential"]["ptycho"][view]) == set(r["metrics"]["potential"]["icom"][view])
    times = doc["compute_seconds"]
    assert set(times) == {"network", "icom", "ptycho"} and result.compute_seconds == times
    assert times["ptycho"]["n"] == len(doc["samples"])
    assert times["ptycho"]["mean"] == pytest.approx(np.mean([r["seconds"]["ptycho"] for r in doc["samples"]]))
    html = result.report_html.read_text()
    for name in ("network", "icom", "ptycho"):
        assert f"{method(name).label}: compute time per sample" in html
    assert "ptychography rel L2" in html


def test_verdicts_are_the_verdict_rule_applied_to_the_aggregates(evaluated):
    """Overall and per element class, on intervals over materials; the report shows every class."""
    from evaluation.scoring import ELEMENT_CLASSES
    from evaluation.verdict import verdict

    result, doc = evaluated
    verdicts = doc["verdicts"]["potential"]
    assert set(verdicts) == {"mean", "icom", "ptycho"} and result.verdicts == doc["verdicts"]
    classes = doc["class_aggregates"]["potential"]
    assert classes and set(classes) <= set(ELEMENT_CLASSES)
    assert sum(c["network"][FIELD]["rel_l2"]["n"] for c in classes.values()) == len(doc["samples"])
    materials = {r["material_id"] for r in doc["samples"]}
    assert doc["aggregates"]["potential"]["network"][FIELD]["rel_l2"]["n_groups"] == len(materials)
    html = result.report_html.read_text()
    for baseline, v in verdicts.items():
        overall = verdict(doc["aggregates"]["potential"], baseline).as_dict()
        assert {k: v[k] for k in overall} == {**overall, "sentence": v["sentence"]}
        assert v["overall_sentence"] == overall["sentence"] and html_escape(v["overall_sentence"]) in html
        assert set(v["by_class"]) == set(classes)
        for name, c in v["by_class"].items():
            assert c["beats"] == verdict(classes[name], baseline).beats
            assert c["sentence"] in v["sentence"] and html_escape(c["sentence"]) in html
    assert "element class" in html and "intervals over materials" in html


def test_report_says_plainly_when_no_class_favours_the_network():
    from evaluation.report_versus import versus_section
    from evaluation.scoring import LIGHT_CLASS

    group = {"n": 2, "network_wins": 0, "win_rate": 0.0, "mean_rel_l2_gap": 0.1}
    doc = {"network_vs_icom": {"potential": {"overall": group, "element_class": {LIGHT_CLASS: group},
                                             "thickness_class": {"0-50 A": group}}}}
    html = versus_section(doc)
    assert "no class" not in html
    assert "The network is better on most samples of no element or thickness class." in html
    assert (f"iCoM is as good or better on most samples of: <b>{html_escape(LIGHT_CLASS)}, network better on 0 of 2 "
            "samples (0%); 0-50 A, network better on 0 of 2 samples (0%)</b>.") in html


def test_worst_cases_already_drawn_are_not_drawn_twice(tiny_trained_model, tiny_data_dir, tmp_path):  # noqa: F811
    import stage

    result = evaluate(EvaluationConfig(n_bootstrap=20, n_panels=50, worst_k=2), stage.DataConfig(), [tiny_data_dir],
                      tiny_trained_model.model_dir, tmp_path)
    doc = json.loads(result.metrics_json.read_text())
    assert sum(name.startswith("sample_") for name in doc["figures"]) == len(doc["samples"])
    assert not [name for name in doc["figures"] if name.startswith("worst_")]
    assert not list((tmp_path / "figures").glob("worst_*.png"))
    html = result.report_html.read_text()
    assert html.count("is drawn above as per-sample panel") == len(doc["worst"]["potential"]) == 2


def test_learning_curves_say_what_l2_loss_is(evaluated, tiny_trained_model):
    from evaluation.figures import learning_curves_figure

    result, _ = evaluated
    fig = learning_curves_figure(tiny_trained_model.metrics_csv)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(label.startswith("l2_loss: weight-decay term") for label in labels), labels
    assert any(label.startswith("train_loss: Huber") for label in labels), labels
    assert "weight-decay term 0.5 * weight_decay * sum(w^2)" in result.report_html.read_text()


def test_evaluate_with_ptycho_but_no_py4dstem_fails_before_writing(tiny_trained_model, tiny_data_dir, tmp_path,
                                                                  monkeypatch):  # noqa: F811
    import sys

    import stage

    for name in [m for m in sys.modules if m == "py4DSTEM" or m.startswith("py4DSTEM.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "py4DSTEM", None)
    with pytest.raises(UserError, match="namsa\\[baselines\\]"):
        evaluate(EvaluationConfig(ptycho=True), stage.DataConfig(), [tiny_data_dir], tiny_trained_model.model_dir,
                 tmp_path / "eval")
    assert not (tmp_path / "eval" / "metrics.json").exists()


def test_a_second_evaluation_reuses_the_cached_ptychography(tiny_trained_model, tiny_data_dir, tmp_path):  # noqa: F811
    """evaluation.baseline_cache: the model-independent ptychography of each sample is kept per settings;
    a second evaluation (of the same or another model) reads it back, other settings compute anew."""
    import stage

    def run(name: str, **settings) -> list[dict]:
        cfg = EvaluationConfig(n_bootstrap=0, n_panels=0, worst_k=0, ptycho=True, max_samples=2,
                               baseline_cache=str(tmp_path / "cache"), **settings)
        result = evaluate(cfg, stage.DataConfig(), [tiny_data_dir], tiny_trained_model.model_dir, tmp_path / name)
        return [s["ptycho_fit"] for s in json.loads(result.metrics_json.read_text())["samples"]]

    from evaluation.precompute import precompute

    assert precompute(EvaluationConfig(ptycho=True, max_samples=1, baseline_cache=str(tmp_path / "cache")),
                      [tiny_data_dir]) == 1   # the first sample computed before any model is scored
    first, second = run("first"), run("second")
    assert len(list((tmp_path / "cache" / "ptycho").glob("*.npz"))) == 2
    assert [f.get("cached", False) for f in first] == [True, False] and all(f["cached"] for f in second)
    assert [{k: v for k, v in f.items() if k != "cached"} for f in second] == \
        [{k: v for k, v in f.items() if k != "cached"} for f in first]
    other = run("other", ptycho_batch_size=16)
    assert not any(f.get("cached") for f in other)
    assert len(list((tmp_path / "cache" / "ptycho").glob("*.npz"))) == 4


def test_precompute_without_a_cache_directory_is_one_line_naming_the_setting(tiny_data_dir, capsys):
    from workflow.cli import main

    status = main(["precompute", "configs/quickstart.yaml", "--data", str(tiny_data_dir),
                   "--set", "evaluation.ptycho=true"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err and "--set evaluation.baseline_cache=DIR" in err
