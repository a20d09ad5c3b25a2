"""PNG figures of the evaluation: the report's overview picture and error chart, histograms, error
against thickness, learning curves and the learning-curve study's plot (matplotlib's object API on the
Agg canvas: no pyplot state). Maps and CBED patterns are drawn by `evaluation.map_figures` (extent in
Angstrom, scale bars, patterns in mrad), whose legibility rules every figure here follows: no figure
wider than ``MAX_WIDTH_IN``, no text under ``MIN_FONT_PT``. A panel that would carry no information (a
constant learning rate, a histogram of one value) is not drawn; the report says it in words instead.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from matplotlib.figure import Figure

from .aggregation import aggregate, class_aggregates
from .map_figures import MIN_FONT_PT, overview_figure, sample_panel_figure, save
from .methods import NETWORK, REGISTRY, method, names
from .views import HEADLINE

#: legend text of the training metrics CSV's loss columns (models.training.logs.METRIC_COLUMNS): what each is.
LOSS_LABELS = {
    "train_loss": "train_loss: Huber on standardised targets (data term)",
    "dev_loss": "dev_loss: MSE on standardised targets (held-out dev split)",
    "l2_loss": "l2_loss: weight-decay term 0.5·wd·Σw² (added to train_loss in the objective; not a data error)",
}
#: x columns recognised in the training metrics CSV, first match wins.
STEP_COLUMNS = ("step", "global_step", "iteration", "epoch")
#: the first group of the error chart: every sample, before the element classes.
ALL_SAMPLES = "all samples"


def metric_values(records: list[dict], target: str, metric: str) -> dict[str, list[float]]:
    """{method: finite per-sample values of ``metric``} (headline view) for every method present."""
    series = {m: [r["metrics"][target][m][HEADLINE][metric] for r in records if m in r["metrics"][target]]
              for m in names()}
    return {m: finite for m, vals in series.items() if (finite := [v for v in vals if v is not None and math.isfinite(v)])}


def spread(values: Sequence[float]) -> bool:
    """At least two distinct finite values: a histogram or an axis of them carries information."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return len(finite) > 1 and max(finite) > min(finite)


def error_histograms(path: Path, records: list[dict], target: str, metric: str = "rel_l2") -> Path | None:
    """`error_histograms_figure` saved at ``path``; None (nothing drawn) when every value is the same,
    as one bin says nothing a table row does not."""
    fig = error_histograms_figure(records, target, metric)
    return None if fig is None else save(fig, path)


def error_histograms_figure(records: list[dict], target: str, metric: str = "rel_l2") -> Figure | None:
    """Histogram of one metric (headline view) over samples: one unfilled step outline per method in its
    registry colour on shared bins, so overlapping methods stay apart (filled, half-transparent bars
    blended into one muddy colour); None when every value is the same."""
    finite = metric_values(records, target, metric)
    every = [v for vals in finite.values() for v in vals]
    if not spread(every):
        return None
    fig = Figure(figsize=(5.5, 3.6), layout="constrained")
    ax = fig.subplots()
    bins = np.linspace(min(every), max(every), min(21, len(every) + 1))
    for m, vals in finite.items():
        ax.hist(vals, bins=bins, histtype="step", linewidth=1.8, label=f"{method(m).figure_label} (n={len(vals)})",
                color=method(m).colour)
    ax.set_xlabel(f"{metric} ({target}, field's rule)")
    ax.set_ylabel("samples")
    ax.legend(fontsize=MIN_FONT_PT)
    return fig


def error_vs_thickness(path: Path, records: list[dict], target: str) -> Path | None:
    """Relative L2 against specimen thickness: colour = method, marker = element class
    (`scoring.ELEMENT_CLASSES`); None when every sample has the same thickness (one point on the x axis)."""
    from matplotlib.lines import Line2D

    if not spread([r["thickness_A"] for r in records]):
        return None
    fig = Figure(figsize=(7.5, 3.8), layout="constrained")
    ax = fig.subplots()
    classes = sorted({r["element_class"] for r in records})
    markers = {c: "osd^v"[i % 5] for i, c in enumerate(classes)}
    methods = [m for m in REGISTRY if any(m.name in r["metrics"][target] for r in records)]
    for m in methods:
        for c in classes:
            xy = [(r["thickness_A"], r["metrics"][target][m.name][HEADLINE]["rel_l2"]) for r in records
                  if r["element_class"] == c and m.name in r["metrics"][target]]
            xy = [(t, e) for t, e in xy if t is not None and e is not None]
            if xy:
                ax.scatter(*zip(*xy), color=m.colour, marker=markers[c], s=24, alpha=0.75)
    handles = [Line2D([], [], color=m.colour, marker="o", ls="", label=m.figure_label) for m in methods]
    handles += [Line2D([], [], color="k", marker=markers[c], ls="", label=c) for c in classes]
    ax.legend(handles=handles, fontsize=MIN_FONT_PT, loc="center left", bbox_to_anchor=(1.02, 0.5))
    ax.set_xlabel("thickness (Å)")
    ax.set_ylabel(f"relative L2 ({target}, field's rule)")
    return save(fig, path)


