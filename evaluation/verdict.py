"""The one rule for saying whether the network beats a baseline, used by the report and the CLI.

"Beats" is claimed only when the network is better on **every** headline metric (the judged records
of `metric_registry`: relative L2, PSNR, SSIM, Pearson r) in the headline view (`views.HEADLINE`: the field's rule, every map in its own
physical units with only its mean set to the truth's; never the structure or the legacy view) **and**
on each of them the network's bootstrap interval of the mean lies entirely on the better side of the
baseline's (the intervals do not overlap). Anything less gets a
sentence that says where the network is better, where the intervals overlap and where it is worse,
e.g. "the network does NOT beat the mean training target: better on rel. L2 and PSNR but
intervals overlap; worse on SSIM and Pearson r".

The intervals are those of `aggregation.aggregate`: a bootstrap over materials (a material's
samples are not independent), and an interval over fewer than 2 materials is no interval. The rule
is applied overall and to each element class (`scoring.ELEMENT_CLASSES`: light, every element
Z <= 14, and heavy, the rest): an overall win says nothing about the class where the network loses,
so `all_verdicts` puts every class's verdict in the sentence the report and the CLI print.

Non-overlap of two 95% intervals is a conservative test (stricter than a paired test at 5%); we
use it because it is what a reader can check by eye in the headline table.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from models.pretrained_index import flagship_name

from .methods import NETWORK, REGISTRY, in_panel_order, method
from .metric_registry import judged, metric
from .views import HEADLINE, LEGACY, headline_scores

#: how a class sentence opens for each `Verdict.status`.
STATUS_LEADS: dict[str, str] = {"beats": "beats", "loses": "loses to", "ties": "ties with (does NOT beat)",
                                "does not beat": "does NOT beat"}


@dataclass
class Verdict:
    """Network vs one baseline on one target. Each list holds names of the headline metrics
    (`metric_registry.judged`).

    status:         "beats"; "loses" (better on no metric, worse with intervals apart on at least
                    one); "ties" (no interval apart: nothing told apart); "does not beat" (the rest).
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
    status: str = "does not beat"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict(aggregate: dict[str, Any], baseline: str, *, intervals: bool = True, ci_level: float = 0.95,
            view: str = HEADLINE, label: str | None = None) -> Verdict:
    """Decide network vs ``baseline`` from ``aggregate[method][view][metric]`` = {value, low, high, n}.

    intervals: False when the aggregates carry no real intervals (``n_bootstrap = 0``); then no
    claim of "beats" is made. Fewer than 2 samples, or fewer than 2 materials (``n_groups``),
    likewise give no interval.
    label: a class's name (e.g. "light (every element Z <= 14)"): the sentence opens with it and
    says "loses to" / "ties with" plainly where the overall sentence says "does NOT beat".
    """
    groups = _groups(aggregate[NETWORK][view], aggregate[baseline][view], intervals)
    status = _status(groups)
    name = method(baseline).verdict_label
    level = f"{round(100 * ci_level)}%"
    if status == "beats":
        sentence = (f"the network beats the {name}: better on {_names(groups['better_apart'])}, "
                    f"with non-overlapping {level} intervals")
    else:
        lead = STATUS_LEADS[status] if label else "does NOT beat"
        sentence = f"the network {lead} the {name}: " + "; ".join(_clauses(groups, intervals))
    if label:
        sentence = f"{label}: {sentence}"
    return Verdict(baseline, status == "beats", sentence, **groups, status=status)


def _groups(net: dict[str, Any], base: dict[str, Any], intervals: bool) -> dict[str, list[str]]:
    """Each headline metric sorted into better/worse x apart/overlap, or missing."""
    groups: dict[str, list[str]] = {"better_apart": [], "better_overlap": [], "worse_apart": [], "worse_overlap": [],
                                    "missing": []}
    for m in judged():
        a, b = net.get(m.name) or {}, base.get(m.name) or {}
        if not (_a_number(a.get("value")) and _a_number(b.get("value"))):  # None or NaN: missing, not compared
            groups["missing"].append(m.name)
            continue
        better = a["value"] > b["value"] if m.better == "higher" else a["value"] < b["value"]
        apart = intervals and _apart(a, b)
        groups[("better" if better else "worse") + ("_apart" if apart else "_overlap")].append(m.name)
    return groups


def _a_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value)


def _status(groups: dict[str, list[str]]) -> str:
    """`Verdict.status` from the metric groups."""
    if len(groups["better_apart"]) == len(judged()):
        return "beats"
    if groups["worse_apart"] and not groups["better_apart"] and not groups["better_overlap"]:
        return "loses"
    if not groups["better_apart"] and not groups["worse_apart"]:
        return "ties"
    return "does not beat"


