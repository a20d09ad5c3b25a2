"""Per-sample scoring: the network's prediction and every baseline's map for each sample of the
split, each in its own physical units, scored against the truth in every view (`evaluation.views`:
the field's rule, structure only, the legacy rule) with the network's level error and compute times."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from namsa.kirkland import LIGHT_MAX_Z
from namsa.sample_meta import SampleMeta
from namsa.targets import TARGETS_VERSION, to_target_resolution

from . import metrics as M
from .config import EvaluationConfig
from .methods import MEAN, NETWORK, REGISTRY, Method, Subset, per_sample
from .views import FIELD, LEGACY, LEVEL, STRUCTURE, field_map, level_error, view_maps

#: the element classes, the one classification of samples by their elements that the verdict, the
#: breakdowns, the comparison with iCoM, the figures and the report all use: light where iCoM's weak-phase
#: picture holds best (every element Z <= 14), heavy the rest. A sample whose elements are unknown is in
#: neither ("unknown"). Finer detail is the heaviest element itself (``heaviest_element``, ``max_Z``).
LIGHT_CLASS = "light (every element Z <= 14)"
HEAVY_CLASS = "heavy (an element with Z > 14)"
ELEMENT_CLASSES: tuple[str, str] = (LIGHT_CLASS, HEAVY_CLASS)


def score_all(cfg: EvaluationConfig, stores: Any, indices: list[int], rec: Any, targets: list[str],
              mean_maps: dict[str, np.ndarray] | None,
              methods: tuple[Method, ...] = REGISTRY) -> tuple[list[dict], dict[int, dict]]:
    """Per-sample records for every index; full arrays kept for the first ``n_panels`` samples.
    methods: the records to run where ``cfg`` enables them (the dose sweep passes its own)."""
    records: list[dict] = []
    kept: dict[int, dict] = {}
    subsets = subset_rules(cfg, targets, methods)
    for batch in _batches(indices, cfg.batch_size):
        for index, sample, preds, net_s in _predict(stores, batch, rec, targets, cfg.symmetry_average):
            due = {name: rule for name, rule in subsets.items() if rule.take(sample.meta)}
            maps, seconds = _method_maps(cfg, sample, preds, targets, mean_maps, due, methods)
            records.append(_score_sample(cfg, index, sample, maps, {NETWORK: net_s, **seconds}))
            if len(kept) < cfg.n_panels:
                kept[index] = _keep(sample, maps, cfg.n_cbed_panels)
    return records, kept


def subset_rules(cfg: EvaluationConfig, targets: list[str], methods: tuple[Method, ...] = REGISTRY
                 ) -> dict[str, Subset]:
    """{method: its subset rule, fresh for this run} of the enabled subset methods with a target here."""
    return {m.name: m.subset(cfg) for m in methods
            if m.subset is not None and m.enabled(cfg) and set(m.targets) & set(targets)}


def recompute(cfg: EvaluationConfig, stores: Any, indices: list[int], rec: Any, targets: list[str],
              mean_maps: dict[str, np.ndarray] | None) -> dict[int, dict]:
    """Arrays of a few samples again (the worst cases), rather than holding every map in memory.
    A subset method (multislice ptychography: minutes per sample) is not rerun for them."""
    kept = {}
    for index, sample, preds, _ in _predict(stores, indices, rec, targets, cfg.symmetry_average):
        kept[index] = _keep(sample, _method_maps(cfg, sample, preds, targets, mean_maps)[0], cfg.n_cbed_panels)
    return kept


def _predict(stores: Any, indices: list[int], rec: Any, targets: list[str],
             symmetry_average: bool) -> Iterable[tuple[int, Any, dict, float]]:
    """(index, sample, {target: prediction}, network seconds per sample) for each index;
    ``symmetry_average``: `EvaluationConfig.symmetry_average`."""
    if not indices:
        return
    samples = [stores[i] for i in indices]
    stack = np.stack([s.cbed.astype(np.float32) for s in samples])
    t0 = time.perf_counter()
    # each sample's own scan calibration (its supercell's steps): physics inputs and the turns that swap y and x need it
    calibration = [s.meta.calibration for s in samples]
    out = np.asarray(_to_numpy(rec.predict(stack, calibration=calibration,
                                           symmetry_average=None if symmetry_average else False)),
                     dtype=np.float32)   # to numpy: waits for a GPU
    seconds_each = (time.perf_counter() - t0) / len(samples)
    out = out.reshape(len(samples), len(rec.targets), *out.shape[-2:])
    names = list(rec.targets)
    for k, (index, sample) in enumerate(zip(indices, samples)):
        yield index, sample, {t: _as_trained(rec, sample.meta, out[k, names.index(t)]) for t in targets}, seconds_each


def _as_trained(rec: Any, meta: SampleMeta, prediction: np.ndarray) -> np.ndarray:
    """A model trained on the old hard-cutoff targets (`Reconstructor.targets_version` 1) predicts
    sharper, ringing maps than today's Gaussian targets: they are compared at the targets' stated
    resolution (`namsa.targets.to_target_resolution`), as ptychography is; a current model as is."""
    if rec.targets_version >= TARGETS_VERSION or not meta.target_fwhm_A:
        return prediction
    return to_target_resolution(prediction, meta.fov_A, float(meta.target_fwhm_A)).astype(np.float32)


def _method_maps(cfg: EvaluationConfig, sample: Any, preds: dict[str, np.ndarray], targets: list[str],
                 mean_maps: dict[str, np.ndarray] | None, due: dict[str, Subset] | None = None,
                 methods: tuple[Method, ...] = REGISTRY) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """(maps, seconds): maps[target] = {"truth", <method>: map, "<method>_fit": facts of its computation},
    each map in its own physical units (none fitted to the truth), for the network, the mean image (with
    ``mean_maps``) and every per-sample method of ``methods`` that ``cfg`` enables for the target (a
    subset method only when ``due`` holds it); seconds[method] = compute time of the per-sample methods."""
    due = due or {}
    maps: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    for t in targets:
        truth = np.asarray(getattr(sample, t), dtype=np.float32)
        entry: dict[str, Any] = {"truth": truth, NETWORK: preds[t]}
        if mean_maps is not None:
            entry[MEAN] = mean_maps[t]
        for m in per_sample(cfg, t):
            if m in methods and (m.subset is None or m.name in due):
                entry[m.name], entry[f"{m.name}_fit"], seconds[m.name] = m.compute(cfg, sample, truth.shape, preds,
                                                                                    due.get(m.name))
        maps[t] = entry
    return maps, seconds


def _score_sample(cfg: EvaluationConfig, index: int, sample: Any, maps: dict[str, dict[str, Any]],
                  seconds: dict[str, float]) -> dict[str, Any]:
    """One sample's record: metrics[target][method][view][metric] for every view, the network's
    ``level`` entry, ``<method>_fit`` (facts and legacy fit) of each legacy-fitted method and
    ``<method>_facts`` of any other method with a runner (what its computation reports)."""
    meta = sample.meta
    record = {"index": int(index), **_sample_facts(meta, cfg.thickness_bins_A), "metrics": {},
              **{f"{m.name}_fit": None for m in REGISTRY if m.legacy_fitted}, "seconds": seconds}
    pixel = _pixel_size_A(meta, next(iter(maps.values()))["truth"].shape)
    for t, entry in maps.items():
        truth = entry["truth"]
        record["metrics"][t] = {}
        for m in REGISTRY:
            if m.name not in entry:
                continue
            record["metrics"][t][m.name], fit = _score_method(cfg, m, entry[m.name], truth, pixel)
            if m.legacy_fitted:
                record[f"{m.name}_fit"] = {**entry.get(f"{m.name}_fit", {}), **fit}
            elif f"{m.name}_fit" in entry:  # a runner's facts, no fit (network+ptycho: errors, kept_network)
                record[f"{m.name}_facts"] = entry[f"{m.name}_fit"]
    return jsonable(record)


def _score_method(cfg: EvaluationConfig, m: Method, est: np.ndarray, truth: np.ndarray,
                  pixel: tuple[float, float]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """({view: metrics} of one method's map, the structure view's fit). Column positions are the
    field view's: an offset moves no maximum, so they are the same in every view but a constant one."""
    views, fit = view_maps(est, truth, m.legacy_fitted)
    field, structure, legacy = views[FIELD], views[STRUCTURE], views[LEGACY]
    cols = M.column_position_error(field, truth, pixel, min_distance_px=cfg.column_min_distance_px,
                                   threshold_rel=cfg.column_threshold_rel)
    structure_scores = M.image_metrics(structure, truth)
    # a legacy-fitted method's legacy map is its structure map: scored once
    legacy_scores = structure_scores if legacy is structure else M.image_metrics(legacy, truth)
    scores = {FIELD: {**M.image_metrics(field, truth), "mean_error_A": cols.mean_error_A, "recall": cols.recall,
                      "n_columns": cols.n_true},
              STRUCTURE: {**structure_scores, "scale": fit["scale"]},
              LEGACY: {**legacy_scores, **M.level_and_contrast(legacy, truth)}}
    if m.name == NETWORK:
        scores[LEVEL] = {"level_error": level_error(est, truth)}
    return scores, fit


