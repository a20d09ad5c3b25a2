"""``report.html``: the evaluation written for a person (plain HTML, images referenced relatively).

Read in one screen first (`report_top`), per target: the verdict against each baseline overall and per
element class (`verdict.all_verdicts`: the one rule for "beats"), one picture of truth / network / best
baseline for a typical and the worst sample, and one chart of each method's error per element class.
Then the tables that hold their numbers: the headline under the field's rule (every method in its own
physical units with only its mean set to the truth's), the network's level error, the headline per
element class, the structure-only and legacy-rule tables (`report_views`); the shot-noise sweep,
compute times, where the network beats iCoM (`report_versus`), breakdowns by material / zone axis /
element class / heaviest element / thickness, the other figures, the worst cases, materials, training,
conventions, every sample; and last what was trained on what (model card, data manifest).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from . import figures
from .card_view import card_rows, text
from .config import EvaluationConfig
from .html_parts import ci as _ci, esc as _e, figure as _figure, num as _num, table as _table
from .material_ids import describe_material
from .methods import ALL_TARGETS, baselines, method, names
from .metric_registry import metric as metric_record
from .report_doses import dose_section
from .report_samples import materials_section, samples_section, worst_section
from .report_top import top_section
from .report_versus import one_group, versus_section
from .report_views import views_section
from .views import HEADLINE

#: record fields the breakdown tables group by, with their headings.
BREAKDOWN_KEYS: dict[str, str] = {
    "material_id": "material",
    "zone_axis": "zone axis",
    "element_class": "element class",
    "heaviest_element": "heaviest element",
    "thickness_class": "thickness",
}
PANEL_CAPTION = (
    "One held-out sample. Top: three CBED patterns of its scan (log10 of the intensity, the incident probe "
    "carrying 1; scale bar in mrad). Bottom: the true map, the network's and each baseline's in its own units "
    "with only its mean set to the truth's (the field's rule; its relative L2 in the title) on one colour range "
    "that holds every map, and the network's error in that view; scale bars in Å over the scanned field of view.")
LEARNING_CURVES_CAPTION = (
    "Training metrics CSV: losses and learning rate. train_loss is the Huber data loss on standardised targets, "
    "dev_loss the MSE on the dev split's standardised targets (it picks the exported checkpoint), and l2_loss the "
    "weight-decay term 0.5 * weight_decay * sum(w^2) that the optimiser adds to train_loss: it measures the "
    "size of the weights, not an error, and is 0 with adamw or weight_decay 0. A dev_loss that stays flat "
    "while train_loss falls means the network is fitting the training samples, not learning to generalise.")

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; max-width: 100%; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f0f0f0; } td.l, th.l { text-align: left; } th.s { background: #e4e4e4; }
code { overflow-wrap: anywhere; font-family: ui-monospace, monospace; font-size: 0.95em; } p, li, td { overflow-wrap: break-word; }
img { max-width: 100%; height: auto; margin: 0.3em 0; } .note { color: #555; font-size: 0.9em; }
figure { margin: 0.6em 0; max-width: 100%; } .figs { display: flex; flex-wrap: wrap; gap: 0 1.5em; align-items: flex-start; }
td.best { font-weight: bold; background: #eef6ee; }
"""


def _compute_times(doc: dict[str, Any]) -> str:
    """One line per method: compute time per sample."""
    times = doc.get("compute_seconds", {})
    if not times:
        return ""
    lines = "".join(f"<li>{_e(method(m).label)}: compute time per sample {_num(t['mean'], 3)} s "
                    f"(median {_num(t['median'], 3)} s, {t['n']} samples)</li>" for m, t in times.items())
    return (f"<p><b>Compute time per sample</b> <span class='note'>({_e(doc['conventions'].get('compute_seconds', ''))})"
            f"</span></p><ul>{lines}</ul>")


