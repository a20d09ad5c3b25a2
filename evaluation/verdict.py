"""The one rule for saying whether the network beats a baseline, used by the report and the CLI.

"Beats" is claimed only when the network is better on **every** headline metric (relative L2,
PSNR, SSIM, Pearson r) **and** on each of them the network's bootstrap interval of the mean lies
entirely on the better side of the baseline's (the intervals do not overlap). Anything less gets a
sentence that says where the network is better, where the intervals overlap and where it is worse,
e.g. "the network does NOT beat the mean training target: better on rel. L2 and PSNR but
intervals overlap; worse on SSIM and Pearson r".

Non-overlap of two 95% intervals is a conservative test (stricter than a paired test at 5%); we
use it because it is what a reader can check by eye in the headline table.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: the headline metrics, in the order sentences name them; True = higher is better.
HEADLINE_METRICS: dict[str, bool] = {"rel_l2": False, "psnr_db": True, "ssim": True, "pearson_r": True}
#: how sentences name each metric.
SHORT_NAMES: dict[str, str] = {"rel_l2": "rel. L2", "psnr_db": "PSNR", "ssim": "SSIM", "pearson_r": "Pearson r"}
#: how sentences name each baseline.
BASELINE_NAMES: dict[str, str] = {"mean": "mean training target", "icom": "iCoM baseline",
                                  "ptycho": "ptychography baseline"}


@dataclass
class Verdict:
    """Network vs one baseline on one target. Each list holds metric keys of `HEADLINE_METRICS`.

    better_apart:   network better, intervals do not overlap.
    better_overlap: network better on the mean, intervals overlap (or there are no intervals).
    worse_apart / worse_overlap: the same where the network is worse (a tie counts as worse).
    missing:        no value for the network or the baseline.
    """

    baseline: str
    beats: bool
    sentence: str
    better_apart: list[str] = field(default_factory=list)
    better_overlap: list[str] = field(default_factory=list)
    worse_apart: list[str] = field(default_factory=list)
    worse_overlap: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict(aggregate: dict[str, Any], baseline: str, *, intervals: bool = True, ci_level: float = 0.95,
            units: str = "physical") -> Verdict:
    """Decide network vs ``baseline`` from ``aggregate[method][units][metric]`` = {value, low, high, n}.

    intervals: False when the aggregates carry no real intervals (``n_bootstrap = 0``); then no
    claim of "beats" is made. Fewer than 2 samples likewise give no interval.
    """
    net, base = aggregate["network"][units], aggregate[baseline][units]
    groups: dict[str, list[str]] = {"better_apart": [], "better_overlap": [], "worse_apart": [], "worse_overlap": [],
                                    "missing": []}
    for metric, higher in HEADLINE_METRICS.items():
        a, b = net.get(metric) or {}, base.get(metric) or {}
        if a.get("value") is None or b.get("value") is None:
            groups["missing"].append(metric)
            continue
        better = a["value"] > b["value"] if higher else a["value"] < b["value"]
        apart = intervals and _apart(a, b)
        groups[("better" if better else "worse") + ("_apart" if apart else "_overlap")].append(metric)
    beats = len(groups["better_apart"]) == len(HEADLINE_METRICS)
    name = BASELINE_NAMES.get(baseline, baseline)
    level = f"{round(100 * ci_level)}%"
    if beats:
        sentence = (f"the network beats the {name}: better on {_names(groups['better_apart'])}, "
                    f"with non-overlapping {level} intervals")
    else:
        sentence = f"the network does NOT beat the {name}: " + "; ".join(_clauses(groups, intervals))
    return Verdict(baseline, beats, sentence, **groups)


def _apart(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The two intervals are real (>= 2 samples each) and disjoint."""
    if min(a.get("n") or 0, b.get("n") or 0) < 2 or None in (a.get("low"), a.get("high"), b.get("low"), b.get("high")):
        return False
    return a["high"] < b["low"] or b["high"] < a["low"]


def _clauses(groups: dict[str, list[str]], intervals: bool) -> list[str]:
    overlap = "intervals overlap" if intervals else "no intervals were computed (evaluation.n_bootstrap = 0)"
    clauses = []
    if groups["better_apart"]:
        clauses.append(f"better on {_names(groups['better_apart'])} with intervals apart")
    if groups["better_overlap"]:
        clauses.append(f"better on {_names(groups['better_overlap'])} but {overlap}")
    worse = groups["worse_apart"] + groups["worse_overlap"]
    if worse:
        note = f" ({overlap} on {_names(groups['worse_overlap'])})" if groups["worse_overlap"] and groups["worse_apart"] \
            else (f" ({overlap})" if groups["worse_overlap"] else "")
        clauses.append(f"worse on {_names(worse)}{note}")
    if groups["missing"]:
        clauses.append(f"no value for {_names(groups['missing'])}")
    return clauses


def _names(metrics: list[str]) -> str:
    names = [SHORT_NAMES[m] for m in metrics]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def all_verdicts(aggregates: dict[str, dict[str, Any]], *, intervals: bool, ci_level: float) -> dict[str, dict]:
    """verdicts[target][baseline] = `Verdict.as_dict()` for every baseline present beside the network."""
    return {target: {m: verdict(agg, m, intervals=intervals, ci_level=ci_level).as_dict()
                     for m in BASELINE_NAMES if m in agg and "network" in agg}
            for target, agg in aggregates.items()}


#: the reconstructor the full study ships (configs/study.yaml; docs/evaluation.md, "The study")
STUDY_PRETRAINED = "study-scan"


def study_reference(target: str = "potential") -> str | None:
    """One sentence with the full study's held-out result, read from the shipped model card, so that a
    small run (the demo) says where its own numbers stand; None if the package ships no study model."""
    from models import pretrained_card, pretrained_names

    if STUDY_PRETRAINED not in pretrained_names():
        return None
    card = pretrained_card(STUDY_PRETRAINED)
    scores = card["held_out_evaluation"]["aggregates"].get(target)
    if not scores:
        return None
    rel_l2 = {method: scores[method]["physical"]["rel_l2"] for method in ("network", "icom", "mean") if method in scores}
    listed = ", ".join(f"{BASELINE_NAMES.get(m, m).removesuffix(' baseline')} {v['value']:.3f}" for m, v in rel_l2.items())
    materials = len(card["trained_on"]["data"]["materials"]["test"])
    return (f"For scale, the full study (configs/study.yaml, `make study`; docs/evaluation.md, 'The study') "
            f"scores {target} relative L2 {listed} on {rel_l2['network']['n']} held-out samples of {materials} "
            f"materials; its reconstructor ships as pretrained:{STUDY_PRETRAINED}.")
