"""evaluation.verdict: the one rule for "the network beats a baseline", on constructed aggregates."""
from __future__ import annotations

from typing import Any

import numpy as np

from evaluation import metrics as M
from evaluation.scoring import HEAVY_CLASS, LIGHT_CLASS
from evaluation.metric_registry import judged
from evaluation.verdict import all_verdicts, verdict
from evaluation.views import FIELD, LEGACY, STRUCTURE


def _ci(value: float, half: float, n: int = 6) -> dict[str, Any]:
    return {"value": value, "low": value - half, "high": value + half, "n": n, "n_nonfinite": 0}


def _aggregate(network: dict[str, tuple[float, float]], baseline: dict[str, tuple[float, float]],
               name: str = "mean") -> dict[str, Any]:
    """aggregate[method][FIELD][metric] from {metric: (value, half-width of the interval)}."""
    return {"network": {FIELD: {k: _ci(*v) for k, v in network.items()}},
            name: {FIELD: {k: _ci(*v) for k, v in baseline.items()}}}


def test_beats_only_when_better_on_every_metric_with_intervals_apart():
    agg = _aggregate({"rel_l2": (0.2, 0.02), "psnr_db": (30, 1), "ssim": (0.8, 0.02), "pearson_r": (0.9, 0.02)},
                     {"rel_l2": (0.5, 0.02), "psnr_db": (20, 1), "ssim": (0.4, 0.02), "pearson_r": (0.5, 0.02)})
    v = verdict(agg, "mean")
    assert v.beats
    assert v.sentence == ("the network beats the mean training target: better on rel. L2, PSNR, SSIM and "
                          "Pearson r, with non-overlapping 95% intervals")


def test_the_demo_case_is_not_a_win():
    """Issue 15's quickstart: better on rel. L2 and PSNR with overlapping intervals, worse on SSIM and r."""
    agg = _aggregate({"rel_l2": (0.30, 0.05), "psnr_db": (17.0, 1.5), "ssim": (0.13, 0.05), "pearson_r": (0.19, 0.1)},
                     {"rel_l2": (0.32, 0.05), "psnr_db": (16.5, 1.5), "ssim": (0.19, 0.05), "pearson_r": (0.21, 0.1)})
    v = verdict(agg, "mean")
    assert not v.beats
    assert v.sentence == ("the network does NOT beat the mean training target: better on rel. L2 and PSNR but "
                          "intervals overlap; worse on SSIM and Pearson r (intervals overlap)")
    assert v.better_overlap == ["rel_l2", "psnr_db"] and v.worse_overlap == ["ssim", "pearson_r"]


def test_one_overlapping_interval_is_enough_to_withhold_the_claim():
    net = {"rel_l2": (0.2, 0.01), "psnr_db": (30, 0.5), "ssim": (0.8, 0.01), "pearson_r": (0.9, 0.05)}
    base = {"rel_l2": (0.5, 0.01), "psnr_db": (20, 0.5), "ssim": (0.4, 0.01), "pearson_r": (0.86, 0.05)}
    v = verdict(_aggregate(net, base, "icom"), "icom")
    assert not v.beats
    assert v.sentence == ("the network does NOT beat the iCoM baseline: better on rel. L2, PSNR and SSIM with "
                          "intervals apart; better on Pearson r but intervals overlap")


def test_lower_is_better_for_rel_l2_only():
    # Higher rel. L2 with intervals apart is worse, even when the other three are clearly better.
    net = {"rel_l2": (0.9, 0.01), "psnr_db": (30, 0.5), "ssim": (0.8, 0.01), "pearson_r": (0.9, 0.01)}
    base = {"rel_l2": (0.5, 0.01), "psnr_db": (20, 0.5), "ssim": (0.4, 0.01), "pearson_r": (0.5, 0.01)}
    v = verdict(_aggregate(net, base, "ptycho"), "ptycho")
    assert not v.beats and v.worse_apart == ["rel_l2"]
    assert v.sentence.endswith("better on PSNR, SSIM and Pearson r with intervals apart; worse on rel. L2")
    assert "ptychography baseline" in v.sentence


