"""The field's rule (issue 30): every method in its own physical units with only its mean set to the
truth's, beside it one least-squares scale + offset for every method, the network's own level error,
and the legacy rule under its own name; on hand-made maps, constructed aggregates and one real
`namsa evaluate` of the tiny store."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from evaluation import metrics as M
from evaluation.views import FIELD, HEADLINE, LEGACY, LEVEL, STRUCTURE, VIEWS, field_map, level_error, view_maps


def _truth(shape: tuple[int, int] = (24, 24)) -> np.ndarray:
    """A positive lattice of Gaussian columns (V*Angstrom-like values around 40), [row = y, col = x]."""
    y, x = np.mgrid[0:shape[0], 0:shape[1]]
    return (30.0 + 20.0 * np.cos(2 * np.pi * y / 6) ** 2 * np.cos(2 * np.pi * x / 8) ** 2).astype(np.float64)


def _record_of(est: np.ndarray, truth: np.ndarray, name: str) -> dict[str, dict[str, float]]:
    """The views' scores of one map as scoring writes them (`scoring._score_method`)."""
    from evaluation.config import EvaluationConfig
    from evaluation.methods import method
    from evaluation.scoring import _score_method

    scores, _ = _score_method(EvaluationConfig(), method(name), est, truth, (0.25, 0.25))
    return scores


def test_a_pure_offset_of_the_truth_scores_zero_in_the_field_and_structure_views():
    truth = _truth()
    shifted = truth + 7.5                       # what no intensity can tell apart from the truth
    scores = _record_of(shifted, truth, "network")
    for view in (FIELD, STRUCTURE):
        assert scores[view]["rel_l2"] == pytest.approx(0.0, abs=1e-9), view
        assert scores[view]["pearson_r"] == pytest.approx(1.0)
    assert scores[STRUCTURE]["scale"] == pytest.approx(1.0)
    # the legacy rule took the network as predicted: the offset is all of its error, and its level part
    assert scores[LEGACY]["rel_l2"] == pytest.approx(M.relative_l2(shifted, truth))
    assert scores[LEGACY]["rel_l2_level"] == pytest.approx(scores[LEGACY]["rel_l2"])
    assert scores[LEVEL]["level_error"] == pytest.approx(7.5 / truth.mean())


def test_a_scaled_truth_scores_zero_only_in_the_structure_view():
    truth = _truth()
    scaled = 1.7 * truth                        # the median scale the legacy fit handed the baselines
    scores = _record_of(scaled, truth, "icom")
    assert scores[STRUCTURE]["rel_l2"] == pytest.approx(0.0, abs=1e-9)
    assert scores[STRUCTURE]["scale"] == pytest.approx(1 / 1.7)
    expected = M.relative_l2(field_map(scaled, truth), truth)
    assert scores[FIELD]["rel_l2"] == pytest.approx(expected) and expected > 0.05
    # the field view keeps the map's own units: 0.7 of the truth's contrast is left as error
    contrast = truth - truth.mean()
    assert scores[FIELD]["rel_l2"] == pytest.approx(0.7 * np.linalg.norm(contrast) / np.linalg.norm(truth))
    # iCoM's legacy map is least-squares fitted, so the legacy rule forgave the scale too
    assert scores[LEGACY]["rel_l2"] == pytest.approx(0.0, abs=1e-9)
    assert LEVEL not in scores          # only the network's level error is reported


def test_the_field_view_takes_only_the_mean_from_the_truth():
    truth = _truth()
    est = 0.5 * truth[::-1] - 3.0
    field = field_map(est, truth)
    assert field.mean() == pytest.approx(truth.mean())
    np.testing.assert_allclose(field - field.mean(), est - est.mean(), atol=1e-9)
    views, fit = view_maps(est, truth, legacy_fitted=False)
    assert set(views) == set(VIEWS) and views[LEGACY] is not views[STRUCTURE]
    np.testing.assert_allclose(views[LEGACY], est)
    assert fit["scale"] >= 0.0


def test_the_networks_level_error_on_a_hand_made_map():
    truth = np.full((8, 8), 40.0)
    truth[2:4, 2:4] = 80.0                      # mean 40 + 40 * 4 / 64 = 42.5
    pred = truth * 1.1 + 2.0                    # mean 48.75
    assert level_error(pred, truth) == pytest.approx(6.25 / 42.5)
    assert level_error(truth + 0.0, truth) == 0.0
    assert level_error(np.ones((4, 4)), np.zeros((4, 4))) == float("inf")


def _ci(value: float, half: float = 0.01, n: int = 12) -> dict[str, Any]:
    return {"value": value, "low": value - half, "high": value + half, "n": n, "n_nonfinite": 0, "n_groups": 6}


