"""Maps and diffraction patterns drawn for a reader: the report's sample panels and overview picture
and the notebook's figures share these helpers (matplotlib's object API on the Agg canvas: no pyplot
state, so drawing here never changes the backend of a notebook that imports it).

Maps are [row = y, col = x], drawn with ``origin="upper"`` (row 0 at the top) over their extent in
Angstrom (the scanned field of view, ``meta.fov_A``) with a scale bar; CBED patterns over their
scattering angle in mrad (k = 0 at index P // 2). Maps compared in one row share one colour range that
holds every map's values (nothing is clipped), with a colour bar naming the quantity and its unit.

Legibility: a figure ``w`` inches wide is shown ``w * CSS_DPI`` CSS pixels wide in the report (saved at
``SAVE_DPI`` = twice that, declared 2x by the page), and no figure is wider than ``MAX_WIDTH_IN`` (the
report's text column), so a font of ``MIN_FONT_PT`` points shows as 12 px at 100%.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from namsa.sample_meta import SampleMeta

from .methods import NETWORK, in_panel_order, method
from .views import HEADLINE

#: CSS pixels per inch: the report shows a figure ``w`` inches wide as ``w * CSS_DPI`` px (1 pt = 4/3 px).
CSS_DPI = 96
#: saved at twice the display resolution (the report's ``srcset ... 2x``): sharp on high-density screens.
SAVE_DPI = 2 * CSS_DPI
#: widest figure (inches): 1100 CSS px, inside the report's text column, so it is never scaled down.
MAX_WIDTH_IN = 1100 / CSS_DPI
#: smallest font (points) of any figure text: 12 CSS px at 100%.
MIN_FONT_PT = 9
UNIT_LABELS = {"potential": "V·Å", "density": "e/Å²"}
QUANTITY_LABELS = {"potential": "projected potential", "density": "projected electron density"}
#: nice scale-bar lengths (in the map's unit), the longest at most a third of the map is used.
_BAR_STEPS = (1, 2, 5)
#: (left, right, bottom, top) of an image, in the unit of its axes.
Extent = tuple[float, float, float, float]


def save(fig: Figure, path: Path) -> Path:
    """``fig`` as PNG at ``path`` (`SAVE_DPI`); returns the path."""
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=SAVE_DPI)
    return path


def width(inches: float) -> float:
    """A figure width clipped to `MAX_WIDTH_IN`."""
    return min(float(inches), MAX_WIDTH_IN)


def quantity_label(target: str) -> str:
    """"projected potential (V·Å)": a colour bar's label for a map of ``target``."""
    return f"{QUANTITY_LABELS.get(target, target)} ({UNIT_LABELS.get(target, '')})"


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


def map_extent(meta: SampleMeta) -> Extent:
    """(left, right, bottom, top) in Angstrom of the scanned field of view (``fov_A`` = [y0, x0, h, w]);
    bottom > top because row 0 is drawn at the top."""
    y0, x0, h, w = (float(v) for v in meta.fov_A)
    return (x0, x0 + w, y0 + h, y0)