def test_no_intervals_or_one_sample_make_no_claim():
    net = {"rel_l2": (0.2, 0.0), "psnr_db": (30, 0.0), "ssim": (0.8, 0.0), "pearson_r": (0.9, 0.0)}
    base = {"rel_l2": (0.5, 0.0), "psnr_db": (20, 0.0), "ssim": (0.4, 0.0), "pearson_r": (0.5, 0.0)}
    v = verdict(_aggregate(net, base), "mean", intervals=False)
    assert not v.beats and "no intervals were computed" in v.sentence
    single = _aggregate(net, base)
    for method in single.values():
        for entry in method[FIELD].values():
            entry["n"] = 1
    assert not verdict(single, "mean").beats


def test_missing_values_are_named_and_block_the_claim():
    net = {"rel_l2": (0.2, 0.01), "psnr_db": (30, 0.5), "ssim": (0.8, 0.01), "pearson_r": (0.9, 0.01)}
    base = {"rel_l2": (0.5, 0.01), "psnr_db": (20, 0.5), "ssim": (0.4, 0.01), "pearson_r": (0.5, 0.01)}
    agg = _aggregate(net, base)
    agg["network"][FIELD]["psnr_db"]["value"] = None   # e.g. every PSNR infinite
    v = verdict(agg, "mean")
    assert not v.beats and v.missing == ["psnr_db"] and v.sentence.endswith("no value for PSNR")


def test_all_verdicts_covers_every_baseline_present():
    net = {"rel_l2": (0.2, 0.01), "psnr_db": (30, 0.5), "ssim": (0.8, 0.01), "pearson_r": (0.9, 0.01)}
    agg = _aggregate(net, net, "mean")
    agg["icom"] = agg["mean"]
    out = all_verdicts({"potential": agg, "density": _aggregate(net, net)}, intervals=True, ci_level=0.9)
    assert set(out["potential"]) == {"mean", "icom"} and set(out["density"]) == {"mean"}
    assert out["potential"]["icom"]["beats"] is False   # equal is not better


# --------------------------------------------------------------------------- material-level intervals and classes

def _record(material: str, element_class: str, errors: dict[str, float]) -> dict[str, Any]:
    """A per-sample record as scoring writes it, the headline metrics following each method's rel. L2."""
    def scores(rel_l2: float) -> dict[str, float]:
        return {"rel_l2": rel_l2, "psnr_db": 40.0 - 20.0 * rel_l2, "ssim": 1.0 - rel_l2, "pearson_r": 1.0 - rel_l2 / 2}
    metrics = {m: {FIELD: {**scores(e), "mean_error_A": 0.1, "recall": 1.0}, STRUCTURE: {**scores(e), "scale": 1.0},
                   LEGACY: {**scores(e), "rel_l2_level": 0.0, "rel_l2_contrast": e}} for m, e in errors.items()}
    return {"material_id": material, "element_class": element_class, "metrics": {"potential": metrics}}


def _records(offset: float, materials: int, per_material: int, element_class: str) -> list[dict]:
    """``per_material`` near-identical samples per material (no randomness): iCoM's error spreads over
    materials, the network's is iCoM's minus ``offset`` plus a material effect of +-0.1."""
    spread = np.linspace(-0.15, 0.15, materials) if materials > 1 else np.zeros(1)
    jitter = np.linspace(-0.003, 0.003, per_material)
    return [_record(f"{element_class[:5]}{k}", element_class,
                    {"network": 0.45 + spread[k] - offset + (0.1 if k % 2 else -0.1) + j, "icom": 0.45 + spread[k] + j})
            for k in range(materials) for j in jitter]


