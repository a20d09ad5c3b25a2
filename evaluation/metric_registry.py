"""The evaluation's metrics, one record each: the one place that says which metrics are aggregated, in
which views, which way is better, how the report and the verdict name them and what they mean. The
aggregation, the verdict, the report's tables, metrics.json's conventions and docs/evaluation.md's
metric table read `METRICS`; the math is `evaluation.metrics` (the whole-map metrics, one line each in
its `image_metrics`), scored per view by `evaluation.scoring`.

Adding a whole-map metric: its function and its line in `metrics.image_metrics`, and one record below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .views import FIELD, LEGACY, LEVEL, STRUCTURE, VIEWS

#: which way a metric is better; None: neither (a fact, such as a fitted scale).
Better = Literal["lower", "higher"] | None
_ARROWS: dict[str, str] = {"lower": "↓", "higher": "↑"}


@dataclass(frozen=True)
class Metric:
    """One aggregated metric.

    name:       its key in every record, aggregate and headline of metrics.json.
    better:     "lower" or "higher" is better; None: neither (never marked best, never judged).
    label:      its row in the report's tables, before the arrow ("relative L2").
    short_name: what verdict sentences call it ("rel. L2").
    definition: what it is and its conventions: metrics.json's ``conventions`` and docs/evaluation.md.
    views:      the views it is aggregated in (`evaluation.views`; ``level``: the network's own entry).
    judged:     a headline metric: the verdict decides on it (better on every one, intervals apart).
    from_truth: its figure takes a number from the truth (a fitted offset or scale): never marked best.
    part_of:    the metric whose parts it is (the report shows it right under that one's row).
    note:       said after the arrow in the report's row.
    """

    name: str
    better: Better
    label: str
    short_name: str
    definition: str
    views: tuple[str, ...]
    judged: bool = False
    from_truth: bool = False
    part_of: str | None = None
    note: str = ""

    @property
    def row_label(self) -> str:
        """The report's row: "relative L2 ↓", "fitted scale (1: already in the truth's units)"."""
        return " ".join(part for part in (self.label, _ARROWS.get(self.better or "", ""), self.note) if part)


#: every metric, in the order metrics.json aggregates them (whole-map metrics first, in every view).
METRICS: tuple[Metric, ...] = (
    Metric("rel_l2", "lower", "relative L2", "rel. L2", "||pred - true||_2 / ||true||_2; 0 when both are zero, "
           "inf (JSON null) when only the truth is zero; the truth's mean is included in the norm (potentials are "
           "positive)", VIEWS, judged=True),
    Metric("psnr_db", "higher", "PSNR (dB)", "PSNR", "10 log10(R^2 / MSE), R = max(true) - min(true) of each "
           "sample's truth, not the dtype's range (a constant truth: max|true|; an all-zero truth: 1); identical "
           "maps give inf (counted, not averaged)", VIEWS, judged=True),
    Metric("ssim", "higher", "SSIM", "SSIM", "Wang, Bovik, Sheikh & Simoncelli 2004: Gaussian window sigma 1.5 px "
           "truncated at 3.5 sigma (11 taps), K1 0.01, K2 0.03, population covariances, R as for PSNR; periodic "
           "borders (the scan covers a periodic field of view), every pixel averaged", VIEWS, judged=True),
    Metric("pearson_r", "higher", "Pearson r", "Pearson r", "Pearson correlation of the pixels; 0 when either map is "
           "constant", VIEWS, judged=True),
    Metric("mean_error_A", "lower", "column position error (Å)", "column error", "field view (an offset moves no "
           "maximum): local maxima of the truth (atomic columns, above min + evaluation.column_threshold_rel * ptp) "
           "matched to maxima of the estimate by the Hungarian algorithm with periodic (minimum-image) distances, "
           "positions refined to sub-pixel by a 3-point parabola; a match lies within half the median "
           "nearest-neighbour distance of the true columns; the mean distance of the matched columns in Angstrom "
           "(null: none matched, not resolved)", (FIELD,)),
    Metric("recall", "higher", "columns found", "columns found", "field view: matched / true columns of the column "
           "position error's matching", (FIELD,)),
    Metric("scale", None, "fitted scale (1: already in the truth's units)", "fitted scale", "structure view only: "
           "the scale (>= 0) of the least-squares fit of the map to the truth; 1: the map was in the truth's units "
           "already (mean in the report, median in the aggregates)", (STRUCTURE,), from_truth=True),
    Metric("rel_l2_level", "lower", "… from the map's mean", "rel. L2 from the mean", "legacy view only: the part "
           "of rel_l2 from the map's mean, |mean(pred) - mean(true)| sqrt(N) / ||true||; with rel_l2_contrast it "
           "splits rel_l2 exactly, rel_l2^2 = level^2 + contrast^2. The legacy rule's fit handed the fitted "
           "baselines the truth's mean (their level part is 0 by construction, as every method's is in the field "
           "and structure views), while the network had to infer it", (LEGACY,), from_truth=True, part_of="rel_l2",
           note="(fitted baselines: taken from the truth)"),
    Metric("rel_l2_contrast", "lower", "… from its contrast", "rel. L2 from the contrast", "legacy view only: the "
           "rest of rel_l2, ||(pred - mean(pred)) - (true - mean(true))|| / ||true||; the network's equals its "
           "field-view rel_l2", (LEGACY,), part_of="rel_l2"),
    Metric("level_error", "lower", "level error", "level error", "the network's only (its level entry): "
           "|mean(pred) - mean(true)| / |mean(true)|, its own estimate of the map's mean (thickness x mean inner "
           "potential), which no intensity fixes: inferred from the contrast's amplitude and the species it "
           "recognises; median and mean reported, no verdict", (LEVEL,)),
)

_BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}


def metric(name: str) -> Metric:
    """The record of the metric called ``name`` (KeyError for an unknown name)."""
    return _BY_NAME[name]


def judged() -> tuple[Metric, ...]:
    """The headline metrics the verdict decides on, in the order its sentences name them."""
    return tuple(m for m in METRICS if m.judged)


def in_view(view: str) -> tuple[Metric, ...]:
    """The metrics aggregated in ``view``, in metrics.json's order."""
    return tuple(m for m in METRICS if view in m.views)


def whole_map() -> tuple[Metric, ...]:
    """The whole-map metrics (`metrics.image_metrics`): scored in every view of `views.VIEWS`."""
    return tuple(m for m in METRICS if set(VIEWS) <= set(m.views))


def in_report_order(metrics: tuple[Metric, ...] = METRICS) -> list[Metric]:
    """``metrics`` as the report's tables list them: each metric followed by its parts (`Metric.part_of`)."""
    tops = [m for m in metrics if m.part_of is None]
    return [row for top in tops for row in (top, *(m for m in metrics if m.part_of == top.name))]