def _views_aggregate(network_field: float, icom_field: float, network_legacy: float, icom_legacy: float) -> dict:
    """aggregate[method][view][metric]: each method's four headline metrics follow its rel. L2 per view."""
    def scores(rel_l2: float) -> dict[str, Any]:
        return {"rel_l2": _ci(rel_l2), "psnr_db": _ci(40 - 20 * rel_l2), "ssim": _ci(1 - rel_l2),
                "pearson_r": _ci(1 - rel_l2 / 2)}
    return {"network": {FIELD: scores(network_field), STRUCTURE: scores(network_field), LEGACY: scores(network_legacy)},
            "icom": {FIELD: scores(icom_field), STRUCTURE: scores(icom_field), LEGACY: scores(icom_legacy)}}


def test_the_verdict_follows_the_field_view_where_the_legacy_rule_disagrees():
    from evaluation.verdict import all_verdicts, verdict

    # legacy: iCoM fitted to the truth wins; field: in its own units it loses clearly
    agg = _views_aggregate(network_field=0.2, icom_field=0.6, network_legacy=0.3, icom_legacy=0.1)
    assert verdict(agg, "icom").beats and verdict(agg, "icom", view=HEADLINE).beats
    assert verdict(agg, "icom", view=LEGACY).status == "loses"
    out = all_verdicts({"potential": agg}, intervals=True, ci_level=0.95)["potential"]["icom"]
    assert out["beats"] and out["overall_sentence"].startswith("the network beats the iCoM baseline")
    # and the other way round: the legacy rule's win is no win
    agg = _views_aggregate(network_field=0.6, icom_field=0.2, network_legacy=0.1, icom_legacy=0.3)
    assert verdict(agg, "icom", view=LEGACY).beats
    out = all_verdicts({"potential": agg}, intervals=True, ci_level=0.95)["potential"]["icom"]
    assert not out["beats"] and out["status"] == "loses"


def test_old_scores_are_read_as_the_legacy_rule():
    """A card or an eval summary written before issue 30 holds "physical" (or flat) scores: the legacy rule's."""
    from evaluation.views import headline_scores
    from workflow.summary import headline_lines

    new = {"network": {FIELD: {"rel_l2": 0.2}, LEGACY: {"rel_l2": 0.3}}, "icom": {FIELD: {"rel_l2": 0.5}}}
    assert headline_scores(new) == (FIELD, {"network": {"rel_l2": 0.2}, "icom": {"rel_l2": 0.5}})
    assert headline_scores({"network": {"physical": {"rel_l2": 0.3}}}) == (LEGACY, {"network": {"rel_l2": 0.3}})
    old = headline_lines({"potential": {"network": {"rel_l2": 0.3}, "icom": {"rel_l2": 0.25}}}, {})
    assert old[0].startswith("potential relative L2 on held-out samples, legacy rule (network as predicted, "
                             "baselines least-squares scaled and offset to the truth); this evaluation predates")
    assert old[0].endswith(": network 0.300, icom 0.250")


def test_the_baseline_cache_never_reads_an_old_fitted_map(tmp_path):
    """Entries of the legacy format (maps fitted to the truth) are not found: the digest covers the format."""
    import hashlib

    from evaluation.baselines.cache import CACHE_FORMAT, cached, settings_digest

    settings = (None, 64, {"window": 5})
    old_digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert CACHE_FORMAT == 2 and settings_digest(settings) != old_digest
    old = tmp_path / "ptycho" / f"sample-{old_digest}.npz"
    old.parent.mkdir()
    np.savez(old, map=np.full((4, 4), 99.0), fit=np.asarray(json.dumps({"scale": 2.0})))
    raw, facts = cached(tmp_path, "ptycho", "sample", settings, lambda: (np.zeros((4, 4)), {"seconds": 1.0}))
    assert not raw.any() and facts == {"seconds": 1.0}
    again, facts = cached(tmp_path, "ptycho", "sample", settings, lambda: pytest.fail("recomputed"))
    assert not again.any() and facts == {"seconds": 1.0, "cached": True}


# --------------------------------------------------------------------------- one real evaluation

@pytest.fixture(scope="module")
def evaluated(tiny_trained_model, tiny_data_dir, tmp_path_factory):  # noqa: F811
    import stage
    from evaluation import EvaluationConfig, evaluate

    out = tmp_path_factory.mktemp("field_rule")
    result = evaluate(EvaluationConfig(n_bootstrap=50, n_panels=1, worst_k=1), stage.DataConfig(), [tiny_data_dir],
                      tiny_trained_model.model_dir, out)
    return result, json.loads(Path(result.metrics_json).read_text())