def _apart(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The two intervals are real (>= 2 samples and, when grouped, >= 2 materials each) and disjoint."""
    if min(a.get("n") or 0, b.get("n") or 0) < 2 or None in (a.get("low"), a.get("high"), b.get("low"), b.get("high")):
        return False
    if any(entry.get("n_groups") is not None and entry["n_groups"] < 2 for entry in (a, b)):
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
    names = [metric(m).short_name for m in metrics]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def all_verdicts(aggregates: dict[str, dict[str, Any]], *, intervals: bool, ci_level: float,
                 by_class: dict[str, dict[str, dict[str, Any]]] | None = None,
                 absent: dict[str, str] | None = None,
                 paired: dict[str, dict[str, tuple[dict, dict]]] | None = None) -> dict[str, dict]:
    """verdicts[target][baseline] for every judged baseline (`methods.Method.judged`) present beside
    the network, in the registry's order.

    Each is `Verdict.as_dict()` of the overall verdict plus ``overall_sentence`` (that verdict's
    sentence), ``by_class`` ({class: `Verdict.as_dict()`} from ``by_class[target][class]``, the
    class aggregates) and ``sentence``: the overall sentence followed by every class's, which is
    what the report and the CLI print. Without ``by_class`` the sentence is the overall one.
    absent: {baseline: why it was not computed}; each gets an entry with ``status`` "absent" and a
    sentence that says so, so the closing lines never pass over a missing baseline in silence.
    paired: paired[target][baseline] = (aggregates, class aggregates) over only the samples that
    baseline was scored on (`aggregation.subset_aggregates`): a subset method is judged against the
    network on the same samples, not against the network's mean over all of them.
    """
    out: dict[str, dict] = {}
    for target, overall in aggregates.items():
        out[target] = {}
        for m in (m.name for m in REGISTRY if m.judged):
            agg, classes = (paired or {}).get(target, {}).get(m) or (overall, (by_class or {}).get(target, {}))
            if m in agg and NETWORK in agg:
                out[target][m] = _with_classes(verdict(agg, m, intervals=intervals, ci_level=ci_level), classes,
                                               intervals, ci_level)
        for m, why in (absent or {}).items():
            if m not in overall and NETWORK in overall:
                out[target][m] = _absent(m, why)
    return out


def _with_classes(overall: Verdict, classes: dict[str, dict[str, Any]], intervals: bool,
                  ci_level: float) -> dict[str, Any]:
    """The overall verdict's dict with the per-class verdicts beside it and in its sentence."""
    per_class = {name: verdict(agg, overall.baseline, intervals=intervals, ci_level=ci_level,
                               label=_class_label(name, agg)).as_dict()
                 for name, agg in classes.items() if overall.baseline in agg and NETWORK in agg}
    sentence = overall.sentence
    if per_class:
        sentence += ". Per element class: " + ". ".join(v["sentence"] for v in per_class.values())
    return {**overall.as_dict(), "sentence": sentence, "overall_sentence": overall.sentence, "by_class": per_class}


def _class_label(name: str, agg: dict[str, Any]) -> str:
    """"light (every element Z <= 14; 12 samples of 3 materials)"."""
    entry = agg[NETWORK][HEADLINE].get("rel_l2") or {}
    count = f"{entry.get('n', 0)} samples" + (f" of {entry['n_groups']} materials"
                                              if entry.get("n_groups") is not None else "")
    return name[:-1] + f"; {count})" if name.endswith(")") else f"{name} ({count})"


def _absent(baseline: str, why: str) -> dict[str, Any]:
    """The verdict entry of a baseline that was not computed."""
    empty = Verdict(baseline, False, f"no verdict against the {method(baseline).verdict_label}: {why}",
                    status="absent").as_dict()
    return {**empty, "overall_sentence": empty["sentence"], "by_class": {}}


#: the study's flagship reconstructor (docs/evaluation.md, "The study"): trained on the study's plan
#: (configs/study.yaml's physics and splits); named once, in models/pretrained/FLAGSHIP
STUDY_PRETRAINED = flagship_name()


def study_reference(target: str = "potential") -> str | None:
    """One sentence with the study flagship's held-out result, read from its shipped model card, so that
    a small run (the demo) says where its own numbers stand; None if the package ships no study model.
    A card written before issue 30 holds the legacy rule's scores: the sentence says so."""
    from models import pretrained_card, pretrained_names

    if STUDY_PRETRAINED not in pretrained_names():
        return None
    card = pretrained_card(STUDY_PRETRAINED)
    per_method = (card.held_out_evaluation.aggregates or {}).get(target) if card.held_out_evaluation else None
    view, scores = headline_scores(per_method or {})
    if NETWORK not in scores:
        return None
    # methods scored on every sample only: the sentence states one sample count for all of them
    rel_l2 = {m.name: scores[m.name]["rel_l2"] for m in in_panel_order() if m.name in scores and m.subset is None}
    listed = ", ".join(f"{method(m).verdict_label.removesuffix(' baseline')} {v.value:.3f}"
                       for m, v in rel_l2.items())
    rule = ("under the legacy rule (network as predicted, baselines least-squares scaled and offset to the truth; "
            "not the field's rule of the headline above)" if view == LEGACY else "under the field's rule")
    if not card.held_out_evaluation.symmetry_average:
        rule += ", its single pass (the card predates symmetry averaging, evaluation.symmetry_average)"
    materials = len(card.trained_on.data.materials["test"])
    return (f"For scale, the study's flagship pretrained:{STUDY_PRETRAINED} (trained on the physics and splits of "
            f"configs/{card.trained_on.config_name}.yaml; docs/evaluation.md, 'The study') scores {target} "
            f"relative L2 {listed} {rule} on {rel_l2[NETWORK].n} noise-free held-out samples of {materials} "
            f"materials of structure types it never saw.")
