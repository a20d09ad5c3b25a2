"""`evaluate`: score a trained reconstructor and its baselines on held-out samples.

For each sample of the chosen split: the network's prediction (`models.load_reconstructor`), the
mean-training-target baseline and the least-squares-scaled iCoM and (optional) ptychography
baselines are compared with the true projected potential / density, in physical units and after
the training normalisation, and each method's compute time per sample is recorded. Everything
lands in ``out_dir``: ``metrics.json`` (per-sample records, aggregates with bootstrap confidence
intervals, breakdowns, the verdict of the network against each baseline, compute times), PNG
figures and ``report.html``.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from models import metrics as M
from namsa.errors import UserError

from . import figures, report
from .baselines import icom_baseline, mean_training_targets, ptycho_baseline
from .config import EvaluationConfig
from .verdict import HEADLINE_METRICS, all_verdicts

#: whole-map metrics, in the order the report shows them; True = higher is better.
IMAGE_METRICS: dict[str, bool] = HEADLINE_METRICS
#: column-position metrics (physical units only: positions do not depend on normalisation).
COLUMN_METRICS: dict[str, bool] = {"mean_error_A": False, "recall": True}
METHODS: tuple[str, ...] = ("network", "mean", "icom", "ptycho")
#: methods computed from the CBED stack, whose compute time per sample is recorded.
TIMED_METHODS: tuple[str, ...] = ("network", "icom", "ptycho")
#: classical baselines put into the truth's units by a per-sample least-squares fit (potential only).
FITTED_BASELINES: tuple[str, ...] = ("icom", "ptycho")
UNITS: tuple[str, ...] = ("physical", "normalized")
#: what models.train writes beside the model directory it makes (marks a training run directory)
TRAIN_RUN_FILE = "train_run.json"
#: element classes of the breakdown by atomic number (heaviest element of the sample).
Z_CLASSES: tuple[tuple[str, int], ...] = (("light (Z<=14)", 14), ("medium (15<=Z<=36)", 36), ("heavy (Z>=37)", 999))


class EvaluationInputError(UserError):
    """The data, model or configuration handed to `evaluate` cannot be evaluated."""


@dataclass
class EvalResult:
    """What `evaluate` wrote and its headline numbers.

    headline[target][method] = {metric: mean over samples} (physical units), methods
    ``network``, ``mean``, ``icom``, ``ptycho`` where computed.
    verdicts[target][baseline] = `verdict.Verdict.as_dict()` (``beats``, ``sentence``, ...).
    compute_seconds[method] = {mean, median, max, total, n}: seconds per sample.
    """

    out_dir: Path
    metrics_json: Path
    report_html: Path
    figures: list[Path] = field(default_factory=list)
    headline: dict[str, dict[str, dict[str, float | None]]] = field(default_factory=dict)
    n_samples: int = 0
    verdicts: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    compute_seconds: dict[str, dict[str, float]] = field(default_factory=dict)


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
    if eval_cfg.ptycho:
        from .ptycho import require_py4dstem

        require_py4dstem()   # fail before any work, and keep the one-off import out of the timings
    rec = load_reconstructor(model_dir)
    targets = _resolve_targets(eval_cfg.targets, list(rec.targets))
    with open_stores(_as_list(data_dirs)) as stores:
        indices = stores.indices(eval_cfg.split)[: eval_cfg.max_samples]
        if not indices:
            raise EvaluationInputError(
                f"{stores.describe()} hold no '{eval_cfg.split}' samples (counts {stores.manifest['counts']}); "
                f"simulate more materials, change data.split_fractions, or set evaluation.split")
        mean_maps = mean_training_targets(stores, targets) if eval_cfg.mean_baseline else None
        records, kept = _score_all(eval_cfg, stores, indices, rec, targets, mean_maps)
        worst = {t: [r["index"] for r in _worst_records(records, t, eval_cfg.worst_k)] for t in targets}
        again = sorted({i for rows in worst.values() for i in rows} - set(kept))
        kept.update(_recompute(eval_cfg, stores, again, rec, targets, mean_maps))
        data_info = _data_summary(stores, data_cfg, eval_cfg.split)
    aggregates = {t: _aggregate(records, t, eval_cfg) for t in targets}
    breakdowns = {t: {key: _breakdown(records, t, key, eval_cfg) for key in report.BREAKDOWN_KEYS}
                  for t in targets}
    versus = {t: _network_vs_icom(records, t, eval_cfg) for t in targets if eval_cfg.icom and t == "potential"}
    headline = {t: {m: {k: v["physical"][k]["value"] for k in IMAGE_METRICS} for m, v in aggregates[t].items()}
                for t in targets}
    verdicts = all_verdicts(aggregates, intervals=eval_cfg.n_bootstrap > 0, ci_level=eval_cfg.ci_level)
    timings = _compute_seconds(records)
    csv_path = _find_metrics_csv(train_metrics_csv, Path(model_dir), rec.card)
    figs = figures.draw_all(fig_dir, records, kept, targets, eval_cfg,
                            first=[r["index"] for r in records[: eval_cfg.n_panels]],
                            worst=worst, metrics_csv=csv_path)
    doc = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.time() - started, 2),
        "config": eval_cfg.model_dump(),
        "model_dir": str(Path(model_dir).resolve()),
        "model_card": _jsonable(rec.card),
        "normalizer": rec.normalizer.to_dict() if hasattr(rec.normalizer, "to_dict") else None,
        "data": data_info,
        "targets": targets,
        "methods": _methods_present(records, targets),
        "conventions": CONVENTIONS,
        "headline": headline,
        "aggregates": aggregates,
        "breakdowns": breakdowns,
        "network_vs_icom": versus,
        "verdicts": verdicts,
        "compute_seconds": timings,
        "worst": worst,
        "samples": records,
        "figures": {name: str(path.relative_to(out)) for name, path in figs.items()},
        "train_metrics_csv": str(csv_path) if csv_path else None,
    }
    metrics_path = out / "metrics.json"
    _write_json(metrics_path, doc)
    html_path = report.write_report(out / "report.html", doc)
    return EvalResult(out, metrics_path, html_path, list(figs.values()), headline, len(records), verdicts, timings)


CONVENTIONS = {
    "physical_units": {"potential": "V*Angstrom (projected potential)",
                       "density": "electrons/Angstrom^2 (projected electron density)"},
    "normalized_units": "(y - mean) / std with the target statistics of the training split (the model's Normalizer)",
    "rel_l2": "||pred - true||_2 / ||true||_2",
    "psnr_db": "10 log10(R^2 / MSE), R = max(true) - min(true) of each sample's truth",
    "ssim": "Wang et al. 2004, Gaussian window sigma 1.5 px (11 taps), K1 0.01, K2 0.03, periodic borders, "
            "R as for PSNR",
    "pearson_r": "Pearson correlation of the pixels; 0 for a constant map",
    "columns": "local maxima of the truth (atomic columns) matched to maxima of the estimate (Hungarian, "
               "periodic); mean distance in Angstrom, recall = matched / true columns",
    "ci": "percentile bootstrap over samples of the mean",
    "icom_fit": "iCoM map scaled and offset to the truth by least squares per sample (uses the truth "
                "for these 2 scalars only)",
    "ptycho_fit": "single-slice ptychography (py4DSTEM) phase / interaction constant, scaled and offset to "
                  "the truth by least squares per sample (uses the truth for these 2 scalars only)",
    "verdict": "the network 'beats' a baseline only when it is better on every headline metric (rel_l2, "
               "psnr_db, ssim, pearson_r; physical units) with non-overlapping bootstrap intervals",
    "compute_seconds": "wall seconds per sample in this process: network = Reconstructor.predict of a batch "
                       "(normalisation included) / batch size; icom, ptycho = that sample's reconstruction "
                       "(ptycho without the one-off py4DSTEM import)",
    "mean_baseline": "pixel-wise mean of the training-split targets",
}


# --------------------------------------------------------------------------- scoring

def _score_all(cfg: EvaluationConfig, stores: Any, indices: list[int], rec: Any, targets: list[str],
               mean_maps: dict[str, np.ndarray] | None) -> tuple[list[dict], dict[int, dict]]:
    """Per-sample records for every index; full arrays kept for the first ``n_panels`` samples."""
    records: list[dict] = []
    kept: dict[int, dict] = {}
    for batch in _batches(indices, cfg.batch_size):
        for index, sample, preds, net_s in _predict(stores, batch, rec, targets):
            maps, seconds = _method_maps(cfg, sample, preds, targets, mean_maps)
            records.append(_score_sample(cfg, index, sample, maps, rec.normalizer, {"network": net_s, **seconds}))
            if len(kept) < cfg.n_panels:
                kept[index] = _keep(sample, maps, cfg.n_cbed_panels)
    return records, kept


def _recompute(cfg: EvaluationConfig, stores: Any, indices: list[int], rec: Any, targets: list[str],
               mean_maps: dict[str, np.ndarray] | None) -> dict[int, dict]:
    """Arrays of a few samples again (the worst cases), rather than holding every map in memory."""
    kept = {}
    for index, sample, preds, _ in _predict(stores, indices, rec, targets):
        kept[index] = _keep(sample, _method_maps(cfg, sample, preds, targets, mean_maps)[0], cfg.n_cbed_panels)
    return kept


def _predict(stores: Any, indices: list[int], rec: Any,
             targets: list[str]) -> Iterable[tuple[int, Any, dict, float]]:
    """(index, sample, {target: prediction}, network seconds per sample) for each index."""
    if not indices:
        return
    samples = [stores[i] for i in indices]
    stack = np.stack([s.cbed.astype(np.float32) for s in samples])
    t0 = time.perf_counter()
    out = np.asarray(_to_numpy(rec.predict(stack)), dtype=np.float32)   # to numpy: waits for a GPU
    per_sample = (time.perf_counter() - t0) / len(samples)
    out = out.reshape(len(samples), len(rec.targets), *out.shape[-2:])
    names = list(rec.targets)
    for k, (index, sample) in enumerate(zip(indices, samples)):
        yield index, sample, {t: out[k, names.index(t)] for t in targets}, per_sample


def _method_maps(cfg: EvaluationConfig, sample: Any, preds: dict[str, np.ndarray], targets: list[str],
                 mean_maps: dict[str, np.ndarray] | None) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """(maps, seconds): maps[target] = {"truth", "network", "mean"?, "icom"?, "ptycho"?, "<m>_fit"?}
    in physical units; seconds[method] = compute time of the classical baselines for this sample."""
    maps: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    for t in targets:
        truth = np.asarray(getattr(sample, t), dtype=np.float32)
        entry: dict[str, Any] = {"truth": truth, "network": preds[t]}
        if mean_maps is not None:
            entry["mean"] = mean_maps[t]
        if cfg.icom and t == "potential":
            t0 = time.perf_counter()
            entry["icom"], entry["icom_fit"] = icom_baseline(sample, truth)
            seconds["icom"] = time.perf_counter() - t0
        if cfg.ptycho and t == "potential":
            entry["ptycho"], entry["ptycho_fit"] = ptycho_baseline(sample, truth, cfg.ptycho_iterations,
                                                                   cfg.ptycho_batch_size)
            seconds["ptycho"] = entry["ptycho_fit"]["seconds"]
        maps[t] = entry
    return maps, seconds


def _score_sample(cfg: EvaluationConfig, index: int, sample: Any, maps: dict[str, dict[str, Any]],
                  normalizer: Any, seconds: dict[str, float]) -> dict[str, Any]:
    meta = sample.meta
    record = {"index": int(index), **_sample_facts(meta, cfg.thickness_bins_A), "metrics": {},
              **{f"{m}_fit": None for m in FITTED_BASELINES}, "seconds": seconds}
    pixel = _pixel_size_A(meta, next(iter(maps.values()))["truth"].shape)
    for t, entry in maps.items():
        truth = entry["truth"]
        truth_n = np.asarray(normalizer.target(truth, t))
        per_method = {}
        for method in METHODS:
            if method not in entry:
                continue
            est = entry[method]
            cols = M.column_position_error(est, truth, pixel, min_distance_px=cfg.column_min_distance_px,
                                           threshold_rel=cfg.column_threshold_rel)
            per_method[method] = {
                "physical": {**M.image_metrics(est, truth), "mean_error_A": cols.mean_error_A,
                             "recall": cols.recall, "n_columns": cols.n_true},
                "normalized": M.image_metrics(np.asarray(normalizer.target(est, t)), truth_n),
            }
        record["metrics"][t] = per_method
        for m in FITTED_BASELINES:
            if f"{m}_fit" in entry:
                record[f"{m}_fit"] = entry[f"{m}_fit"]
    return _jsonable(record)


def _keep(sample: Any, maps: dict[str, dict[str, Any]], n_cbed: int) -> dict[str, Any]:
    """What the figures need of one sample: a few CBED patterns and the maps."""
    s = sample.cbed.shape[0]
    picks = sorted({int(round(v)) for v in np.linspace(0, s - 1, n_cbed)}) if n_cbed else []
    return {"sample_id": sample.id, "cbed": {i: np.asarray(sample.cbed[i], dtype=np.float32) for i in picks},
            "maps": {t: {k: v for k, v in e.items() if not k.endswith("_fit")} for t, e in maps.items()},
            "meta": sample.meta}


def _sample_facts(meta: dict, thickness_bins: Sequence[float]) -> dict[str, Any]:
    from ase.data import atomic_numbers

    elements = [str(e) for e in meta.get("elements", [])]
    zs = {e: atomic_numbers.get(e, 0) for e in elements}
    heaviest = max(zs, key=zs.get) if zs else "?"
    max_z = zs.get(heaviest, 0)
    thickness = float(meta.get("thickness_A", float("nan")))
    return {
        "sample_id": str(meta.get("sample_id")),
        "material_id": str(meta.get("material_id")),
        "formula": str(meta.get("formula", "")),
        "elements": elements,
        "zone_axis": "[" + " ".join(str(int(v)) for v in meta.get("zone_axis", [])) + "]",
        "thickness_A": thickness,
        "heaviest_element": heaviest,
        "max_Z": int(max_z),
        "z_class": next(name for name, top in Z_CLASSES if max_z <= top),
        "thickness_class": _thickness_class(thickness, thickness_bins),
    }


def _thickness_class(thickness: float, edges: Sequence[float]) -> str:
    edges = sorted(float(e) for e in edges)
    if not math.isfinite(thickness):
        return "unknown"
    lo = 0.0
    for hi in edges:
        if thickness < hi:
            return f"{lo:g}-{hi:g} A"
        lo = hi
    return f">={lo:g} A"


def _pixel_size_A(meta: dict, shape: tuple[int, ...]) -> tuple[float, float]:
    """Angstrom per target pixel: the field of view over the target grid."""
    fov = meta.get("fov_A")
    if fov is None:
        return (1.0, 1.0)
    return (float(fov[2]) / shape[0], float(fov[3]) / shape[1])


# --------------------------------------------------------------------------- aggregation

def _values(records: list[dict], target: str, method: str, units: str, metric: str) -> list[float | None]:
    return [r["metrics"][target][method][units].get(metric) for r in records if method in r["metrics"][target]]


def _aggregate(records: list[dict], target: str, cfg: EvaluationConfig) -> dict[str, Any]:
    """aggregates[method][units][metric] = {value (mean), low, high, n, n_nonfinite, median}."""
    out: dict[str, Any] = {}
    for method in _methods_present(records, [target])[target]:
        out[method] = {}
        for units in UNITS:
            names = list(IMAGE_METRICS) + (list(COLUMN_METRICS) if units == "physical" else [])
            out[method][units] = {name: _interval(_values(records, target, method, units, name), cfg)
                                  for name in names}
    return out


def _interval(values: list[float | None], cfg: EvaluationConfig) -> dict[str, Any]:
    ci = M.bootstrap_ci(values, n_resamples=cfg.n_bootstrap, level=cfg.ci_level, seed=cfg.seed).as_dict()
    finite = [v for v in values if v is not None and math.isfinite(v)]
    ci["median"] = float(np.median(finite)) if finite else None
    return ci


def _breakdown(records: list[dict], target: str, key: str, cfg: EvaluationConfig) -> dict[str, Any]:
    """groups[value][method] = {metric: mean over the group's samples, "n": count}."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(str(r[key]), []).append(r)
    table = {}
    for name in sorted(groups):
        rows = groups[name]
        table[name] = {"n": len(rows)}
        for method in _methods_present(rows, [target])[target]:
            table[name][method] = {m: _mean_finite(_values(rows, target, method, "physical", m))
                                   for m in list(IMAGE_METRICS) + list(COLUMN_METRICS)}
    return table


def _network_vs_icom(records: list[dict], target: str, cfg: EvaluationConfig) -> dict[str, Any]:
    """Where the network beats iCoM (lower relative L2), overall and per element and thickness class."""
    def summary(rows: list[dict]) -> dict[str, Any]:
        pairs = [(r["metrics"][target]["network"]["physical"]["rel_l2"],
                  r["metrics"][target]["icom"]["physical"]["rel_l2"]) for r in rows if "icom" in r["metrics"][target]]
        if not pairs:
            return {"n": 0, "network_wins": 0, "win_rate": None, "mean_rel_l2_gap": None}
        wins = sum(1 for n, i in pairs if n < i)
        return {"n": len(pairs), "network_wins": wins, "win_rate": wins / len(pairs),
                "mean_rel_l2_gap": _mean_finite([i - n for n, i in pairs])}

    out: dict[str, Any] = {"overall": summary(records)}
    for key in ("z_class", "thickness_class"):
        groups: dict[str, list[dict]] = {}
        for r in records:
            groups.setdefault(str(r[key]), []).append(r)
        out[key] = {name: summary(rows) for name, rows in sorted(groups.items())}
    return out


def _compute_seconds(records: list[dict]) -> dict[str, dict[str, float]]:
    """seconds[method] = {mean, median, max, total, n} of the per-sample compute times."""
    out = {}
    for method in TIMED_METHODS:
        values = [r["seconds"][method] for r in records if r["seconds"].get(method) is not None]
        if values:
            out[method] = {"mean": float(np.mean(values)), "median": float(np.median(values)),
                           "max": float(np.max(values)), "total": float(np.sum(values)), "n": len(values)}
    return out


def _worst_records(records: list[dict], target: str, k: int) -> list[dict]:
    """The ``k`` records with the largest network relative L2 on ``target``."""
    def err(r: dict) -> float:
        v = r["metrics"][target]["network"]["physical"]["rel_l2"]
        return -math.inf if v is None else v
    return sorted(records, key=err, reverse=True)[:k]


def _methods_present(records: list[dict], targets: list[str]) -> dict[str, list[str]]:
    return {t: [m for m in METHODS if any(m in r["metrics"][t] for r in records)] for t in targets}


def _mean_finite(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite)) if finite else None


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