def cbed_extent(meta: SampleMeta, pixels: int) -> Extent | None:
    """(left, right, bottom, top) in mrad of a P x P pattern with k = 0 at P // 2 (the detector's
    angular sampling, `SampleMeta.angular_sampling_mrad`); None without it."""
    step = meta.angular_sampling_mrad
    if step is None:
        return None
    lo, hi = (-(pixels // 2) - 0.5) * step, (pixels - pixels // 2 - 0.5) * step
    return (lo, hi, hi, lo)


def value_range(images: Sequence[np.ndarray]) -> tuple[float, float]:
    """(min, max) over the finite values of every image: one colour range that clips none of them."""
    finite = [a[np.isfinite(a)] for a in (np.asarray(i, dtype=np.float64) for i in images)]
    finite = [a for a in finite if a.size]
    if not finite:
        return (0.0, 1.0)
    lo, hi = min(float(a.min()) for a in finite), max(float(a.max()) for a in finite)
    return (lo, hi) if hi > lo else (lo - 0.5, hi + 0.5)


def show_map(ax: Any, img: np.ndarray, title: str, extent: Extent | None, unit: str, cmap: str = "viridis",
             vmin: float | None = None, vmax: float | None = None, ticks: bool = False,
             axis_names: tuple[str, str] = ("x", "y")) -> Any:
    """One map with its extent (left, right, bottom, top) in ``unit`` and a scale bar in that unit;
    ticks: keep the axes, labelled "x (unit)" / "y (unit)" (``axis_names``), else hide them."""
    im = ax.imshow(img, cmap=cmap, origin="upper", vmin=vmin, vmax=vmax, interpolation="nearest", extent=extent)
    ax.set_title(title, fontsize=MIN_FONT_PT)
    if ticks and extent is not None:
        ax.set_xlabel(f"{axis_names[0]} ({unit})", fontsize=MIN_FONT_PT)
        ax.set_ylabel(f"{axis_names[1]} ({unit})", fontsize=MIN_FONT_PT)
        ax.tick_params(labelsize=MIN_FONT_PT)
    else:
        ax.set_axis_off()
    if extent is not None:
        _scale_bar(ax, abs(extent[1] - extent[0]), unit)
    return im


def colorbar(fig: Any, im: Any, axes: Any, label: str) -> Any:
    """A colour bar beside ``axes`` whose label says the quantity and its unit."""
    bar = fig.colorbar(im, ax=axes, fraction=0.046, pad=0.02)
    bar.set_label(label, fontsize=MIN_FONT_PT)
    bar.ax.tick_params(labelsize=MIN_FONT_PT)
    return bar


def cbed_row(fig: Any, cbeds: list[tuple[int, np.ndarray]], meta: SampleMeta, ticks: bool = False) -> None:
    """The CBED patterns (index in the scan, P x P intensity) of one sample on one log colour scale,
    over their scattering angle in mrad."""
    axes = fig.subplots(1, len(cbeds), squeeze=False)[0]
    top = max(float(p.max()) for _, p in cbeds)
    floor = top * 1e-5 + 1e-30
    scan_x = meta.scan_shape[1]
    for ax, (i, pattern) in zip(axes, cbeds):
        where = f" (scan row {i // scan_x}, col {i % scan_x})" if scan_x else ""
        im = show_map(ax, np.log10(np.maximum(pattern, floor)), f"CBED #{i}{where}",
                      cbed_extent(meta, pattern.shape[-1]), "mrad", cmap="magma", vmin=np.log10(floor),
                      vmax=np.log10(top), ticks=ticks, axis_names=("kx", "ky"))
    colorbar(fig, im, list(axes), "log10 intensity\n(incident probe = 1)")


def map_row(fig: Any, panels: list[tuple[str, np.ndarray]], target: str, extent: Extent | None,
            error: np.ndarray | None = None, ticks: bool = False) -> list[Any]:
    """``panels`` (title, map) on one colour range holding every map's values, then ``error`` (network -
    truth, same unit) on its own symmetric range when given; Angstrom axes; returns the axes."""
    axes = list(fig.subplots(1, len(panels) + (error is not None), squeeze=False)[0])
    lo, hi = value_range([img for _, img in panels])
    unit = UNIT_LABELS.get(target, "")
    for ax, (title, img) in zip(axes, panels):
        im = show_map(ax, img, title, extent, "Å", vmin=lo, vmax=hi, ticks=ticks)
    colorbar(fig, im, axes[:len(panels)], quantity_label(target))
    if error is not None:
        lim = float(np.nanmax(np.abs(error))) or 1.0
        err = show_map(axes[-1], error, "network − truth", extent, "Å", cmap="RdBu_r", vmin=-lim, vmax=lim,
                       ticks=ticks)
        colorbar(fig, err, axes[-1], f"error ({unit})")
    return axes


def scored_title(m: str, target: str, record: dict[str, Any] | None) -> str:
    """A method's panel title with its field-view relative L2 from ``record`` when it has one."""
    score = ""
    if record is not None and m in record["metrics"][target]:
        r = record["metrics"][target][m][HEADLINE]["rel_l2"]
        score = f"\nrel L2 {r:.3f}" if r is not None else ""
    return method(m).figure_label + score


def describe(meta: SampleMeta) -> str:
    """"GaAs (GaAs-zincblende), zone axis [0, 0, 1], thickness 40 Å": what a sample is."""
    axis = None if meta.zone_axis is None else list(meta.zone_axis)
    return (f"{meta.formula or ''} ({meta.material_id or ''}), zone axis {axis}, "
            f"thickness {meta.thickness_or_nan_A:.0f} Å")


def sample_panel_figure(kept: dict[str, Any], target: str, record: dict[str, Any] | None = None) -> Figure:
    """Two rows: a few CBED patterns (log scale, one colour scale, mrad), then truth, network and
    baselines as ``kept`` holds them (`scoring`: the field view, each map's mean set to the truth's; one
    colour range holding every map) and network - truth (Angstrom scale bars)."""
    maps, meta = kept["maps"][target], kept["meta"]
    methods = [m.name for m in in_panel_order() if m.name in maps]
    cbeds = list(kept["cbed"].items())
    fig = Figure(figsize=(width(1.9 * (len(methods) + 2) + 0.9), 5.4 if cbeds else 2.9), layout="constrained")
    rows = fig.subfigures(2, 1, height_ratios=[1, 1.1]) if cbeds else [None, fig]
    if cbeds:
        cbed_row(rows[0], cbeds, meta)
    panels = [("truth", maps["truth"])] + [(scored_title(m, target, record), maps[m]) for m in methods]
    map_row(rows[1], panels, target, map_extent(meta), maps[NETWORK] - maps["truth"])
    fig.suptitle(f"{describe(meta)} — {target}", fontsize=10)
    return fig


def overview_figure(rows: list[tuple[str, dict[str, Any], dict[str, Any]]], target: str, baseline: str) -> Figure:
    """One row per (label, kept arrays, record) of ``rows``: truth, network and ``baseline`` in the field
    view on one colour range per row, each titled with its relative L2; the report's first picture."""
    fig = Figure(figsize=(width(3 * 1.75 + 1.1), 2.6 * len(rows)), layout="constrained")
    subs = fig.subfigures(len(rows), 1, squeeze=False)[:, 0]
    for sub, (label, kept, record) in zip(subs, rows):
        maps = kept["maps"][target]
        panels = [("truth", maps["truth"])] + [(scored_title(m, target, record), maps[m]) for m in (NETWORK, baseline)]
        map_row(sub, panels, target, map_extent(kept["meta"]))
        sub.suptitle(f"{label}\n{describe(kept['meta'])}", fontsize=MIN_FONT_PT)
    return fig


def cbed_figure(cbed: np.ndarray, meta: SampleMeta, count: int = 4) -> Figure:
    """``count`` patterns spread over the scan of ``cbed`` (S, P, P), on mrad axes (the notebook's)."""
    picks = sorted({int(round(v)) for v in np.linspace(0, cbed.shape[0] - 1, count)})
    fig = Figure(figsize=(width(2.6 * len(picks) + 1.2), 3.0), layout="constrained")
    cbed_row(fig, [(i, np.asarray(cbed[i], dtype=np.float64)) for i in picks], meta, ticks=True)
    return fig


def comparison_figure(truth: np.ndarray, maps: dict[str, np.ndarray], target: str, meta: SampleMeta) -> Figure:
    """Truth, each of ``maps`` (label -> map in the truth's units; "network" among them) and network -
    truth, on Angstrom axes with a scale bar and labelled colour bars (the notebook's)."""
    fig = Figure(figsize=(width(2.7 * (len(maps) + 2) + 1.6), 3.3), layout="constrained")
    panels = [("truth", truth)] + list(maps.items())
    map_row(fig, panels, target, map_extent(meta), maps[NETWORK] - truth, ticks=True)
    fig.suptitle(f"{describe(meta)} — {target}", fontsize=10)
    return fig