def class_intervals(records: list[dict], target: str, cfg: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """{group: {method: field-view relative L2 {value, low, high, n, ...}}} for `ALL_SAMPLES` and each
    element class: the same `aggregation` calls, hence the same numbers, as metrics.json's
    ``aggregates`` and ``class_aggregates``."""
    return intervals_of(aggregate(records, target, cfg), class_aggregates(records, target, cfg))


def intervals_of(overall: dict[str, Any], by_class: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """`class_intervals` from one target's `aggregation.aggregate` and `aggregation.class_aggregates`."""
    groups = {ALL_SAMPLES: overall, **by_class}
    return {name: {m: entry[HEADLINE]["rel_l2"] for m, entry in agg.items() if HEADLINE in entry}
            for name, agg in groups.items()}


def class_chart(path: Path, intervals: dict[str, dict[str, dict[str, Any]]], target: str) -> Path | None:
    """`class_chart_figure` saved at ``path``; None when no method has a value."""
    fig = class_chart_figure(intervals, target)
    return None if fig is None else save(fig, path)


def class_chart_figure(intervals: dict[str, dict[str, dict[str, Any]]], target: str) -> Figure | None:
    """Mean relative L2 (field's rule) with its bootstrap interval over materials, per method (registry
    colour, side by side) and group (`class_intervals`: every sample, then each element class)."""
    methods = [m for m in REGISTRY if any((g.get(m.name) or {}).get("value") is not None for g in intervals.values())]
    if not methods:
        return None
    fig = Figure(figsize=(4.8, 3.5), layout="constrained")
    ax = fig.subplots()
    step = 0.8 / len(methods)
    for k, m in enumerate(methods):
        xs, ys, lows, highs = [], [], [], []
        for i, group in enumerate(intervals.values()):
            entry = group.get(m.name) or {}
            if entry.get("value") is None:
                continue
            v = entry["value"]
            xs.append(i + (k - (len(methods) - 1) / 2) * step)
            ys.append(v)
            lows.append(v - (entry["low"] if entry.get("low") is not None else v))
            highs.append((entry["high"] if entry.get("high") is not None else v) - v)
        label = m.figure_label + (" (its subset)" if m.subset is not None else "")
        ax.errorbar(xs, ys, yerr=[lows, highs], fmt="o", capsize=3, color=m.colour, label=label)
    ax.set_xticks(range(len(intervals)), [_group_label(name, group) for name, group in intervals.items()],
                  fontsize=MIN_FONT_PT)
    ax.set_ylabel(f"relative L2 ↓ ({target}, field's rule)", fontsize=MIN_FONT_PT)
    ax.tick_params(labelsize=MIN_FONT_PT)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=MIN_FONT_PT, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2, frameon=False)
    return fig


def _group_label(name: str, group: dict[str, dict[str, Any]]) -> str:
    """"light\n(every element\nZ <= 14)\n12 samples": a chart group's tick label, wrapped so that
    neighbours do not overlap."""
    import textwrap

    n = (group.get(NETWORK) or {}).get("n")
    head, _, rest = name.partition(" (")
    lines = [head] + (textwrap.wrap("(" + rest, 15) if rest else [])
    return "\n".join(lines + ([] if n is None else [f"{n} samples"]))


def median_index(records: list[dict], target: str, among: Sequence[int] | None = None) -> int | None:
    """The index of the record (of ``among``, when given) whose network relative L2 (field's rule) is
    nearest the median of every record's; None when none has a value."""
    errors = {r["index"]: v for r in records if _finite(v := r["metrics"][target][NETWORK][HEADLINE]["rel_l2"])}
    pool = [i for i in (errors if among is None else among) if i in errors]
    if not pool:
        return None
    median = float(np.median(list(errors.values())))
    return min(pool, key=lambda i: (abs(errors[i] - median), i))


def best_baseline(per_method: dict[str, Any]) -> str | None:
    """The judged baseline (`methods.Method.judged`) scored on every sample with the lowest mean relative
    L2 under the field's rule in ``per_method`` (one target's aggregates); None when there is none.
    A subset method's mean is over other samples, so it is not compared."""
    known = {m.name: v for m in REGISTRY if m.judged and m.subset is None and m.name in per_method
             and _finite(v := per_method[m.name][HEADLINE]["rel_l2"].get("value"))}
    return min(known, key=known.get) if known else None


def overview(path: Path, records: list[dict], kept: dict[int, dict], target: str, per_method: dict[str, Any],
             worst: Sequence[int]) -> Path | None:
    """Truth, network and `best_baseline` of a typical sample (of those drawn, the one nearest the
    median network error) and of the worst; None when no sample was kept or no baseline was scored."""
    baseline = best_baseline(per_method)
    drawn = [i for i in kept if baseline is not None and baseline in kept[i]["maps"].get(target, {})]
    if not drawn:
        return None
    by_index = {r["index"]: r for r in records}
    worst_i = next((i for i in worst if i in drawn), None)
    typical = median_index(records, target, [i for i in drawn if i != worst_i] or drawn)
    if typical is None:   # no network error has a value: no sample is typical
        return None
    rows = [(f"typical sample (network rel L2 nearest the median, {_median(records, target):.3f})", typical)]
    if worst_i is not None and worst_i != typical:
        rows.append(("worst sample (largest network rel L2)", worst_i))
    return save(overview_figure([(label, kept[i], by_index[i]) for label, i in rows], target, baseline), path)


def _median(records: list[dict], target: str) -> float:
    return float(np.median([v for r in records if _finite(v := r["metrics"][target][NETWORK][HEADLINE]["rel_l2"])]))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def read_metrics_csv(path: Path) -> tuple[str | None, dict[str, np.ndarray]]:
    """(x column, numeric columns) of the training metrics CSV; blank cells become NaN."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    columns: dict[str, list[float]] = {}
    for name in (rows[0].keys() if rows else []):
        try:
            columns[name] = [float(r[name]) if r[name] not in ("", None) else math.nan for r in rows]
        except ValueError:
            continue   # text columns (phase, timestamps) are not curves
    x = next((c for c in STEP_COLUMNS if c in columns), None)
    return x, {k: np.asarray(v) for k, v in columns.items()}


def learning_curves(path: Path, metrics_csv: Path) -> Path:
    """`learning_curves_figure` of ``metrics_csv`` saved as PNG at ``path``."""
    return save(learning_curves_figure(metrics_csv), path)


def constant_learning_rate(metrics_csv: Path) -> float | None:
    """The learning rate when the CSV's learning-rate column never changes, else None."""
    _, cols = read_metrics_csv(metrics_csv)
    values = [v for c in _lr_columns(cols) for v in cols[c] if math.isfinite(v)]
    return values[0] if values and not spread(values) else None


def _lr_columns(cols: dict[str, np.ndarray]) -> list[str]:
    return [c for c in cols if c.lower() in ("lr", "learning_rate") or c.lower().startswith("lr")]


def learning_curves_figure(metrics_csv: Path) -> Figure:
    """Loss columns (log scale) and the learning rate against the step column of the CSV; the
    legend (below the plot) says what each loss is (`LOSS_LABELS`), so the weight-decay term is
    not read as an error. A constant learning rate gets no panel: the title states its value."""
    x_name, cols = read_metrics_csv(metrics_csv)
    n_rows = len(next(iter(cols.values()))) if cols else 0
    x = cols[x_name] if x_name else np.arange(n_rows)
    # train_loss, dev_loss, l2_loss, ... but not bookkeeping such as loss_scale.
    losses = [c for c in cols if c.lower() == "loss" or c.lower().endswith("_loss")]
    constant = constant_learning_rate(metrics_csv)
    lrs = [] if constant is not None else _lr_columns(cols)
    fig = Figure(figsize=(10 if lrs else 7.5, 4.8), layout="constrained")
    axes = fig.subplots(1, 2 if lrs else 1, squeeze=False)[0]
    for c in losses:
        ok = np.isfinite(cols[c])
        if ok.any():
            axes[0].plot(x[ok], cols[c][ok], marker="." if ok.sum() < 30 else None, label=LOSS_LABELS.get(c, c))
    if any(np.nanmin(cols[c]) > 0 for c in losses if np.isfinite(cols[c]).any()):
        axes[0].set_yscale("log")
    axes[0].set_xlabel(x_name or "row")
    axes[0].set_ylabel("loss")
    axes[0].legend(fontsize=MIN_FONT_PT, loc="upper left", bbox_to_anchor=(0.0, -0.2))
    lr_note = "" if constant is None else f" (constant learning rate {constant:g})"
    axes[0].set_title("learning curves" + lr_note, fontsize=10)
    for c in lrs:
        axes[1].plot(x, cols[c], label=c)
        axes[1].set_xlabel(x_name or "row")
        axes[1].set_ylabel("learning rate")
        axes[1].legend(fontsize=MIN_FONT_PT)
    return fig


def scaling_curve(path: Path, n_train: Sequence[int], value: Sequence[float | None],
                  low: Sequence[float | None], high: Sequence[float | None], metric: str, target: str,
                  references: dict[str, float | None] | None = None) -> Path:
    """Test error against the number of training samples (log x), with CI bars and baselines."""
    fig = Figure(figsize=(5, 3.4), layout="constrained")
    ax = fig.subplots()
    pts = [(n, v, lo, hi) for n, v, lo, hi in zip(n_train, value, low, high) if v is not None]
    if pts:
        n, v, lo, hi = (np.array(a, dtype=float) for a in zip(*pts))
        lo = np.where(np.isnan(lo), v, lo)
        hi = np.where(np.isnan(hi), v, hi)
        ax.errorbar(n, v, yerr=[v - lo, hi - v], marker="o", capsize=3, color=method(NETWORK).colour,
                    label="network (test, mean ± CI)")
    for name, ref in (references or {}).items():
        if ref is not None:
            ax.axhline(ref, ls="--", color=method(name).colour, label=method(name).figure_label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("training samples")
    ax.set_ylabel(f"test {metric} ({target})")
    ax.set_title("test error vs training-set size", fontsize=10)
    ax.legend(fontsize=MIN_FONT_PT)
    return save(fig, path)


def draw_all(fig_dir: Path, records: list[dict], kept: dict[int, dict], targets: list[str],
             aggregates: dict[str, Any], by_class: dict[str, Any],
             first: list[int], worst: dict[str, list[int]], metrics_csv: Path | None) -> dict[str, Path]:
    """Every evaluation figure; returns {name: path}. Names are stable (the report uses them).
    aggregates, by_class: metrics.json's ``aggregates`` and ``class_aggregates`` (per target), which the
    overview and the error chart read."""
    by_index = {r["index"]: r for r in records}
    out: dict[str, Path] = {}
    for t in targets:
        intervals = intervals_of(aggregates[t], by_class[t])
        # None: a panel without information (one value), left out; the report says so in words.
        drawn = {f"overview_{t}": overview(fig_dir / f"overview_{t}.png", records, kept, t,
                                           aggregates[t], worst.get(t, [])),
                 f"class_chart_{t}": class_chart(fig_dir / f"rel_l2_by_class_{t}.png", intervals, t),
                 f"hist_rel_l2_{t}": error_histograms(fig_dir / f"hist_rel_l2_{t}.png", records, t),
                 f"hist_ssim_{t}": error_histograms(fig_dir / f"hist_ssim_{t}.png", records, t, "ssim"),
                 f"thickness_{t}": error_vs_thickness(fig_dir / f"rel_l2_vs_thickness_{t}.png", records, t)}
        out.update({name: p for name, p in drawn.items() if p is not None})
        for kind, indices in (("sample", first), ("worst", worst.get(t, []))):
            for rank, i in enumerate(indices):
                # A worst case that is also one of the first samples is drawn once, as sample_*.
                if i in kept and not (kind == "worst" and i in first):
                    name = f"{kind}_{rank}_{t}"
                    out[name] = save(sample_panel_figure(kept[i], t, by_index.get(i)), fig_dir / f"{name}.png")
    if metrics_csv is not None:
        out["learning_curves"] = learning_curves(fig_dir / "learning_curves.png", metrics_csv)
    return out
