"""evaluation.verdict: the one rule for "the network beats a baseline", on constructed aggregates."""
from __future__ import annotations

from typing import Any

from evaluation.verdict import all_verdicts, verdict


def _ci(value: float, half: float, n: int = 6) -> dict[str, Any]:
    return {"value": value, "low": value - half, "high": value + half, "n": n, "n_nonfinite": 0}


def _aggregate(network: dict[str, tuple[float, float]], baseline: dict[str, tuple[float, float]],
               name: str = "mean") -> dict[str, Any]:
    """aggregate[method]["physical"][metric] from {metric: (value, half-width of the interval)}."""
    return {"network": {"physical": {k: _ci(*v) for k, v in network.items()}},
            name: {"physical": {k: _ci(*v) for k, v in baseline.items()}}}


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
        for entry in method["physical"].values():
            entry["n"] = 1
    assert not verdict(single, "mean").beats


def test_missing_values_are_named_and_block_the_claim():
    net = {"rel_l2": (0.2, 0.01), "psnr_db": (30, 0.5), "ssim": (0.8, 0.01), "pearson_r": (0.9, 0.01)}
    base = {"rel_l2": (0.5, 0.01), "psnr_db": (20, 0.5), "ssim": (0.4, 0.01), "pearson_r": (0.5, 0.01)}
    agg = _aggregate(net, base)
    agg["network"]["physical"]["psnr_db"]["value"] = None   # e.g. every PSNR infinite
    v = verdict(agg, "mean")
    assert not v.beats and v.missing == ["psnr_db"] and v.sentence.endswith("no value for PSNR")


def test_all_verdicts_covers_every_baseline_present():
    net = {"rel_l2": (0.2, 0.01), "psnr_db": (30, 0.5), "ssim": (0.8, 0.01), "pearson_r": (0.9, 0.01)}
    agg = _aggregate(net, net, "mean")
    agg["icom"] = agg["mean"]
    out = all_verdicts({"potential": agg, "density": _aggregate(net, net)}, intervals=True, ci_level=0.9)
    assert set(out["potential"]) == {"mean", "icom"} and set(out["density"]) == {"mean"}
    assert out["potential"]["icom"]["beats"] is False   # equal is not better
