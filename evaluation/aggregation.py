"""Aggregation over the per-sample records: means with bootstrap intervals over materials of every
metric in every view (`evaluation.metric_registry`, `evaluation.views`), breakdowns by element and
thickness class, network against the reference method (iCoM), compute times and the worst cases;
everything that ranks or breaks down reads the headline (field) view."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import metrics as M
from .config import EvaluationConfig
from .methods import NETWORK, REGISTRY, reference
from .metric_registry import METRICS, in_view, whole_map
from .scoring import ELEMENT_CLASSES
from .views import HEADLINE, LEVEL

#: the whole-map metrics' names (every view); with the next, what the scaling study may plot.
IMAGE_METRICS: tuple[str, ...] = tuple(m.name for m in whole_map())
#: the headline view's other metrics: the column positions (an offset moves no maximum).
COLUMN_METRICS: tuple[str, ...] = tuple(m.name for m in in_view(HEADLINE) if m.name not in IMAGE_METRICS)
#: metrics.json's key of `network_vs_reference` ("network_vs_icom").
VERSUS = f"network_vs_{reference().name}"
#: the views aggregated (`metric_registry.Metric.views`; ``level``: the network's own entry).
AGGREGATED_VIEWS: tuple[str, ...] = tuple(dict.fromkeys(v for m in METRICS for v in m.views))


def _values(records: list[dict], target: str, method: str, view: str, metric: str) -> list[float | None]:
    return [r["metrics"][target][method][view].get(metric) for r in records if method in r["metrics"][target]]


def _materials(records: list[dict], target: str, method: str) -> list[str]:
    """The material of each record `_values` reads, in the same order (the bootstrap's groups)."""
    return [str(r.get("material_id")) for r in records if method in r["metrics"][target]]


def aggregate(records: list[dict], target: str, cfg: EvaluationConfig) -> dict[str, Any]:
    """aggregates[method][view][metric] = {value (mean), low, high, n, n_nonfinite, n_groups, median}
    for every view of `AGGREGATED_VIEWS` the method's records hold (``level``: the network's only), each
    metric of `metric_registry.in_view`.

    The interval resamples materials, not samples (`metrics.bootstrap_ci` with groups): the
    samples of one material (its zone axes and thicknesses) are not independent draws.
    """
    out: dict[str, Any] = {}
    for method in methods_present(records, [target])[target]:
        out[method] = {}
        materials = _materials(records, target, method)
        held = next(r["metrics"][target][method] for r in records if method in r["metrics"][target])
        for view in (v for v in AGGREGATED_VIEWS if v in held):
            out[method][view] = {m.name: _interval(_values(records, target, method, view, m.name), materials, cfg)
                                 for m in in_view(view)}
    return out


def headline_of(aggregates: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, float | None]]]]:
    """headline[target][method][view] = {metric: mean over samples} of every image metric in every
    view, and the network's ``level`` = {"level_error": mean, "level_error_median": median}: what the
    closing lines and a published card print (`views.headline_scores` reads it)."""
    def views(entry: dict[str, Any]) -> dict[str, dict[str, float | None]]:
        out = {v: {k: entry[v][k]["value"] for k in IMAGE_METRICS}
               for v in AGGREGATED_VIEWS if v in entry and v != LEVEL}
        if LEVEL in entry:
            level = entry[LEVEL]["level_error"]
            out[LEVEL] = {"level_error": level["value"], "level_error_median": level["median"]}
        return out
    return {t: {m: views(v) for m, v in per_target.items()} for t, per_target in aggregates.items()}


def class_aggregates(records: list[dict], target: str, cfg: EvaluationConfig) -> dict[str, Any]:
    """by_class[element class][method][view][metric], as `aggregate`, for each element class
    (`scoring.ELEMENT_CLASSES`) that holds samples: what the per-class verdicts are decided on."""
    return {name: aggregate(rows, target, cfg) for name in ELEMENT_CLASSES
            if (rows := [r for r in records if r.get("element_class") == name])}


def subset_aggregates(records: list[dict], target: str, cfg: EvaluationConfig) -> dict[str, tuple[dict, dict]]:
    """{subset method: (`aggregate`, `class_aggregates`) of only the records it was scored on} for each
    method with a subset rule (`methods.Method.subset`) present: the network's scores on the same
    samples, which its verdict is decided on."""
    out = {}
    for m in REGISTRY:
        rows = [r for r in records if m.subset is not None and m.name in r["metrics"][target]]
        if rows:
            out[m.name] = (aggregate(rows, target, cfg), class_aggregates(rows, target, cfg))
    return out