def test_verdict_refuses_beats_when_material_intervals_overlap_though_sample_intervals_would_not():
    """Issue 22: 4 samples per material are not 4 independent draws. Here intervals over samples are
    apart (the old rule would say "beats"); intervals over materials overlap, so no claim."""
    from evaluation.aggregation import aggregate
    from evaluation.config import EvaluationConfig

    records = _records(0.12, materials=8, per_material=4, element_class=HEAVY_CLASS)
    cfg = EvaluationConfig(n_bootstrap=2000, seed=0)
    by_material = aggregate(records, "potential", cfg)
    by_sample = {m: {FIELD: {k: M.bootstrap_ci([r["metrics"]["potential"][m][FIELD][k] for r in records],
                                                    n_resamples=2000, seed=0).as_dict()
                           for k in (metric.name for metric in judged())}}
                 for m in ("network", "icom")}
    assert verdict(by_sample, "icom").beats                        # what a per-sample bootstrap would claim
    v = verdict(by_material, "icom")
    assert not v.beats and "does NOT beat" in v.sentence and v.better_overlap
    assert by_material["network"][FIELD]["rel_l2"]["n_groups"] == 8


def test_one_material_gives_no_interval_and_no_claim():
    from evaluation.aggregation import aggregate
    from evaluation.config import EvaluationConfig

    records = _records(0.3, materials=1, per_material=6, element_class=LIGHT_CLASS)
    agg = aggregate(records, "potential", EvaluationConfig(n_bootstrap=200))
    assert agg["network"][FIELD]["rel_l2"]["n_groups"] == 1
    assert not verdict(agg, "icom").beats


def test_verdict_per_element_class_never_says_beats_where_the_network_loses():
    """Overall the network wins (heavy materials dominate), on light materials it loses: the class
    verdict says so, and the sentence the CLI prints carries both."""
    from evaluation.aggregation import aggregate, class_aggregates
    from evaluation.config import EvaluationConfig

    records = (_records(0.35, materials=16, per_material=4, element_class=HEAVY_CLASS)
               + _records(-0.3, materials=4, per_material=4, element_class=LIGHT_CLASS))
    cfg = EvaluationConfig(n_bootstrap=500)
    aggs = {"potential": aggregate(records, "potential", cfg)}
    by_class = {"potential": class_aggregates(records, "potential", cfg)}
    out = all_verdicts(aggs, intervals=True, ci_level=0.95, by_class=by_class)["potential"]["icom"]
    assert out["beats"] and out["overall_sentence"].startswith("the network beats the iCoM baseline")
    light, heavy = out["by_class"][LIGHT_CLASS], out["by_class"][HEAVY_CLASS]
    assert heavy["beats"] and heavy["status"] == "beats"
    assert not light["beats"] and light["status"] == "loses"
    assert light["sentence"].startswith("light (every element Z <= 14; 16 samples of 4 materials): "
                                        "the network loses to the iCoM baseline: worse on rel. L2")
    assert "beats" not in light["sentence"]
    assert out["sentence"] == out["overall_sentence"] + ". Per element class: " + light["sentence"] + ". " \
        + heavy["sentence"]


def test_a_class_where_nothing_is_told_apart_is_a_tie():
    net = {"rel_l2": (0.30, 0.05), "psnr_db": (20.0, 2.0), "ssim": (0.70, 0.05), "pearson_r": (0.80, 0.05)}
    base = {"rel_l2": (0.32, 0.05), "psnr_db": (21.0, 2.0), "ssim": (0.69, 0.05), "pearson_r": (0.82, 0.05)}
    v = verdict(_aggregate(net, base, "icom"), "icom", label="light (every element Z <= 14)")
    assert v.status == "ties" and not v.beats
    assert v.sentence.startswith("light (every element Z <= 14): the network ties with (does NOT beat) the iCoM")


def test_an_absent_baseline_gets_a_verdict_that_says_why():
    net = {"rel_l2": (0.2, 0.01), "psnr_db": (30, 0.5), "ssim": (0.8, 0.01), "pearson_r": (0.9, 0.01)}
    agg = _aggregate(net, net, "icom")
    out = all_verdicts({"potential": agg}, intervals=True, ci_level=0.95,
                       absent={"mean": "not computed: no training samples"})["potential"]
    assert out["mean"]["status"] == "absent" and not out["mean"]["beats"]
    assert out["mean"]["sentence"] == "no verdict against the mean training target: not computed: no training samples"
