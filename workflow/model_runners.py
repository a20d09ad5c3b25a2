"""Stage runners for the model: `namsa train`, `namsa evaluate` and `namsa scaling`, with the data
fingerprint and config hashes whose summaries tell the DAG a stage need not run again.

Each runner does one stage on this machine and returns a small summary; torch and the models are
imported inside the runners so that `namsa --help` and the Parsl driver stay light.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from stage.config import CameraAugmentationConfig

from .data_runners import stored_ids
from .runner_io import require_directory, write_summary_json

if TYPE_CHECKING:  # the config pulls in torch (models)
    from .config import PipelineConfig

#: summary of a finished training run, written in its output directory (the DAG's "done" marker).
TRAIN_SUMMARY = "train-summary.json"
#: summary of a finished evaluation, written beside metrics.json.
EVAL_SUMMARY = "eval-summary.json"
#: what `namsa evaluate` writes into --out: an --out holding anything else is refused, never replaced
EVAL_OUTPUTS = frozenset({"metrics.json", "report.html", "figures", EVAL_SUMMARY})


def data_fingerprint(data_dirs: Iterable[str | Path]) -> str:
    """sha256 over the sorted sample ids below ``data_dirs``: changes whenever the data set does."""
    ids: set[str] = set()
    for d in data_dirs:
        ids |= stored_ids(d)
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()


#: keys added to a section after runs were made, left out of its hash while at their default, so a
#: finished run is not taken for out of date (and retrained) by a namsa that merely knows more keys
_LATER_KEYS: dict[str, dict[tuple[str, ...], Any]] = {
    "training": {("max_wall_s",): None, ("init_from",): None},
    "data": {("dose_augmentation", "on_device"): False, ("resident",): False,   # issue 41: data.resident
             # issue 42: the camera as augmentation, off (stage.config.CameraAugmentationConfig's defaults)
             ("camera_augmentation",): CameraAugmentationConfig().model_dump(mode="json")},
    # issue 30: the study's data mix; at their defaults the plan is the one before them. (The scan
    # preset's padding is not here: its default changed from zeros to circular, a different model.)
    "simulation": {("generator", "light_fraction"): 0.0, ("generator", "light_family_weights"): {},
                   ("variations", "thin_fraction"): None, ("variations", "thin_below_A"): None,
                   ("first_variant",): 0},   # issue 41: fresh variants of a plan
}


def section_hash(cfg: "PipelineConfig", *sections: str) -> str:
    """sha256 over the named config sections (what decides whether earlier results still hold)."""
    payload = {name: getattr(cfg, name).model_dump(mode="json") for name in sections}
    for name, keys in _LATER_KEYS.items():
        for path, default in keys.items():
            parent = payload.get(name, {})
            for part in path[:-1]:
                parent = parent.get(part, {})
            if parent.get(path[-1], object()) == default:
                del parent[path[-1]]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


TRAIN_SECTIONS = ("simulation", "data", "model", "training", "distributed")
EVAL_SECTIONS = TRAIN_SECTIONS + ("evaluation",)


def train(cfg: "PipelineConfig", data_dirs: Sequence[str | Path], out_dir: str | Path, *,
          resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """`namsa train`: `models.train` on the stores below ``data_dirs`` into ``out_dir`` (a run
    directory: checkpoints/, model/, metrics.csv), with the config's simulation section as what the
    exported card expects of its input; writes ``out_dir/train-summary.json``.

    The summary records the data fingerprint and config hash the model was trained on, which is
    how the DAG knows a finished training need not run again.
    """
    import models

    require_directory(out_dir)
    started = time.time()
    training = cfg.training if progress else cfg.training.model_copy(update={"progress": False})
    result = models.train(cfg.model, training, cfg.distributed, cfg.data, list(data_dirs), out_dir,
                          resume=resume, simulation=cfg.simulation)
    summary = {
        "model_dir": str(result.model_dir),
        "best_checkpoint": None if result.best_checkpoint is None else str(result.best_checkpoint),
        "metrics_csv": str(result.metrics_csv), "steps": int(result.steps), "stopped_by": result.stopped_by,
        "final_dev_loss": None if result.final_dev_loss is None else float(result.final_dev_loss),
        "data_fingerprint": data_fingerprint(data_dirs), "config_hash": section_hash(cfg, *TRAIN_SECTIONS),
        "started_at": started, "finished_at": time.time(),
    }
    if is_main_rank():   # its paths relative to out_dir, so that the directory can be moved (`mv`)
        write_summary_json(Path(out_dir) / TRAIN_SUMMARY, {**summary, **relative_paths(summary, out_dir)})
    return summary


#: the keys of a train or eval summary that hold paths of files the command wrote
PATH_KEYS = ("model_dir", "best_checkpoint", "metrics_csv", "metrics_json", "report_html")


def relative_paths(summary: dict[str, Any], root: str | Path) -> dict[str, Any]:
    """The path entries of ``summary`` (`PATH_KEYS`, ``figures``) relative to ``root``, for the file."""
    def rel(path: str) -> str:
        return os.path.relpath(Path(path).resolve(), Path(root).resolve())

    out: dict[str, Any] = {k: rel(summary[k]) for k in PATH_KEYS if isinstance(summary.get(k), str)}
    if isinstance(summary.get("figures"), list):
        out["figures"] = [rel(f) for f in summary["figures"]]
    return out


def is_main_rank() -> bool:
    """Rank 0 of a torchrun / MPI / Slurm launch (or a single process) writes shared summaries."""
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name]) == 0
    return True


def evaluate(cfg: "PipelineConfig", data_dirs: Sequence[str | Path], model_dir: str | Path,
             out_dir: str | Path, *, train_metrics_csv: str | Path | None = None) -> dict[str, Any]:
    """`namsa evaluate`: `evaluation.evaluate`; writes ``eval-summary.json`` beside metrics.json."""
    from evaluation import evaluate as run_evaluation

    from .replace_out import replaced_atomically

    out = require_directory(out_dir, make=False)  # made by the swap: a refused run leaves no trace
    started = time.time()
    # Written into a sibling and swapped in whole: a kill leaves the earlier result or this one.
    with replaced_atomically(out, EVAL_OUTPUTS.__contains__, marker=EVAL_SUMMARY) as staging:
        result = run_evaluation(cfg.evaluation, cfg.data, list(data_dirs), model_dir, staging,
                                train_metrics_csv=train_metrics_csv)

        def final(path: Path) -> str:
            return str(out / Path(path).relative_to(staging))

        summary = {
            "metrics_json": final(result.metrics_json), "report_html": final(result.report_html),
            "figures": [final(f) for f in result.figures], "headline": result.headline,
            "verdicts": result.verdicts, "compute_seconds": result.compute_seconds,
            "dose_sweep": result.dose_sweep, "warnings": result.warnings,
            "n_samples": result.n_samples, "model_dir": str(model_dir),
            "data_fingerprint": data_fingerprint(data_dirs), "config_hash": section_hash(cfg, *EVAL_SECTIONS),
            "started_at": started, "finished_at": time.time(),
        }
        write_summary_json(staging / EVAL_SUMMARY, summary)
    return summary


def scaling(cfg: "PipelineConfig", data_dirs: Sequence[str | Path], out_dir: str | Path,
            fractions: Sequence[float] = (0.125, 0.25, 0.5, 1.0), metric: str = "rel_l2",
            progress: bool = True) -> dict[str, Any]:
    """`namsa scaling`: train on growing subsets and plot the error against the training-set size."""
    from .scaling import scaling_study

    require_directory(out_dir)
    training = cfg.training if progress else cfg.training.model_copy(update={"progress": False})
    return scaling_study(cfg.model, training, cfg.distributed, cfg.data, cfg.evaluation,
                         list(data_dirs), out_dir, fractions=fractions, metric=metric)