def _interval(values: list[float | None], materials: list[str], cfg: EvaluationConfig) -> dict[str, Any]:
    ci = M.bootstrap_ci(values, n_resamples=cfg.n_bootstrap, level=cfg.ci_level, seed=cfg.seed,
                        groups=materials).as_dict()
    finite = [v for v in values if v is not None and math.isfinite(v)]
    ci["median"] = float(np.median(finite)) if finite else None
    return ci


def breakdown(records: list[dict], target: str, key: str, cfg: EvaluationConfig) -> dict[str, Any]:
    """groups[value][method] = {metric: mean over the group's samples (headline view), "n": count}."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(str(r[key]), []).append(r)
    table = {}
    for name in sorted(groups):
        rows = groups[name]
        table[name] = {"n": len(rows)}
        for method in methods_present(rows, [target])[target]:
            table[name][method] = {m.name: _mean_finite(_values(rows, target, method, HEADLINE, m.name))
                                   for m in in_view(HEADLINE)}
    return table


def network_vs_reference(records: list[dict], target: str, cfg: EvaluationConfig) -> dict[str, Any]:
    """Where the network beats the reference method (`methods.reference`: iCoM; lower relative L2,
    headline view), overall, per element class (`scoring.ELEMENT_CLASSES`) and per thickness class:
    metrics.json's `VERSUS`."""
    ref = reference().name

    def summary(rows: list[dict]) -> dict[str, Any]:
        both = [(r["metrics"][target][NETWORK][HEADLINE]["rel_l2"],
                 r["metrics"][target][ref][HEADLINE]["rel_l2"]) for r in rows if ref in r["metrics"][target]]
        pairs = [(n, i) for n, i in both if _finite(n) and _finite(i)]  # a missing value is no win and no loss
        if not pairs:
            return {"n": 0, "network_wins": 0, "win_rate": None, "mean_rel_l2_gap": None, "n_missing": len(both)}
        wins = sum(1 for n, i in pairs if n < i)
        return {"n": len(pairs), "network_wins": wins, "win_rate": wins / len(pairs),
                "mean_rel_l2_gap": _mean_finite([i - n for n, i in pairs]), "n_missing": len(both) - len(pairs)}

    out: dict[str, Any] = {"overall": summary(records)}
    for key in ("element_class", "thickness_class"):
        groups: dict[str, list[dict]] = {}
        for r in records:
            # a record without the key (one made by hand) is "unknown", as one whose elements are unknown
            groups.setdefault(str(r.get(key, "unknown")), []).append(r)
        out[key] = {name: summary(rows) for name, rows in sorted(groups.items())}
    return out


def compute_seconds(records: list[dict]) -> dict[str, dict[str, float]]:
    """seconds[method] = {mean, median, max, total, n} of the per-sample compute times."""
    out = {}
    for method in (m.name for m in REGISTRY if m.timed):
        values = [r["seconds"][method] for r in records if r["seconds"].get(method) is not None]
        if values:
            out[method] = {"mean": float(np.mean(values)), "median": float(np.median(values)),
                           "max": float(np.max(values)), "total": float(np.sum(values)), "n": len(values)}
    return out


def worst_records(records: list[dict], target: str, k: int) -> list[dict]:
    """The ``k`` records with the largest network relative L2 (headline view) on ``target`` (missing values last)."""
    def err(r: dict) -> float:
        v = r["metrics"][target][NETWORK][HEADLINE]["rel_l2"]
        return v if _finite(v) else -math.inf
    return sorted(records, key=err, reverse=True)[:k]


def methods_present(records: list[dict], targets: list[str]) -> dict[str, list[str]]:
    """{target: the names of the methods scored on it, in the registry's order}."""
    return {t: [m.name for m in REGISTRY if any(m.name in r["metrics"][t] for r in records)] for t in targets}


def _mean_finite(values: list[float | None]) -> float | None:
    finite = [v for v in values if _finite(v)]
    return float(np.mean(finite)) if finite else None


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def missing_metrics(records: list[dict], targets: list[str]) -> list[str]:
    """One sentence per (target, method) whose headline metrics are missing (None or NaN: an undefined
    value, e.g. of a map with no contrast) for some samples: those samples are left out of that
    metric's mean, interval and verdict, and the sentence says so (`namsa evaluate` prints each as a
    warning)."""
    notes = []
    for target in targets:
        for method in methods_present(records, [target])[target]:
            rows = [r["metrics"][target][method][HEADLINE] for r in records if method in r["metrics"][target]]
            gaps = {m: sum(1 for row in rows if row.get(m) is None or math.isnan(row[m])) for m in IMAGE_METRICS}
            named = [f"{m} for {n}" for m, n in gaps.items() if n]
            if named:
                notes.append(f"{target}: the {method} scores have no value of {', '.join(named)} of {len(rows)} "
                             f"samples; those are reported as missing and left out of the means and the verdict")
    return notes
