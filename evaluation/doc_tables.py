"""docs/evaluation.md's two generated tables, rendered from the registries: every method
(`methods.REGISTRY`) and every metric (`metric_registry.METRICS`). The page holds each between markers
(`BEGIN` / `END`), and tests/test_registry_derived.py fails when the page differs from what is rendered
here (its message prints the table to paste), so the page never lists fewer methods or metrics than run."""
from __future__ import annotations

from .config import EvaluationConfig
from .methods import ALL_TARGETS, REGISTRY, Method
from .metric_registry import METRICS, Metric, in_report_order
from .views import LEVEL, VIEWS

#: the markers around a generated table on the page, by the table's name.
BEGIN = "<!-- {name}: generated from the registry, do not edit by hand -->\n"
END = "<!-- end of {name} -->"


def method_table() -> str:
    """Markdown: one row per method, in the tables' order."""
    default = EvaluationConfig()
    rows = [_row([f"**{m.label}**", f"`{m.name}`", _md(m.description), _targets(m), _switch(m, default),
                  m.requires.package if m.requires else "–", _verdict(m), "yes" if m.dose_sweep else "–",
                  "yes" if m.timed else "–"]) for m in REGISTRY]
    head = ["method", "metrics.json key", "what it is", "maps of", "asked for by", "needs", "verdict",
            "dose sweep", "timed"]
    return _table(head, rows)


def metric_table() -> str:
    """Markdown: one row per metric, in the report's order."""
    rows = [_row([m.row_label, f"`{m.name}`", _views(m), _better(m), _md(m.definition)])
            for m in in_report_order(METRICS)]
    return _table(["metric", "key", "views", "better", "definition and conventions"], rows)


def _targets(m: Method) -> str:
    return "every target" if m.targets == ALL_TARGETS else ", ".join(m.targets)


def _switch(m: Method, default: EvaluationConfig) -> str:
    """Its switch and whether a default configuration asks for it."""
    if m.switch is None:
        return "always"
    return f"`evaluation.{m.switch}` ({'on' if m.enabled(default) else 'off'} by default)"


def _verdict(m: Method) -> str:
    """Whether the verdict judges the network against it, and whether it is the reference."""
    if m.is_reference:
        return "judged; the reference (sample by sample, at each dose)" if m.judged else "the reference"
    return "judged" if m.judged else "–"


def _views(m: Metric) -> str:
    if m.views == (LEVEL,):
        return "the network's own (`level`)"
    return "every view" if set(VIEWS) <= set(m.views) else ", ".join(f"`{v}`" for v in m.views)


def _better(m: Metric) -> str:
    judged = "; judged" if m.judged else ""
    return f"{m.better}{judged}" if m.better else "neither"


def _md(text: str) -> str:
    """``text`` safe in a table cell: a pipe would end the cell, an asterisk start emphasis."""
    return text.replace("|", "\\|").replace("*", "\\*")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(head: list[str], rows: list[str]) -> str:
    return "\n".join([_row(head), "|" + "---|" * len(head), *rows]) + "\n"