def _find_metrics_csv(given: str | Path | None, model_dir: Path, card: dict | None) -> Path | None:
    """The training metrics CSV for the learning-curve figure.

    ``given`` (the caller's, e.g. the DAG's) is used as given. A model directory is a file someone
    may have sent, so the card's ``metrics_csv`` is never opened where it points: only its file
    name is looked up inside the model directory, then ``metrics.csv`` there or in the training
    run directory that holds the model (one with ``train_run.json``); a candidate that resolves
    (through a symbolic link) outside those directories is not read.
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
    if isinstance(card, dict) and isinstance(card.get("metrics_csv"), str) and card["metrics_csv"].strip():
        name = Path(card["metrics_csv"].replace("\\", "/")).name
        if name not in ("", ".", ".."):
            candidates.append(model_dir / name)
    candidates.append(model_dir / "metrics.csv")
    if (model_dir.parent / TRAIN_RUN_FILE).is_file():   # the model sits in its training run directory
        homes.append(model_dir.parent.resolve())
        candidates.append(model_dir.parent / "metrics.csv")
    return next((c for c in candidates if c.is_file() and any(c.resolve().is_relative_to(h) for h in homes)), None)


def _batches(items: list[int], size: int) -> Iterable[list[int]]:
    for start in range(0, len(items), size):
        yield items[start: start + size]


def _as_list(paths: str | Path | Sequence[str | Path]) -> list[str | Path]:
    return [paths] if isinstance(paths, (str, Path)) else list(paths)


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)


def _jsonable(obj: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, non-finite floats to None (JSON has no inf/NaN)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(float(obj)) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(doc), indent=1, allow_nan=False))
    tmp.replace(path)