def _data_section(doc: dict[str, Any]) -> str:
    """What was trained on what: the model card, then the data manifest (the page's last table)."""
    data = doc["data"]
    counts = data.get("counts", {})
    mats = data.get("materials", {})
    rows = [[_e(s), _num(counts.get(s, 0)), _e(", ".join(mats.get(s, [])) or "–")] for s in ("train", "dev", "test")]
    arrays = "; ".join(f"{name} {' × '.join(str(v) for v in a.get('shape', []))} {_dtype(a.get('dtype'))}"
                       for name, a in (data.get("arrays") or {}).items())
    card = doc.get("model_card")
    return "\n".join([
        "<h2>What was trained on what</h2>",
        f"<p>Model: <code>{_e(doc['model_dir'])}</code>. Evaluated split: <b>{_e(data['evaluated_split'])}</b> "
        f"({_split_note(data['evaluated_split'])}).</p>",
        "<h3>Model card</h3>",
        _card_table(card) if card else "<p>No model card found.</p>",
        "<h3>Data manifest</h3>",
        _table(["split", "samples", "materials (ids explained under Materials)"], rows, left=3),
        f"<p class='note'>stores: {_e(', '.join(data.get('stores', [])))}; physics config hash "
        f"{_e(data.get('config_hash'))}; arrays per sample: {_e(arrays or '–')}</p>",
    ])


def _dtype(code: Any) -> str:
    """A numpy dtype code as its name ("<f2" -> "float16")."""
    import numpy as np

    try:
        return np.dtype(code).name
    except TypeError:
        return str(code or "")


def _card_table(card: dict[str, Any]) -> str:
    """The model card's rows under a heading row per section (architecture, training data, ...), the
    chain of runs that made the weights (`_chain_row`) last among the training result's."""
    rows, chain = card_rows(card), _chain_row(card)
    if chain:
        rows.insert(max((i + 1 for i, r in enumerate(rows) if r[0] == chain[0]), default=len(rows)), chain)
    body, section = [], None
    for name, label, value in rows:
        if name != section:
            body.append(f"<tr><th class='l s' colspan='2'>{_e(name)}</th></tr>")
            section = name
        body.append(f"<tr><td class='l'>{_e(label)}</td><td class='l'>{_e(value)}</td></tr>")
    return f"<table class='card'>{''.join(body)}</table>"


def _chain_row(card: dict[str, Any]) -> tuple[str, str, str] | None:
    """The card's ``training.lineage`` in one row: links, steps in all and the links' training samples summed,
    then each link's name, samples, steps, device and date; None for a card without a chain."""
    links = (card.get("training") or {}).get("lineage") or []
    if not links:
        return None

    def total(key: str) -> str:
        values = [link.get(key) for link in links]
        return text(sum(values)) if all(isinstance(v, int) for v in values) else "unknown"
    each = "; ".join(f"{link.get('name') or 'unnamed'}: {text(link.get('train_samples'))} samples, "
                     f"{text(link.get('steps'))} steps, {link.get('device') or '?'}, "
                     f"{link.get('date') or 'date unknown'}" for link in links)
    return ("training result", "chain of runs (first to last)",
            f"{len(links)} links, {total('steps')} steps in all, {total('train_samples')} training samples summed over "
            f"the links (a sample two links trained on counts twice): {each}")


def _split_note(split: str) -> str:
    """Whether the evaluated materials were held out from training."""
    if split in ("dev", "test"):
        return "splits are assigned per material, so these materials were never seen in training"
    if split == "all":
        return "every split, training materials included: this is not a held-out figure"
    return "the training materials themselves: this is not a held-out figure"


