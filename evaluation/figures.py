"""PNG figures of the evaluation (matplotlib's object API on the Agg canvas: no pyplot state,
so drawing here never changes the backend of a notebook that imports it).

Maps are drawn with ``origin="upper"``: row 0 (y = 0) at the top, [row = y, col = x].
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

METHOD_LABELS = {"network": "network", "mean": "mean training target", "icom": "iCoM (LS-scaled)",
                 "ptycho": "ptychography (LS-scaled)"}
METHOD_COLORS = {"network": "tab:blue", "mean": "tab:gray", "icom": "tab:orange", "ptycho": "tab:green"}
#: legend text of the training metrics CSV's loss columns (models.training.logs.METRIC_COLUMNS): what each is.
LOSS_LABELS = {
    "train_loss": "train_loss: Huber on standardised targets (data term)",
    "dev_loss": "dev_loss: MSE on standardised targets (held-out dev split)",
    "l2_loss": "l2_loss: weight-decay term 0.5·wd·Σw² (added to train_loss in the objective; not a data error)",
}
UNIT_LABELS = {"potential": "V·Å", "density": "e/Å²"}
#: x columns recognised in the training metrics CSV, first match wins.
STEP_COLUMNS = ("step", "global_step", "iteration", "epoch")


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=100)
    return path


def _show_map(ax: Any, img: np.ndarray, title: str, cmap: str = "viridis", vmin: float | None = None,
              vmax: float | None = None, colorbar: bool = True) -> Any:
    im = ax.imshow(img, cmap=cmap, origin="upper", vmin=vmin, vmax=vmax, interpolation="nearest")
    ax.set_title(title, fontsize=8)
    ax.set_axis_off()
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    return im


def sample_panel(path: Path, kept: dict[str, Any], target: str, record: dict[str, Any] | None = None) -> Path:
    """One row: a few CBED patterns (log scale, one colour scale), truth, network, baselines (one
    colour scale, the truth's range), network - truth."""
    maps = kept["maps"][target]
    methods = [m for m in ("network", "icom", "ptycho", "mean") if m in maps]
    cbeds = list(kept["cbed"].items())
    n = len(cbeds) + 1 + len(methods) + 1
    fig = Figure(figsize=(2.2 * n, 2.6), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    if cbeds:
        top = max(float(p.max()) for _, p in cbeds)
        floor = top * 1e-5 + 1e-30
        for k, (ax, (i, pattern)) in enumerate(zip(axes, cbeds)):
            _show_map(ax, np.log10(np.maximum(pattern, floor)), f"CBED #{i} (log10)", cmap="magma",
                      vmin=np.log10(floor), vmax=np.log10(top), colorbar=k == len(cbeds) - 1)
    truth = maps["truth"]
    lo, hi = float(truth.min()), float(truth.max())
    unit = UNIT_LABELS.get(target, "")
    col = len(cbeds)
    _show_map(axes[col], truth, f"truth ({unit})", vmin=lo, vmax=hi, colorbar=False)
    for k, m in enumerate(methods):
        score = ""
        if record is not None and m in record["metrics"][target]:
            r = record["metrics"][target][m]["physical"]["rel_l2"]
            score = f"\nrel L2 {r:.3f}" if r is not None else ""
        _show_map(axes[col + 1 + k], maps[m], METHOD_LABELS[m] + score, vmin=lo, vmax=hi,
                  colorbar=k == len(methods) - 1)
    diff = maps["network"] - truth
    lim = float(np.abs(diff).max()) or 1.0
    _show_map(axes[-1], diff, f"network − truth ({unit})", cmap="RdBu_r", vmin=-lim, vmax=lim)
    meta = kept["meta"]
    fig.suptitle(f"{meta.get('formula', '')} {meta.get('material_id', '')} zone {meta.get('zone_axis')} "
                 f"t = {float(meta.get('thickness_A', float('nan'))):.0f} Å — {target}", fontsize=9)
    return _save(fig, path)


def error_histograms(path: Path, records: list[dict], target: str, metric: str = "rel_l2") -> Path:
    """Histogram of one metric over samples, one colour per method."""
    fig = Figure(figsize=(5, 3.4), layout="constrained")
    ax = fig.subplots()
    series = {m: [r["metrics"][target][m]["physical"][metric] for r in records if m in r["metrics"][target]]
              for m in METHOD_LABELS}
    finite = {m: [v for v in vals if v is not None and math.isfinite(v)] for m, vals in series.items()}
    every = [v for vals in finite.values() for v in vals]
    bins = np.linspace(min(every), max(every), 21) if every and max(every) > min(every) else 10
    for m, vals in finite.items():
        if vals:
            ax.hist(vals, bins=bins, alpha=0.55, label=f"{METHOD_LABELS[m]} (n={len(vals)})",
                    color=METHOD_COLORS[m])
    ax.set_xlabel(f"{metric} ({target}, physical units)")
    ax.set_ylabel("samples")
    ax.legend(fontsize=7)
    return _save(fig, path)


def error_vs_thickness(path: Path, records: list[dict], target: str) -> Path:
    """Relative L2 against specimen thickness: colour = method, marker = element class."""
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(5.5, 3.6), layout="constrained")
    ax = fig.subplots()
    classes = sorted({r["z_class"] for r in records})
    markers = {zc: "osd^v"[i % 5] for i, zc in enumerate(classes)}
    methods = [m for m in METHOD_LABELS if any(m in r["metrics"][target] for r in records)]
    for m in methods:
        for zc in classes:
            xy = [(r["thickness_A"], r["metrics"][target][m]["physical"]["rel_l2"]) for r in records
                  if r["z_class"] == zc and m in r["metrics"][target]]
            xy = [(t, e) for t, e in xy if t is not None and e is not None]
            if xy:
                ax.scatter(*zip(*xy), color=METHOD_COLORS[m], marker=markers[zc], s=20, alpha=0.75)
    handles = [Line2D([], [], color=METHOD_COLORS[m], marker="o", ls="", label=METHOD_LABELS[m]) for m in methods]
    handles += [Line2D([], [], color="k", marker=markers[zc], ls="", label=zc) for zc in classes]
    ax.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    ax.set_xlabel("thickness (Å)")
    ax.set_ylabel(f"relative L2 ({target})")
    return _save(fig, path)


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
    return _save(learning_curves_figure(metrics_csv), path)


def learning_curves_figure(metrics_csv: Path) -> Figure:
    """Loss columns (log scale) and the learning rate against the step column of the CSV; the
    legend (below the plot) says what each loss is (`LOSS_LABELS`), so the weight-decay term is
    not read as an error."""
    x_name, cols = read_metrics_csv(metrics_csv)
    n_rows = len(next(iter(cols.values()))) if cols else 0
    x = cols[x_name] if x_name else np.arange(n_rows)
    # train_loss, dev_loss, l2_loss, ... but not bookkeeping such as loss_scale.
    losses = [c for c in cols if c.lower() == "loss" or c.lower().endswith("_loss")]
    lrs = [c for c in cols if c.lower() in ("lr", "learning_rate") or c.lower().startswith("lr")]
    fig = Figure(figsize=(9 if lrs else 5, 4.2), layout="constrained")
    axes = fig.subplots(1, 2 if lrs else 1, squeeze=False)[0]
    for c in losses:
        ok = np.isfinite(cols[c])
        if ok.any():
            axes[0].plot(x[ok], cols[c][ok], marker="." if ok.sum() < 30 else None, label=LOSS_LABELS.get(c, c))
    if any(np.nanmin(cols[c]) > 0 for c in losses if np.isfinite(cols[c]).any()):
        axes[0].set_yscale("log")
    axes[0].set_xlabel(x_name or "row")
    axes[0].set_ylabel("loss")
    axes[0].legend(fontsize=6, loc="upper left", bbox_to_anchor=(0.0, -0.18))
    axes[0].set_title("learning curves", fontsize=9)
    for c in lrs:
        axes[1].plot(x, cols[c], label=c)
        axes[1].set_xlabel(x_name or "row")
        axes[1].set_ylabel("learning rate")
        axes[1].legend(fontsize=7)
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
        ax.errorbar(n, v, yerr=[v - lo, hi - v], marker="o", capsize=3, color=METHOD_COLORS["network"],
                    label="network (test, mean ± CI)")
    for name, ref in (references or {}).items():
        if ref is not None:
            ax.axhline(ref, ls="--", color=METHOD_COLORS.get(name, "k"), label=METHOD_LABELS.get(name, name))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("training samples")
    ax.set_ylabel(f"test {metric} ({target})")
    ax.set_title("test error vs training-set size", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def draw_all(fig_dir: Path, records: list[dict], kept: dict[int, dict], targets: list[str], cfg: Any,
             first: list[int], worst: dict[str, list[int]], metrics_csv: Path | None) -> dict[str, Path]:
    """Every evaluation figure; returns {name: path}. Names are stable (the report uses them)."""
    by_index = {r["index"]: r for r in records}
    out: dict[str, Path] = {}
    for t in targets:
        out[f"hist_rel_l2_{t}"] = error_histograms(fig_dir / f"hist_rel_l2_{t}.png", records, t)
        out[f"hist_ssim_{t}"] = error_histograms(fig_dir / f"hist_ssim_{t}.png", records, t, "ssim")
        out[f"thickness_{t}"] = error_vs_thickness(fig_dir / f"rel_l2_vs_thickness_{t}.png", records, t)
        for kind, indices in (("sample", first), ("worst", worst.get(t, []))):
            for rank, i in enumerate(indices):
                # A worst case that is also one of the first samples is drawn once, as sample_*.
                if i in kept and not (kind == "worst" and i in first):
                    name = f"{kind}_{rank}_{t}"
                    out[name] = sample_panel(fig_dir / f"{name}.png", kept[i], t, by_index.get(i))
    if metrics_csv is not None:
        out["learning_curves"] = learning_curves(fig_dir / "learning_curves.png", metrics_csv)
    return out
