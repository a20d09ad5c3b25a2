"""The top of report.html, what a reader sees in one screen before any table: per target the verdict
against each judged baseline (`verdict.all_verdicts`, overall then per element class), one picture of
truth / network / best baseline for a typical and the worst sample (`figures.overview`) and one chart of
each method's error per element class (`figures.class_chart`). Captions stay short: the tables below
hold the numbers and the conventions."""
from __future__ import annotations

from typing import Any

from .figures import best_baseline
from .html_parts import esc, figure
from .methods import method
from .scoring import ELEMENT_CLASSES

#: the element classes in words, from their one definition (`scoring.ELEMENT_CLASSES`).
CLASSES_IN_WORDS = " and ".join(ELEMENT_CLASSES)


def top_section(doc: dict[str, Any], target: str) -> str:
    """Verdict, picture and chart of ``target``; the tables below give their numbers."""
    return "\n".join([f"<h2>Verdict: {esc(target)}</h2>", verdicts(doc, target),
                      "<div class='figs'>", _overview(doc, target), _chart(doc, target), "</div>"])


def verdicts(doc: dict[str, Any], target: str) -> str:
    """The verdict against each baseline, overall and per element class, as `verdict.all_verdicts`
    decided it (the CLI prints the same sentences)."""
    found = doc.get("verdicts", {}).get(target, {})
    if not found:
        return "<p>No baseline to compare with.</p>"
    items = "".join(f"<li>{_mark(v)} {esc(v.get('overall_sentence', v['sentence']))}{_class_items(v)}</li>"
                    for v in found.values())
    level = int(round(doc["config"]["ci_level"] * 100))
    return (f"<p class='note'>Field's rule (headline table below); \"beats\" only when better on every headline "
            f"metric with non-overlapping {level}% intervals over materials.</p><ul>{items}</ul>")


def _mark(v: dict[str, Any]) -> str:
    return "✔" if v["beats"] else ("–" if v.get("status") == "absent" else "✘")


def _class_items(v: dict[str, Any]) -> str:
    """The per-class verdicts of one baseline as a nested list ("" when there are none)."""
    classes = v.get("by_class") or {}
    if not classes:
        return ""
    return "<ul>" + "".join(f"<li>{_mark(c)} {esc(c['sentence'])}</li>" for c in classes.values()) + "</ul>"


def _overview(doc: dict[str, Any], target: str) -> str:
    """The picture, or why there is none."""
    name = f"overview_{target}"
    baseline = best_baseline(doc["aggregates"][target])
    if name not in doc["figures"]:
        why = ("no judged baseline was scored on every sample" if baseline is None
               else "no sample's maps were kept (evaluation.n_panels and evaluation.worst_k are 0)")
        return f"<p class='note'>No picture of the maps: {why}.</p>"
    return figure(doc, name, (
        f"Truth, network and the best baseline ({method(baseline).label}: lowest mean relative L2 of the judged "
        f"baselines), field's rule, one colour range per row. Top: a typical sample (of those drawn, network "
        f"error nearest the median of all {len(doc['samples'])}); below: the worst."))


def _chart(doc: dict[str, Any], target: str) -> str:
    level = int(round(doc["config"]["ci_level"] * 100))
    return figure(doc, f"class_chart_{target}", (
        f"Mean relative L2 (field's rule; lower is better) per method, over all samples and per element class "
        f"({CLASSES_IN_WORDS}), with {level}% bootstrap intervals over materials; numbers in the per-class table."))