def _breakdown_section(doc: dict[str, Any], target: str) -> str:
    """One table per grouping; a grouping with a single group is one sentence (a one-row table, or a
    one-bin breakdown, says nothing the headline does not)."""
    parts = [f"<h2>Breakdowns ({_e(target)}, field's rule)</h2>"]
    for key, title in BREAKDOWN_KEYS.items():
        table = doc["breakdowns"][target].get(key, {})
        if len(table) == 1:
            parts.append(one_group(title, *next(iter(table.items())), "the headline table above"))
            continue
        methods = [m for m in names() if any(m in g for g in table.values())]
        extra = ["formula", "prototype"] if key == "material_id" else []
        # one cell per method, "rel L2 / SSIM": two columns per method would not fit a 1024 px window.
        header = [title] + extra + ["n"] + [f"{method(m).label}<br>rel L2 / SSIM" for m in methods]
        rows = [[_e(name)] + _material_cells(doc, name, extra) + [_num(g["n"])]
                + [f"{_num(g.get(m, {}).get('rel_l2'))} / {_num(g.get(m, {}).get('ssim'))}" for m in methods]
                for name, g in table.items()]
        parts.append(f"<h3>By {title}</h3>" + _table(header, rows, left=1 + len(extra)))
    return "\n".join(parts)


def _material_cells(doc: dict[str, Any], material: str, extra: list[str]) -> list[str]:
    """Formula and prototype of ``material`` when ``extra`` asks for them."""
    if not extra:
        return []
    formula = next((r.get("formula", "") for r in doc["samples"] if r["material_id"] == material), "")
    d = describe_material(material, formula)
    return [_e(d["formula"]), _e(d["prototype"])]


def _absent_figure(doc: dict[str, Any], name: str, metric: str, target: str) -> str:
    """In words, the figure `figures.draw_all` left out because every sample has the same value."""
    if name in doc["figures"]:
        return ""
    if metric == "thickness_A":
        values = {_num(r["thickness_A"]) for r in doc["samples"]}
        return f"<p class='note'>No thickness plot: every sample has thickness {_e(', '.join(values))} Å.</p>"
    values = {m: {_num(r["metrics"][target][m][HEADLINE].get(metric)) for r in doc["samples"]
                  if m in r["metrics"][target]} for m in names()}
    said = "; ".join(f"{method(m).label} {', '.join(sorted(v))}" for m, v in values.items() if v)
    return f"<p class='note'>No {_e(metric)} histogram: one value per method ({_e(said)}).</p>"


def _figures_section(doc: dict[str, Any], target: str) -> str:
    parts = [f"<h2>Figures ({_e(target)})</h2><div class='figs'>",
             _figure(doc, f"hist_rel_l2_{target}", "Relative L2 error per sample, per method (field's rule)."),
             _figure(doc, f"hist_ssim_{target}", "SSIM per sample, per method (field's rule)."), "</div>",
             _absent_figure(doc, f"hist_rel_l2_{target}", "rel_l2", target),
             _absent_figure(doc, f"hist_ssim_{target}", "ssim", target),
             _figure(doc, f"thickness_{target}", "Relative L2 (field's rule) against specimen thickness "
                                                 "(marker: element class)."),
             _absent_figure(doc, f"thickness_{target}", "thickness_A", target)]
    for name in sorted(n for n in doc["figures"] if n.startswith("sample_") and n.endswith(f"_{target}")):
        parts.append(_figure(doc, name, PANEL_CAPTION))
    return "\n".join(parts)


def _conventions(doc: dict[str, Any]) -> str:
    items = "".join(f"<li><b>{_e(k)}</b>: {_e(text(v))}</li>"
                    for k, v in doc["conventions"].items())
    fitted = ", ".join(m.short_label for m in baselines() if m.legacy_fitted)
    return ("<h2>How the numbers are computed</h2><p>Baselines, each a map in physical units as the network's is:</p>"
            f"<ul>{_baseline_items()}</ul><p>Under the field's rule (the headline and the verdicts) every map keeps "
            "its units and only its mean is set to the truth's; the structure view fits one least-squares scale and "
            f"offset to the truth for every method; the legacy rule fitted them to {_e(fitted)} only.</p>"
            f"<ul>{items}</ul>")


