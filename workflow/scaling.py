"""Data-scaling study: test error against the number of training samples (the paper's Fig. 9
analogue, where test error fell as the training data grew with the node count).

The same model and schedule are trained on nested subsets of the training split (``fractions`` of
it, via ``TrainConfig.max_train_samples``: the first n training samples in store order, so each
subset contains the smaller ones), each is evaluated on the same held-out split, and the headline
error is plotted against the subset size.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from namsa.errors import UserError

from evaluation import EvaluationConfig, evaluate, figures
from evaluation.aggregation import COLUMN_METRICS, IMAGE_METRICS
from evaluation.methods import NETWORK, baselines, in_panel_order
from evaluation.views import HEADLINE
from evaluation.report import render_scaling, write_html

#: metrics a scaling curve can plot: every headline-view (field) aggregate of `evaluate`
SCALING_METRICS: tuple[str, ...] = (*IMAGE_METRICS, *COLUMN_METRICS)


class ScalingInputError(UserError):
    """The fractions or data given to the scaling study cannot be used."""


def training_sizes(n_train: int, fractions: Sequence[float], min_size: int = 1) -> list[int]:
    """Distinct subset sizes ``ceil(f * n_train)``, raised to ``min_size`` (one full batch), increasing."""
    if not fractions or any(not (0.0 < float(f) <= 1.0) for f in fractions):
        raise ScalingInputError(f"scaling fractions {list(fractions)} must be numbers in (0, 1], e.g. 0.125 0.25 0.5 1")
    if n_train < 1:
        raise ScalingInputError("the data holds no training samples; simulate more materials or change "
                                "data.split_fractions before a scaling study")
    if n_train < min_size:
        raise ScalingInputError(f"the data holds {n_train} training samples, fewer than one batch of {min_size}; "
                                f"lower training.batch_size or simulate more materials")
    return sorted({max(1, min_size, math.ceil(float(f) * n_train)) for f in fractions})


def check_metric(metric: str) -> None:
    """Refuse a metric the evaluation does not aggregate, naming the ones it does."""
    if metric not in SCALING_METRICS:
        raise ScalingInputError(f"--metric {metric!r} is not a metric the evaluation reports; choose one of "
                                f"{', '.join(SCALING_METRICS)}")


def scaling_study(model_cfg: Any, train_cfg: Any, dist_cfg: Any, data_cfg: Any, eval_cfg: EvaluationConfig,
                  data_dirs: str | Path | Sequence[str | Path], out_dir: str | Path,
                  fractions: Sequence[float] = (0.125, 0.25, 0.5, 1.0), metric: str = "rel_l2") -> dict[str, Any]:
    """Train on each subset size, evaluate on ``eval_cfg.split``, plot error vs size.

    Each run lives in ``out_dir/n<size>/`` (training output, ``eval/``) and is resumed if it was
    interrupted. Writes ``out_dir/scaling.json`` and ``out_dir/scaling_<metric>.png``; returns
    ``{"n_train_total", "rows": [{"n_train", "fraction", "model_dir", "eval_dir", target: {...}}],
    "figure", "json", "report"}`` (``out_dir/report.html``: the curve, a table and links to each size's report).
    """
    from models import train
    from stage import open_stores

    check_metric(metric)   # before anything trains: the metric is only read after the last size
    paths = [data_dirs] if isinstance(data_dirs, (str, Path)) else list(data_dirs)
    with open_stores(paths) as stores:
        n_total = len(stores.indices("train"))
        if eval_cfg.split not in ("train", "all") and not stores.indices(eval_cfg.split_filter()):
            raise ScalingInputError(f"the data holds no '{eval_cfg.split}' samples to evaluate each size on; "
                                    f"simulate more materials, change data.split_fractions or evaluation.split")
    sizes = training_sizes(n_total, fractions, min_size=int(train_cfg.batch_size))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    # A subset smaller than one batch cannot train: the smallest fractions are raised to a batch.
    for n in sizes:
        run_dir = out / f"n{n:06d}"
        result = train(model_cfg, train_cfg.model_copy(update={"max_train_samples": n}), dist_cfg, data_cfg,
                       paths, run_dir, resume=True)
        ev = evaluate(eval_cfg, data_cfg, paths, result.model_dir, run_dir / "eval",
                      train_metrics_csv=result.metrics_csv)
        doc = json.loads(Path(ev.metrics_json).read_text())
        row: dict[str, Any] = {"n_train": n, "fraction": n / n_total, "model_dir": str(result.model_dir),
                               "eval_dir": str(ev.out_dir), "steps": result.steps}
        for target, agg in doc["aggregates"].items():
            row[target] = {m: agg[m][HEADLINE][metric] for m in agg}
        rows.append(row)
    target = next(iter(doc["targets"]))
    net = [r[target][NETWORK] for r in rows]
    # the baselines do not depend on the training-set size: the last size's values are drawn as lines
    refs = {m.name: rows[-1][target][m.name]["value"] for m in in_panel_order(baselines()) if m.name in rows[-1][target]}
    fig = figures.scaling_curve(out / f"scaling_{metric}.png", [r["n_train"] for r in rows],
                                [v["value"] for v in net], [v["low"] for v in net], [v["high"] for v in net],
                                metric, target, refs)
    summary = {"n_train_total": n_total, "fractions": list(fractions), "metric": metric, "target": target,
               "rows": rows, "figure": str(fig)}
    json_path = out / "scaling.json"
    json_path.write_text(json.dumps(summary, indent=1))
    summary["json"] = str(json_path)
    summary["report"] = str(write_html(out / "report.html", render_scaling(summary, out)))
    return summary
