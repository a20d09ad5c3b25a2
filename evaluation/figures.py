"""PNG figures of the evaluation (matplotlib's object API on the Agg canvas: no pyplot state,
so drawing here never changes the backend of a notebook that imports it).

Maps are drawn with ``origin="upper"``: row 0 (y = 0) at the top, [row = y, col = x], with their
extent in Angstrom (the scanned field of view) and a scale bar; CBED patterns in mrad.

Legibility: a figure ``w`` inches wide is shown ``w * CSS_DPI`` CSS pixels wide in the report (it
is saved at ``SAVE_DPI`` = twice that and the page declares it 2x), and no figure is wider than
``MAX_WIDTH_IN`` (the report's text column), so the browser never scales it down on a desktop
screen and a font of ``MIN_FONT_PT`` points shows as 12 px at 100%. A panel that would carry no
information (a constant learning rate, a histogram of one value) is not drawn; the report says
it in words instead.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .methods import NETWORK, REGISTRY, in_panel_order, method, names
from .views import HEADLINE

#: legend text of the training metrics CSV's loss columns (models.training.logs.METRIC_COLUMNS): what each is.
LOSS_LABELS = {
    "train_loss": "train_loss: Huber on standardised targets (data term)",
    "dev_loss": "dev_loss: MSE on standardised targets (held-out dev split)",
    "l2_loss": "l2_loss: weight-decay term 0.5·wd·Σw² (added to train_loss in the objective; not a data error)",
}
UNIT_LABELS = {"potential": "V·Å", "density": "e/Å²"}
QUANTITY_LABELS = {"potential": "projected potential", "density": "projected electron density"}
#: x columns recognised in the training metrics CSV, first match wins.
STEP_COLUMNS = ("step", "global_step", "iteration", "epoch")
#: CSS pixels per inch: the report shows a figure ``w`` inches wide as ``w * CSS_DPI`` px (1 pt = 4/3 px).
CSS_DPI = 96
#: saved at twice the display resolution (the report's ``srcset ... 2x``): sharp on high-density screens.
SAVE_DPI = 2 * CSS_DPI
#: widest figure (inches): 1100 CSS px, inside the report's text column, so it is never scaled down.
MAX_WIDTH_IN = 1100 / CSS_DPI
#: smallest font (points) of any figure text: 12 CSS px at 100%.
MIN_FONT_PT = 9
#: nice scale-bar lengths (in the map's unit), the longest at most a third of the map is used.
_BAR_STEPS = (1, 2, 5)


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=SAVE_DPI)
    return path


def _width(inches: float) -> float:
    """A figure width clipped to `MAX_WIDTH_IN`."""
    return min(float(inches), MAX_WIDTH_IN)


def bar_length(span: float) -> float:
    """The longest 1-2-5 x 10^k length at most a third of ``span`` (the scale bar's length)."""
    if not span > 0 or not math.isfinite(span):
        return 0.0
    top = span / 3
    exponent = math.floor(math.log10(top))
    return max(s * 10.0 ** exponent for s in _BAR_STEPS if s * 10.0 ** exponent <= top)


def _scale_bar(ax: Any, span: float, unit: str) -> None:
    """A labelled scale bar in the lower left of a map whose extent is in ``unit``."""
    from mpl_toolkits.axes_grid1.anchored_artists import AnchoredSizeBar

    length = bar_length(span)
    if length <= 0:
        return
    bar = AnchoredSizeBar(ax.transData, length, f"{length:g} {unit}", "lower left", pad=0.3, color="white",
                          frameon=True, size_vertical=span / 60, fontproperties={"size": MIN_FONT_PT})
    bar.patch.set(facecolor="black", alpha=0.55, edgecolor="none")
    ax.add_artist(bar)


def _show_map(ax: Any, img: np.ndarray, title: str, extent: tuple[float, float, float, float] | None,
              unit: str, cmap: str = "viridis", vmin: float | None = None, vmax: float | None = None) -> Any:
    """One map with its extent (left, right, bottom, top) in ``unit`` and a scale bar in that unit."""
    im = ax.imshow(img, cmap=cmap, origin="upper", vmin=vmin, vmax=vmax, interpolation="nearest", extent=extent)
    ax.set_title(title, fontsize=MIN_FONT_PT)
    ax.set_axis_off()
    if extent is not None:
        _scale_bar(ax, abs(extent[1] - extent[0]), unit)
    return im


def _colorbar(fig: Any, im: Any, axes: Any, label: str) -> Any:
    """A colour bar beside ``axes`` whose label says the quantity and its unit."""
    bar = fig.colorbar(im, ax=axes, fraction=0.046, pad=0.02)
    bar.set_label(label, fontsize=MIN_FONT_PT)
    bar.ax.tick_params(labelsize=MIN_FONT_PT)
    return bar


def map_extent(meta: dict[str, Any]) -> tuple[float, float, float, float] | None:
    """(left, right, bottom, top) in Angstrom of the scanned field of view (``fov_A`` = [y0, x0, h, w]);
    bottom > top because row 0 is drawn at the top."""
    fov = meta.get("fov_A")
    if not fov or len(fov) != 4:
        return None
    y0, x0, h, w = (float(v) for v in fov)
    return (x0, x0 + w, y0 + h, y0)


def cbed_extent(meta: dict[str, Any], pixels: int) -> tuple[float, float, float, float] | None:
    """(left, right, bottom, top) in mrad of a P x P pattern with k = 0 at P // 2."""
    step = meta.get("pattern_mrad_per_px")
    if not step:
        return None
    lo, hi = (-(pixels // 2) - 0.5) * float(step), (pixels - pixels // 2 - 0.5) * float(step)
    return (lo, hi, hi, lo)


def sample_panel(path: Path, kept: dict[str, Any], target: str, record: dict[str, Any] | None = None) -> Path:
    """`sample_panel_figure` saved as PNG at ``path``."""
    return _save(sample_panel_figure(kept, target, record), path)


def sample_panel_figure(kept: dict[str, Any], target: str, record: dict[str, Any] | None = None) -> Figure:
    """Two rows: a few CBED patterns (log scale, one colour scale, mrad), then truth, network and
    baselines as ``kept`` holds them (`scoring`: the field view, each map's mean set to the truth's; one
    colour scale, the truth's range) and network - truth (Angstrom scale bars)."""
    maps, meta = kept["maps"][target], kept["meta"]
    methods = [m.name for m in in_panel_order() if m.name in maps]
    cbeds = list(kept["cbed"].items())
    n_maps = len(methods) + 2
    fig = Figure(figsize=(_width(1.9 * n_maps + 0.9), 5.4 if cbeds else 2.9), layout="constrained")
    rows = fig.subfigures(2, 1, height_ratios=[1, 1.1]) if cbeds else [None, fig]
    if cbeds:
        _cbed_row(rows[0], cbeds, meta)
    _map_row(rows[1], maps, methods, target, map_extent(meta), record)
    fig.suptitle(f"{meta.get('formula', '')} ({meta.get('material_id', '')}), zone axis {meta.get('zone_axis')}, "
                 f"thickness {float(meta.get('thickness_A', float('nan'))):.0f} Å — {target}", fontsize=10)
    return fig


def _cbed_row(fig: Any, cbeds: list[tuple[int, np.ndarray]], meta: dict[str, Any]) -> None:
    """The CBED patterns of one sample on one log colour scale, in mrad."""
    axes = fig.subplots(1, len(cbeds), squeeze=False)[0]
    top = max(float(p.max()) for _, p in cbeds)
    floor = top * 1e-5 + 1e-30
    scan_x = int((meta.get("scan_shape") or [0, 0])[1]) or None
    for ax, (i, pattern) in zip(axes, cbeds):
        where = f" (scan row {i // scan_x}, col {i % scan_x})" if scan_x else ""
        im = _show_map(ax, np.log10(np.maximum(pattern, floor)), f"CBED #{i}{where}",
                       cbed_extent(meta, pattern.shape[-1]), "mrad", cmap="magma", vmin=np.log10(floor),
                       vmax=np.log10(top))
    _colorbar(fig, im, list(axes), "log10 intensity\n(incident probe = 1)")


def _map_row(fig: Any, maps: dict[str, np.ndarray], methods: list[str], target: str,
             extent: tuple[float, float, float, float] | None, record: dict[str, Any] | None) -> None:
    """Truth, each method on the truth's colour scale with its headline-view relative L2, and network -
    truth, in Angstrom."""
    axes = fig.subplots(1, len(methods) + 2, squeeze=False)[0]
    truth = maps["truth"]
    lo, hi = float(truth.min()), float(truth.max())
    unit = UNIT_LABELS.get(target, "")
    im = _show_map(axes[0], truth, "truth", extent, "Å", vmin=lo, vmax=hi)
    for ax, m in zip(axes[1:], methods):
        score = ""
        if record is not None and m in record["metrics"][target]:
            r = record["metrics"][target][m][HEADLINE]["rel_l2"]
            score = f"\nrel L2 {r:.3f}" if r is not None else ""
        _show_map(ax, maps[m], method(m).figure_label + score, extent, "Å", vmin=lo, vmax=hi)
    _colorbar(fig, im, list(axes[:-1]), f"{QUANTITY_LABELS.get(target, target)} ({unit})")
    diff = maps[NETWORK] - truth
    lim = float(np.abs(diff).max()) or 1.0
    err = _show_map(axes[-1], diff, "network − truth", extent, "Å", cmap="RdBu_r", vmin=-lim, vmax=lim)
    _colorbar(fig, err, axes[-1], f"error ({unit})")


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
    """Histogram of one metric over samples, one colour per method; None (nothing drawn) when every
    value is the same, as one bin says nothing a table row does not."""
    finite = metric_values(records, target, metric)
    every = [v for vals in finite.values() for v in vals]
    if not spread(every):
        return None
    fig = Figure(figsize=(5.5, 3.6), layout="constrained")
    ax = fig.subplots()
    bins = np.linspace(min(every), max(every), min(21, len(every) + 1))
    for m, vals in finite.items():
        ax.hist(vals, bins=bins, alpha=0.55, label=f"{method(m).figure_label} (n={len(vals)})",
                color=method(m).colour)
    ax.set_xlabel(f"{metric} ({target}, field's rule)")
    ax.set_ylabel("samples")
    ax.legend(fontsize=MIN_FONT_PT)
    return _save(fig, path)


def error_vs_thickness(path: Path, records: list[dict], target: str) -> Path | None:
    """Relative L2 against specimen thickness: colour = method, marker = element class; None when
    every sample has the same thickness (the x axis would be one point)."""
    from matplotlib.lines import Line2D

    if not spread([r["thickness_A"] for r in records]):
        return None
    fig = Figure(figsize=(7.5, 3.8), layout="constrained")
    ax = fig.subplots()
    classes = sorted({r["z_class"] for r in records})
    markers = {zc: "osd^v"[i % 5] for i, zc in enumerate(classes)}
    methods = [m for m in REGISTRY if any(m.name in r["metrics"][target] for r in records)]
    for m in methods:
        for zc in classes:
            xy = [(r["thickness_A"], r["metrics"][target][m.name][HEADLINE]["rel_l2"]) for r in records
                  if r["z_class"] == zc and m.name in r["metrics"][target]]
            xy = [(t, e) for t, e in xy if t is not None and e is not None]
            if xy:
                ax.scatter(*zip(*xy), color=m.colour, marker=markers[zc], s=24, alpha=0.75)
    handles = [Line2D([], [], color=m.colour, marker="o", ls="", label=m.figure_label) for m in methods]
    handles += [Line2D([], [], color="k", marker=markers[zc], ls="", label=zc) for zc in classes]
    ax.legend(handles=handles, fontsize=MIN_FONT_PT, loc="center left", bbox_to_anchor=(1.02, 0.5))
    ax.set_xlabel("thickness (Å)")
    ax.set_ylabel(f"relative L2 ({target}, field's rule)")
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
    return _save(fig, path)


def draw_all(fig_dir: Path, records: list[dict], kept: dict[int, dict], targets: list[str], cfg: Any,
             first: list[int], worst: dict[str, list[int]], metrics_csv: Path | None) -> dict[str, Path]:
    """Every evaluation figure; returns {name: path}. Names are stable (the report uses them)."""
    by_index = {r["index"]: r for r in records}
    out: dict[str, Path] = {}
    for t in targets:
        # None: a panel without information (one value), left out; the report says so in words.
        drawn = {f"hist_rel_l2_{t}": error_histograms(fig_dir / f"hist_rel_l2_{t}.png", records, t),
                 f"hist_ssim_{t}": error_histograms(fig_dir / f"hist_ssim_{t}.png", records, t, "ssim"),
                 f"thickness_{t}": error_vs_thickness(fig_dir / f"rel_l2_vs_thickness_{t}.png", records, t)}
        out.update({name: p for name, p in drawn.items() if p is not None})
        for kind, indices in (("sample", first), ("worst", worst.get(t, []))):
            for rank, i in enumerate(indices):
                # A worst case that is also one of the first samples is drawn once, as sample_*.
                if i in kept and not (kind == "worst" and i in first):
                    name = f"{kind}_{rank}_{t}"
                    out[name] = sample_panel(fig_dir / f"{name}.png", kept[i], t, by_index.get(i))
    if metrics_csv is not None:
        out["learning_curves"] = learning_curves(fig_dir / "learning_curves.png", metrics_csv)
    return out