def _baseline_items() -> str:
    """Every baseline of the registry as a list item: its label, what it is, its targets when it makes
    maps of fewer than all, and its switch when it is off by default."""
    default = EvaluationConfig()
    return "".join(f"<li><b>{_e(m.label)}</b>: {_e(m.description)}"
                   + ("" if m.targets == ALL_TARGETS else f"; {_e(', '.join(m.targets))} only")
                   + ("" if m.enabled(default) else f" (off by default: evaluation.{_e(m.switch)})") + "</li>"
                   for m in baselines())


def _learning_caption(doc: dict[str, Any]) -> str:
    """The learning-curve caption; it names a constant learning rate, which gets no panel of its own."""
    csv = doc.get("train_metrics_csv")
    lr = figures.constant_learning_rate(Path(csv)) if csv and Path(csv).is_file() else None
    return LEARNING_CURVES_CAPTION + ("" if lr is None else f" The learning rate was constant at {lr:g} "
                                      "throughout, so it has no panel.")


def render(doc: dict[str, Any]) -> str:
    """The report as one HTML string: what a reader needs first (`report_top`) above every table."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>namsa evaluation</title>"
             f"<style>{_STYLE}</style></head><body>",
             "<h1>Reconstruction evaluation</h1>",
             f"<p class='note'>written {_e(doc['created'])}; {len(doc['samples'])} samples of the "
             f"'{_e(doc['data']['evaluated_split'])}' split; targets {_e(', '.join(doc['targets']))}.</p>"]
    parts += [top_section(doc, t) for t in doc["targets"]]
    parts += [views_section(doc, t) for t in doc["targets"]]
    parts += [dose_section(doc), _compute_times(doc), versus_section(doc)]
    for t in doc["targets"]:
        parts += [_breakdown_section(doc, t), _figures_section(doc, t), worst_section(doc, t)]
    parts.append(materials_section(doc))
    if "learning_curves" in doc["figures"]:
        parts.append("<h2>Training</h2>" + _figure(doc, "learning_curves", _learning_caption(doc)))
    parts.append(_conventions(doc))
    parts += [samples_section(doc, t) for t in doc["targets"]]
    parts.append(_data_section(doc))
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


def write_report(path: Path, doc: dict[str, Any]) -> Path:
    """Write ``render(doc)`` to ``path`` atomically; returns the path."""
    return write_html(path, render(doc))


def write_html(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; returns the path."""
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def render_scaling(summary: dict[str, Any], out_dir: Path) -> str:
    """The learning-curve report of `scaling_study` (``summary`` as in its scaling.json) as HTML:
    the figure, every size's error against the baselines, and a link to each size's own report."""
    target, metric = summary["target"], summary["metric"]
    methods = [m for m in names() if m in summary["rows"][-1][target]]
    rows = []
    for row in summary["rows"]:
        link = Path(row["eval_dir"]) / "report.html"
        rel = link.relative_to(out_dir) if link.is_relative_to(out_dir) else link
        rows.append([f"{row['n_train']:,}", f"{row['fraction']:.4g}", _num(row.get("steps"))]
                    + [_ci(row[target].get(m)) for m in methods] + [f"<a href='{_e(rel)}'>report</a>"])
    figure = Path(summary["figure"])
    rel_figure = figure.relative_to(out_dir) if figure.is_relative_to(out_dir) else figure
    return "\n".join([
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>namsa learning curve</title>"
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>Learning curve: held-out {_e(target)} {_e(metric_record(metric).row_label)} against training-set "
        "size</h1>",
        f"<p class='note'>The same model and schedule trained on nested subsets of the {summary['n_train_total']:,} "
        "training samples (the first n in store order), each evaluated on the same held-out split; mean over "
        "samples with its bootstrap interval. The baselines do not depend on the training-set size (the mean "
        "training target is taken over the whole training split).</p>",
        _figure({"figures": {"curve": str(rel_figure)}}, "curve", "Test error against training-set size."),
        _table(["training samples", "fraction", "steps"] + [method(m).label for m in methods] + ["evaluation"],
               rows, left=1),
        "</body></html>"])