def test_evaluate_writes_every_view_and_the_networks_level_error(evaluated, tiny_trained_model, tiny_data_dir):  # noqa: F811
    import models
    import stage

    result, doc = evaluated
    agg = doc["aggregates"]["potential"]
    for name, entry in agg.items():
        assert set(entry) == set(VIEWS) | ({LEVEL} if name == "network" else set()), name
        assert {"rel_l2", "psnr_db", "ssim", "pearson_r"} <= set(entry[FIELD]) & set(entry[STRUCTURE]) \
            & set(entry[LEGACY])
    level = agg["network"][LEVEL]["level_error"]
    assert level["value"] >= 0 and level["median"] >= 0 and level["n"] == len(doc["samples"])
    assert result.headline["potential"]["network"][LEVEL]["level_error_median"] == pytest.approx(level["median"])
    # one sample recomputed by hand from its raw maps: the network's prediction and iCoM in V*Angstrom
    record = doc["samples"][0]
    with stage.open_stores([tiny_data_dir]) as stores:
        sample = stores[record["index"]]
    truth = sample.potential.astype(np.float64)
    pred = np.asarray(models.load_reconstructor(tiny_trained_model.model_dir)
                      .predict(sample.cbed.astype(np.float32))).reshape(truth.shape)
    net = record["metrics"]["potential"]["network"]
    assert net[FIELD]["rel_l2"] == pytest.approx(M.relative_l2(field_map(pred, truth), truth), rel=1e-4)
    assert net[LEGACY]["rel_l2"] == pytest.approx(M.relative_l2(pred, truth), rel=1e-4)
    assert net[LEVEL]["level_error"] == pytest.approx(level_error(pred, truth), rel=1e-4)
    from evaluation.baselines import icom_from_sample

    icom = icom_from_sample(sample).astype(np.float64)
    scores = record["metrics"]["potential"]["icom"]
    assert scores[FIELD]["rel_l2"] == pytest.approx(M.relative_l2(field_map(icom, truth), truth), rel=1e-4)
    scale, offset, signed = M.fit_affine_nonnegative(icom, truth)
    assert record["icom_fit"] == pytest.approx({"scale": scale, "offset": offset, "signed_scale": signed}, rel=1e-4)
    assert scores[STRUCTURE]["scale"] == pytest.approx(scale, rel=1e-4)
    assert scores[LEGACY]["rel_l2"] == pytest.approx(M.relative_l2(scale * icom + offset, truth), rel=1e-4)
    assert FIELD in doc["conventions"] and LEGACY in doc["conventions"] and LEVEL in doc["conventions"]


def test_the_report_puts_the_field_first_and_marks_nothing_from_the_truth_best(evaluated):
    result, _ = evaluated
    html = result.report_html.read_text()
    field = html.index("Headline: potential, the field&#x27;s rule")
    structure = html.index("potential: structure only")
    legacy = html.index("potential: legacy rule (network as predicted")
    level = html.index("The network's level error")
    assert field < level < structure < legacy
    assert "<td><b>" in html[field:level]                                # the headline's best in bold
    for section in (html[level:html.index("</p>", level)], html[structure:legacy],
                    html[legacy:html.index("</table>", legacy)]):
        assert "<td><b>" not in section                                  # no best where the truth gave numbers
    # under the headline no method is scaled, and no label says it is
    assert "iCoM (calibrated)" in html[field:level] and "least-squares scaled" not in html[field:level]


def test_the_closing_lines_say_the_field_first_then_structure_level_and_legacy(evaluated):
    from workflow.summary import headline_lines

    result, _ = evaluated
    lines = headline_lines(result.headline, result.verdicts)
    assert lines[0].startswith("potential relative L2 on held-out samples, the field's rule (each map in its own "
                               "physical units, only its mean set to the truth's); lower is better: network ")
    assert lines[1].startswith("  structure only (one least-squares scale and offset fitted to the truth for every "
                               "method); not used by the verdict: network ")
    assert lines[2].startswith("  the network's level error |mean(pred) - mean(truth)| / |mean(truth)|: median ")
    assert lines[3].startswith("  legacy rule (network as predicted, baselines least-squares scaled and offset to "
                               "the truth); not used by the verdict: network ")
    assert any(line.startswith("  the network ") for line in lines[4:])   # the verdicts follow


def test_a_cards_held_out_scores_are_labelled_with_the_rule_they_were_scored_by():
    """The first study card (pretrained:study-scan) holds the legacy rule's aggregates under "physical":
    they still read, and every place that shows them says which rule; a new card's field-view
    aggregates (the flagship's) say the field's rule."""
    from evaluation.card_view import held_out_rows
    from evaluation.verdict import study_reference
    from models import pretrained_card

    card = pretrained_card("study-scan").to_json()
    shipped = card["held_out_evaluation"]["aggregates"]["potential"]
    rows = {label: value for _, label, value in held_out_rows(card)}
    label = next(k for k in rows if k.startswith("potential relative L2 (test split)"))
    assert label.endswith("legacy rule (network as predicted, baselines least-squares scaled and offset to the truth)")
    assert f"network {shipped['network']['physical']['rel_l2']['value']:.4g}" in rows[label]
    assert "under the field's rule" in study_reference("potential")
    new = {"held_out_evaluation": {"split": "test", "aggregates": {"potential": {
        "network": {FIELD: {"rel_l2": _ci(0.3)}, LEGACY: {"rel_l2": _ci(0.2)}}, "icom": {FIELD: {"rel_l2": _ci(0.4)}}}}}}
    (_, label, value), = held_out_rows(new)
    assert "the field's rule" in label and value == "network 0.3; iCoM 0.4"
