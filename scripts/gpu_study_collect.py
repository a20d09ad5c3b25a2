"""After the GPU study run (scripts/gpu_study.sh): the figures a session records, in at most 8 files of
at most 16 MiB under $OUT: the new model and the shipped flagship scored on the same dev samples,
the simulation and training figures, and the model itself when its weights fit.

    python scripts/gpu_study_collect.py RUN OUT

Both networks are judged by the field's rule (issue 30): in physical units with only the map's mean
taken from the truth, which for a network's map is the contrast part of its relative L2
(``rel_l2_contrast`` in metrics.json, ||(p - mean p) - (t - mean t)|| / ||t||); the plain relative L2
and the level error are reported beside it.
"""
from __future__ import annotations

import csv
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

#: what comes back from a device call
MAX_FILES, MAX_FILE_BYTES = 8, 16 << 20
RULE = ("rel_l2_contrast", "rel_l2", "rel_l2_level")
#: metrics.json's view of the network as predicted (evaluation.views.LEGACY; this script runs without the package)
LEGACY_VIEW = "legacy_network_as_predicted_baselines_fitted"


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _network_scores(metrics: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """sample id -> target -> {rel_l2_contrast, rel_l2, rel_l2_level} of the network."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for record in metrics.get("samples", []):
        for target, methods in record.get("metrics", {}).items():
            # the network as predicted (metrics.json's legacy view holds its level / contrast split;
            # its contrast part is the field rule's rel_l2); older files call the same entry "physical"
            network = methods.get("network", {})
            raw = network.get(LEGACY_VIEW) or network.get("physical", {})
            if all(raw.get(k) is not None for k in RULE):
                out.setdefault(record["sample_id"], {})[target] = {k: float(raw[k]) for k in RULE}
    return out


def compare(run: Path) -> dict[str, Any]:
    """Mean scores of the new model and the flagship over the samples both were scored on."""
    new, old = (_network_scores(_json(run / name / "metrics.json")) for name in ("eval-new", "eval-flagship"))
    shared = sorted(set(new) & set(old))
    table: dict[str, Any] = {"samples": len(shared)}
    for target in ("potential", "density"):
        rows = [(new[s][target], old[s][target]) for s in shared if target in new[s] and target in old[s]]
        if rows:
            table[target] = {k: {"new": sum(a[k] for a, _ in rows) / len(rows),
                                 "flagship": sum(b[k] for _, b in rows) / len(rows)} for k in RULE}
    return table


def train_timing(run: Path) -> dict[str, float]:
    """Where a training step's time goes (medians over the logged steps of metrics.csv, seconds):
    ``compute_s`` forward, backward and update on the device, ``other_s`` the rest of the step
    (waiting for the loader, the batch's copy and its shot noise); ``outside_steps_s`` the run's
    wall time that no step holds (start-up, dev evaluations, checkpoints, export). Empty without a log."""
    try:
        with open(run / "train" / "metrics.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("step_s")]
    except OSError:
        return {}
    if not rows:
        return {}
    timing = {k: statistics.median(float(r[k]) for r in rows) for k in ("step_s", "compute_s", "other_s")}
    summary = _json(run / "train" / "train-summary.json")
    if summary.get("started_at") and summary.get("steps"):
        wall = float(summary["finished_at"]) - float(summary["started_at"])
        timing["outside_steps_s"] = wall - int(summary["steps"]) * timing["step_s"]
    return timing


def collect(run: Path, out: Path) -> list[Path]:
    """Write the figures and the model into ``out``; returns the files written (at most MAX_FILES)."""
    out.mkdir(parents=True, exist_ok=True)
    simulate = {p.name: _json(p) for p in sorted((run / "data").glob("simulate-*.json"))}
    figures = {"check": _json(run / "check.json"), "simulate": simulate,
               "train": _json(run / "train" / "train-summary.json"), "train_timing": train_timing(run),
               "compare": compare(run)}
    written = [out / "study.json"]
    written[0].write_text(json.dumps(figures, indent=1, default=str))
    model = run / "train" / "model"
    for name in ("model.safetensors", "model_card.json"):
        source = model / name
        if source.is_file() and source.stat().st_size <= MAX_FILE_BYTES:
            shutil.copyfile(source, out / name)
            written.append(out / name)
    return written


def check_limits(out: Path) -> list[str]:
    """Why ``out`` would not come back whole from a device call ([] when it would)."""
    files = [p for p in out.rglob("*") if p.is_file()]
    problems = [f"{len(files)} files, more than {MAX_FILES}"] if len(files) > MAX_FILES else []
    return problems + [f"{p.name} is {p.stat().st_size} bytes" for p in files if p.stat().st_size > MAX_FILE_BYTES]


if __name__ == "__main__":
    run_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    collect(run_dir, out_dir)
    problems = check_limits(out_dir)
    print(json.dumps({"compare": compare(run_dir), "limits": problems or "ok"}))
    sys.exit(1 if problems else 0)
