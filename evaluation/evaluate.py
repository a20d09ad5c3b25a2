"""`evaluate`: score a trained reconstructor and its baselines on held-out samples.

For each sample of the chosen split: the network's prediction (`models.load_reconstructor`) and every
baseline the config asks for (`methods.REGISTRY`; what each requires is checked first), each a map in
its own physical units, are compared with the true projected potential / density in every view
(`evaluation.views`): the field's rule (the headline: only each map's mean set to the truth's),
structure only (one least-squares scale and offset for every method) and the legacy rule (the network
as predicted, the baselines least-squares fitted); with the network's level error and each method's
compute time per sample. Everything lands in ``out_dir``: ``metrics.json`` (per-sample records,
aggregates with bootstrap confidence intervals over materials, breakdowns, the verdict of the network
against each baseline overall and per element class, compute times), PNG figures and ``report.html``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from namsa.errors import UserError
from stage.jsonfile import write_json_atomic

from . import figures, report
from .aggregation import (VERSUS, aggregate, breakdown, class_aggregates, compute_seconds, headline_of,
                          methods_present, missing_metrics, network_vs_reference, subset_aggregates, worst_records)
from .baselines import mean_training_targets
from .config import EvaluationConfig
from .conventions import CONVENTIONS
from .dose_sweep import dose_sweep
from .methods import MEAN, check_requirements, reference
from .scoring import jsonable, recompute, score_all
from .verdict import all_verdicts

#: what models.train writes beside the model directory it makes (marks a training run directory)
TRAIN_RUN_FILE = "train_run.json"


class EvaluationInputError(UserError):
    """The data, model or configuration handed to `evaluate` cannot be evaluated."""


@dataclass
class EvalResult:
    """What `evaluate` wrote and its headline numbers.

    headline[target][method][view] = {metric: mean over samples} in every view (`views.VIEWS`; the
    field's rule is the headline) of every method of `methods.REGISTRY` computed, and the network's
    ``level`` = {"level_error", "level_error_median"} (`aggregation.headline_of`).
    verdicts[target][baseline] = `verdict.all_verdicts`' entry: `verdict.Verdict.as_dict()` of the
    overall verdict (``beats``, ``status``, ...) with ``by_class`` (per element class),
    ``overall_sentence`` and ``sentence`` (overall then per class: what is printed).
    compute_seconds[method] = {mean, median, max, total, n}: seconds per sample.
    dose_sweep: `evaluation.dose_sweep.dose_sweep`'s entries, one per ``evaluation.doses``.
    warnings: sentences on metrics that have no value for some samples (`aggregation.missing_metrics`).
    """

    out_dir: Path
    metrics_json: Path
    report_html: Path
    figures: list[Path] = field(default_factory=list)
    headline: dict[str, dict[str, dict[str, float | None]]] = field(default_factory=dict)
    n_samples: int = 0
    verdicts: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    compute_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    dose_sweep: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def evaluate(eval_cfg: EvaluationConfig, data_cfg: Any, data_dirs: str | Path | Sequence[str | Path],
             model_dir: str | Path, out_dir: str | Path, train_metrics_csv: str | Path | None = None) -> EvalResult:
    """Evaluate the reconstructor in ``model_dir`` on ``eval_cfg.split`` of the stores in ``data_dirs``.

    data_cfg: the `stage.DataConfig` the data was written/split with (recorded in the report).
    train_metrics_csv: the training metrics CSV (learning curves); default: the model card's
    ``metrics_csv`` entry or ``<model_dir>/metrics.csv`` / ``<model_dir>/../metrics.csv`` if present.
    """
    from models import load_reconstructor
    from stage import open_stores

    out = Path(out_dir)
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    check_requirements(eval_cfg)   # fail before any work, and keep one-off imports out of the timings
    rec = load_reconstructor(model_dir)
    targets = _resolve_targets(eval_cfg.targets, list(rec.targets))
    with open_stores(_as_list(data_dirs)) as stores:
        indices = stores.indices(eval_cfg.split_filter())[: eval_cfg.max_samples]
        if not indices:
            raise EvaluationInputError(
                f"{stores.describe()} hold no '{eval_cfg.split}' samples (counts {stores.manifest['counts']}); "
                f"simulate more materials, change data.split_fractions, or set evaluation.split")
        mean_maps = mean_training_targets(stores, targets) if eval_cfg.mean_baseline else None
        absent = _absent_baselines(eval_cfg, mean_maps)
        records, kept = score_all(eval_cfg, stores, indices, rec, targets, mean_maps)
        worst = {t: [r["index"] for r in worst_records(records, t, eval_cfg.worst_k)] for t in targets}
        # the worst cases and the median sample (the report's typical-sample picture), each map made again
        typical = {i for t in targets if (i := figures.median_index(records, t)) is not None}
        again = sorted(({i for rows in worst.values() for i in rows} | typical) - set(kept))
        kept.update(recompute(eval_cfg, stores, again, rec, targets, mean_maps))
        data_info = _data_summary(stores, data_cfg, eval_cfg.split)
        doses = dose_sweep(eval_cfg, stores, indices, rec, targets, mean_maps, absent)
    aggregates = {t: aggregate(records, t, eval_cfg) for t in targets}
    breakdowns = {t: {key: breakdown(records, t, key, eval_cfg) for key in report.BREAKDOWN_KEYS}
                  for t in targets}
    ref = reference()
    versus = {t: network_vs_reference(records, t, eval_cfg) for t in targets
              if ref.enabled(eval_cfg) and t in ref.targets}
    headline = headline_of(aggregates)
    by_class = {t: class_aggregates(records, t, eval_cfg) for t in targets}
    verdicts = all_verdicts(aggregates, intervals=eval_cfg.n_bootstrap > 0, ci_level=eval_cfg.ci_level,
                            by_class=by_class, absent=absent,
                            paired={t: subset_aggregates(records, t, eval_cfg) for t in targets})
    timings = compute_seconds(records)
    missing = missing_metrics(records, targets)
    csv_path = _find_metrics_csv(train_metrics_csv, Path(model_dir), rec.card.metrics_csv)
    figs = figures.draw_all(fig_dir, records, kept, targets, aggregates, by_class,
                            first=[r["index"] for r in records[: eval_cfg.n_panels]],
                            worst=worst, metrics_csv=csv_path)
    doc = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.time() - started, 2),
        "config": eval_cfg.model_dump(),
        "model_dir": str(Path(model_dir).resolve()),
        "model_card": rec.card.to_json(),
        "normalizer": rec.normalizer.to_dict() if hasattr(rec.normalizer, "to_dict") else None,
        "data": data_info,
        "targets": targets,
        "methods": methods_present(records, targets),
        "conventions": CONVENTIONS,
        "headline": headline,
        "aggregates": aggregates,
        "class_aggregates": by_class,
        "absent_baselines": absent,
        "breakdowns": breakdowns,
        VERSUS: versus,
        "verdicts": verdicts,
        "compute_seconds": timings,
        "dose_sweep": doses,
        "worst": worst,
        "samples": records,
        "figures": {name: str(path.relative_to(out)) for name, path in figs.items()},
        "train_metrics_csv": str(csv_path) if csv_path else None,
        "warnings": missing,
    }
    metrics_path = out / "metrics.json"
    write_json_atomic(metrics_path, jsonable(doc), allow_nan=False)
    html_path = report.write_report(out / "report.html", doc)
    return EvalResult(out, metrics_path, html_path, list(figs.values()), headline, len(records), verdicts, timings,
                      doses, missing)


def _absent_baselines(cfg: EvaluationConfig, mean_maps: dict | None) -> dict[str, str]:
    """{baseline: why it is absent} for the mean baseline when it could not be or was not computed."""
    if not cfg.mean_baseline:
        return {MEAN: "not computed (evaluation.mean_baseline is off)"}
    if mean_maps is None:
        return {MEAN: "not computed: the evaluated stores hold no training samples to average (a mean of the "
                        "evaluated samples' own targets would use the truth it is scored against); evaluate with "
                        "the training stores beside them to get it"}
    return {}


# --------------------------------------------------------------------------- inputs and outputs

def _resolve_targets(asked: list[str] | None, predicted: list[str]) -> list[str]:
    if asked is None:
        return list(predicted)
    missing = [t for t in asked if t not in predicted]
    if missing:
        raise EvaluationInputError(f"evaluation.targets asks for {missing} but the model predicts only "
                                   f"{predicted}; set evaluation.targets to a subset of {predicted}")
    return list(asked)


def _data_summary(stores: Any, data_cfg: Any, split: str) -> dict[str, Any]:
    """What the model was trained and evaluated on: stores, counts, materials per split."""
    materials: dict[str, set[str]] = {}
    for manifest in stores.manifests:
        for s in manifest.get("samples", []):
            materials.setdefault(s["split"], set()).add(s["material_id"])
    first = stores.manifests[0] if stores.manifests else {}
    return {
        "stores": stores.manifest.get("stores", []),
        "counts": stores.manifest.get("counts", {}),
        "arrays": stores.manifest.get("arrays", {}),
        "config_hash": first.get("config_hash"),
        "code_version": first.get("code_version"),
        "materials": {k: sorted(v) for k, v in sorted(materials.items())},
        "evaluated_split": split,
        "data_config": data_cfg.model_dump() if hasattr(data_cfg, "model_dump") else None,
    }


def _find_metrics_csv(given: str | Path | None, model_dir: Path, card_csv: str | None) -> Path | None:
    """The training metrics CSV for the learning-curve figure.

    ``given`` (the caller's, e.g. the DAG's) is used as given. A model directory is a file someone
    may have sent, so the card's ``metrics_csv`` is never opened where it points: only its file
    name is looked up inside the model directory, then ``metrics.csv`` there or in the training
    run directory that holds the model (one with ``train_run.json``); a candidate that is a symbolic
    link, or resolves outside those directories, is not read.
    """
    if given is not None:
        path = Path(given)
        if not path.is_file():
            raise EvaluationInputError(f"training metrics CSV {path} does not exist; pass the metrics.csv "
                                       f"written by namsa train, or leave it out")
        return path
    model_dir = Path(model_dir)
    homes = [model_dir.resolve()]
    candidates = []
    if card_csv and card_csv.strip():
        name = Path(card_csv.replace("\\", "/")).name
        if name not in ("", ".", ".."):
            candidates.append(model_dir / name)
    candidates.append(model_dir / "metrics.csv")
    if (model_dir.parent / TRAIN_RUN_FILE).is_file():   # the model sits in its training run directory
        homes.append(model_dir.parent.resolve())
        candidates.append(model_dir.parent / "metrics.csv")
    return next((c for c in candidates if c.is_file() and not c.is_symlink()
                 and any(c.resolve().is_relative_to(h) for h in homes)), None)


def _as_list(paths: str | Path | Sequence[str | Path]) -> list[str | Path]:
    return [paths] if isinstance(paths, (str, Path)) else list(paths)
