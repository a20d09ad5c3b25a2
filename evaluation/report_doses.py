"""The report's section on shot-noised data (`evaluation.dose_sweep`): each method's error at each
electron dose, with the verdict against the reference method (`methods.reference`: iCoM) on that same
noisy data."""
from __future__ import annotations

from typing import Any

from .html_parts import ci, esc, table
from .methods import REGISTRY, reference
from .views import HEADLINE


def dose_section(doc: dict[str, Any]) -> str:
    """"" when the evaluation ran without ``evaluation.doses``."""
    sweep = doc.get("dose_sweep") or []
    if not sweep:
        return ""
    parts = ["<h2>On shot-noised patterns</h2><p class='note'>Every evaluated sample again, its patterns replaced "
             "by Poisson counts at each dose (electrons/Å²; the same noise for every method, fixed by the seed). "
             "Relative L2 under the field's rule, mean over samples with its material-level interval; the verdict is "
             f"the headline's rule, decided on this noisy data. Not run here: {esc(_left_out())}.</p>"]
    ref = reference()
    for target in doc["targets"]:
        # the methods the sweep scored (`methods.Method.dose_sweep`), in the tables' order
        methods = [m for m in REGISTRY
                   if m.dose_sweep and any(m.name in e["aggregates"].get(target, {}) for e in sweep)]
        rows = []
        for entry in sweep:
            agg = entry["aggregates"].get(target, {})
            verdict = entry["verdicts"].get(target, {}).get(ref.name, {}).get("overall_sentence", "–")
            rows.append([f"{entry['dose_e_per_A2']:g}"]
                        + [ci(agg.get(m.name, {}).get(HEADLINE, {}).get("rel_l2")) for m in methods] + [esc(verdict)])
        parts.append(f"<h3>{esc(target)}</h3>" + table(["dose (e/Å²)"] + [m.label for m in methods]
                                                       + [f"against {ref.short_label}"], rows, left=1))
    return "\n".join(parts)


def _left_out() -> str:
    """The costly methods the sweep leaves out (`methods.Method.dose_sweep`), by their short names."""
    return ", ".join(m.short_label for m in REGISTRY if not m.dose_sweep)