def _keep(sample: Any, maps: dict[str, dict[str, Any]], n_cbed: int) -> dict[str, Any]:
    """What the figures need of one sample: a few CBED patterns, the truth and each method's map in
    the headline (field) view: its own units, its mean set to the truth's."""
    s = sample.cbed.shape[0]
    picks = sorted({int(round(v)) for v in np.linspace(0, s - 1, n_cbed)}) if n_cbed else []
    return {"sample_id": sample.id, "cbed": {i: np.asarray(sample.cbed[i], dtype=np.float32) for i in picks},
            "maps": {t: {"truth": e["truth"], **{k: field_map(v, e["truth"]).astype(np.float32) for k, v in e.items()
                                                  if k != "truth" and not k.endswith("_fit")}}
                     for t, e in maps.items()},
            "meta": sample.meta}


def _sample_facts(meta: SampleMeta, thickness_bins: Sequence[float]) -> dict[str, Any]:
    from ase.data import atomic_numbers

    elements = [str(e) for e in meta.elements or ()] or _formula_elements(meta.formula or "")
    zs = {e: atomic_numbers.get(e, 0) for e in elements}
    heaviest = max(zs, key=zs.get) if zs else "?"
    max_z = zs.get(heaviest, 0)
    thickness = meta.thickness_or_nan_A
    return {
        "sample_id": str(meta.sample_id),
        "material_id": str(meta.material_id),
        "formula": meta.formula or "",
        "elements": elements,
        "zone_axis": "[" + " ".join(str(int(v)) for v in meta.zone_axis or ()) + "]",
        "thickness_A": thickness,
        "heaviest_element": heaviest,
        "max_Z": int(max_z),
        "element_class": _element_class(list(zs.values())),
        "thickness_class": _thickness_class(thickness, thickness_bins),
    }


def _element_class(zs: list[int]) -> str:
    """`LIGHT_CLASS` when every element has Z <= 14, `HEAVY_CLASS` otherwise; "unknown" without elements."""
    if not zs or min(zs) == 0:
        return "unknown"
    return LIGHT_CLASS if max(zs) <= LIGHT_MAX_Z else HEAVY_CLASS


def _formula_elements(formula: str) -> list[str]:
    """The elements of a chemical formula ("SrTiO3" -> Sr, Ti, O); [] when it does not parse."""
    from ase.formula import Formula

    try:
        return list(Formula(formula).count()) if formula else []
    except ValueError:
        return []


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


def _pixel_size_A(meta: SampleMeta, shape: tuple[int, ...]) -> tuple[float, float]:
    """Angstrom per target pixel: the field of view over the target grid."""
    return (float(meta.fov_A[2]) / shape[0], float(meta.fov_A[3]) / shape[1])

def _batches(items: list[int], size: int) -> Iterable[list[int]]:
    for start in range(0, len(items), size):
        yield items[start: start + size]



def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)



def jsonable(obj: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, non-finite floats to None (JSON has no inf/NaN)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(float(obj)) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    return obj
