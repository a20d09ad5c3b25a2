"""The report's score tables, one per view (`evaluation.views`): the field's rule first (the headline,
best method in bold, what the verdict is decided on), the network's level error and the headline per
element class, then the structure view and the legacy rule, neither with a "best": their figures take
numbers from the truth."""
from __future__ import annotations

from typing import Any

from .html_parts import ci, esc, num, table
from .methods import NETWORK, baselines, method, names
from .metric_registry import Metric, in_report_order, judged
from .verdict import study_reference
from .views import FIELD, HEADLINE, LEGACY, LEVEL, STRUCTURE, VIEW_TITLES

#: what each view's table says under it.
VIEW_NOTES: dict[str, str] = {
    FIELD: ("Every map in its own physical units (the network's as predicted, iCoM calibrated by the detector "
            "sampling, ptychography's phase over the interaction constant), with only its mean replaced by the "
            "truth's: a uniform phase changes no diffraction intensity, so no method can read a map's mean from the "
            "data, and the field compares reconstructions after removing it. Nothing else is taken from the truth. "
            "<b>The verdicts at the top of the page are decided on this table</b> ({used}). Column position error and columns found "
            "are shown, not used."),
    STRUCTURE: ("One least-squares scale (≥ 0) and offset fitted to the truth per sample for every method, the "
                "network included: structure only, two numbers from the truth, which no microscopist has. "
                "<b>Not used by the verdict</b>; no method is marked best. The fitted scale's mean is shown "
                "(median in metrics.json): far from 1, the method's own units were off."),
    LEGACY: ("The rule of the headline before issue 30, kept so that older figures can be compared: the network "
             "(and the mean image) as predicted, iCoM and the ptychographies least-squares scaled and offset to "
             "the truth (two numbers from the truth for the baselines, none for the network). "
             "<b>Not used by the verdict</b>; no method is marked best."),
}


def views_section(doc: dict[str, Any], target: str) -> str:
    """The field's table, the network's level error, where the study flagship stands (`verdict.study_reference`)
    and the field's table per element class, then the other views'."""
    study = study_reference(target)
    parts = [f"<h2>Headline: {esc(target)}, {esc(VIEW_TITLES[HEADLINE])}</h2>", view_table(doc, target, HEADLINE),
             level_line(doc, target), f"<p class='note'>{esc(study)}</p>" if study else "", class_table(doc, target)]
    for view in (STRUCTURE, LEGACY):
        parts.append(f"<h3>{esc(target)}: {esc(VIEW_TITLES[view])}; not used by the verdict</h3>"
                     + view_table(doc, target, view))
    return "\n".join(p for p in parts if p)


def view_table(doc: dict[str, Any], target: str, view: str) -> str:
    """Every method's mean [interval] of each metric in ``view``; best method in bold in the headline only."""
    agg = doc["aggregates"][target]
    methods = [m for m in names() if m in agg and view in agg[m]]
    if not methods:
        return ""
    metrics = [k for k in in_report_order() if k.name in agg[methods[0]][view]]   # what this file holds
    rows = []
    for k in metrics:
        best = _best(agg, methods, k) if view == HEADLINE else None
        rows.append([k.row_label] + [f"<b>{ci(agg[m][view][k.name])}</b>" if m == best else ci(agg[m][view][k.name])
                                     for m in methods])
    n = agg[methods[0]][view]["rel_l2"]["n"]
    level = int(doc["config"]["ci_level"] * 100)
    used = ", ".join(k.row_label for k in judged())
    note = (f"<p class='note'>{n} samples; mean over samples with a {level}% bootstrap interval over materials in "
            f"brackets{'; best method in bold' if view == HEADLINE else ''}. "
            f"{esc('; '.join(_missing_methods(doc, agg)))}</p>")
    return (table(["metric"] + [method(m).label for m in methods], rows) + note
            + f"<p class='note'>{VIEW_NOTES[view].format(used=esc(used))}</p>")


def level_line(doc: dict[str, Any], target: str) -> str:
    """The network's level error (median and mean), said with no verdict; "" when it was not scored."""
    entry = ((doc["aggregates"][target].get(NETWORK) or {}).get(LEVEL) or {}).get("level_error") or {}
    if entry.get("value") is None:
        return ""
    return (f"<p><b>The network's level error</b> |mean(pred) − mean(truth)| / |mean(truth)|: median "
            f"{num(entry.get('median'))}, mean {ci(entry)} over {entry['n']} samples. The field's rule hands every "
            "method the truth's mean, and no baseline estimates it (a uniform phase changes no intensity): this is "
            "the network's own figure, with no verdict and nothing to be best against.</p>")


def class_table(doc: dict[str, Any], target: str) -> str:
    """Relative L2 [interval over materials] of every method in each element class (headline view): the
    numbers of the per-class verdicts and of the error chart at the top."""
    classes = (doc.get("class_aggregates") or {}).get(target) or {}
    if not classes:
        return ""
    methods = [m for m in names() if any(m in agg for agg in classes.values())]
    rows = [[esc(name), num(agg[NETWORK][HEADLINE]["rel_l2"]["n"]), num(agg[NETWORK][HEADLINE]["rel_l2"].get("n_groups"))]
            + [ci(agg[m][HEADLINE]["rel_l2"]) if m in agg else "–" for m in methods]
            for name, agg in classes.items()]
    return (f"<h3>{esc(target)}: {esc(VIEW_TITLES[HEADLINE])}, per element class</h3>"
            + table(["element class", "samples", "materials"] + [f"{method(m).label}<br>rel L2" for m in methods],
                    rows, left=1))


def _best(agg: dict[str, Any], methods: list[str], metric: Metric) -> str | None:
    """The method with the best headline-view mean on ``metric`` (None when none has a value, the
    metric has no better direction, or its figure takes a number from the truth)."""
    if metric.from_truth or metric.better is None:
        return None
    known = {m: v for m in methods if (v := agg[m][HEADLINE].get(metric.name, {}).get("value")) is not None}
    if not known:
        return None
    return (max if metric.better == "higher" else min)(known, key=known.get)


def _missing_methods(doc: dict[str, Any], agg: dict[str, Any]) -> list[str]:
    """Why each baseline missing from the table is missing (its record's `missing_note`, with the
    reason metrics.json's ``absent_baselines`` gives for it)."""
    absent = doc.get("absent_baselines") or {}
    return [m.missing_note.format(why=absent.get(m.name, "not computed")) for m in baselines()
            if m.name not in agg and m.missing_note]
