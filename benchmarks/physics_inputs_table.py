"""Table of the dev-split study (benchmarks/physics_inputs_study.sh): potential relative L2 of the
network, the fitted iCoM and the mean image, overall and on light materials (every element Z <= 14),
per variant and seed, read from each run's eval-dev/metrics.json; with DATA also the network's
amplitude on the light dev samples (median least-squares slope of its demeaned map on the demeaned
truth: 1 = right amplitude, < 1 = too faint, the symptom of issue 22).
    python benchmarks/physics_inputs_table.py OUT [DATA]"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from evaluation.scoring import LIGHT_CLASS as LIGHT  # noqa: E402
# these studies were chosen by the rule before issue 30 (network as predicted, baselines least-squares fitted)
from evaluation.views import legacy_scores as legacy  # noqa: E402


def row(metrics: dict) -> list[float]:
    head = metrics["headline"]["potential"]
    light = metrics["class_aggregates"]["potential"][LIGHT]
    return [legacy(head[m])["rel_l2"] for m in ("network", "icom", "mean")] + \
           [legacy(light[m])["rel_l2"]["value"] for m in ("network", "icom", "mean")]


def light_amplitude(model_dir: Path, data: Path, metrics: dict) -> float:
    """Median slope of the network's map on the truth over the light dev samples (potential)."""
    import models
    import stage

    rec = models.load_reconstructor(model_dir, device="cpu")
    light = [s["index"] for s in metrics["samples"] if s["element_class"] == LIGHT]
    slopes = []
    with stage.open_stores(stage.find_stores(data)) as stores:
        for index in light:
            sample = stores[index]
            pred = rec.predict(sample.cbed.astype(np.float32), calibration=sample.meta.calibration)
            p = pred[rec.targets.index("potential")]
            t, q = sample.potential - sample.potential.mean(), p - p.mean()
            slopes.append(float((q * t).sum() / (t * t).sum()))
    return float(np.median(slopes))


def main(out: Path, data: Path | None) -> None:
    extra = " net light amplitude |" if data else ""
    print("| variant | seed | net all | iCoM all | mean all | net light | iCoM light | mean light |" + extra)
    print("|---|---|---|---|---|---|---|---|" + ("---|" if data else ""))
    for path in sorted(out.glob("*-s*/eval-dev/metrics.json")):
        name, seed = path.parent.parent.name.rsplit("-s", 1)
        metrics = json.loads(path.read_text())
        values = row(metrics)
        if data:
            values.append(light_amplitude(path.parent.parent / "model", data, metrics))
        print(f"| {name} | {seed} | " + " | ".join(f"{v:.3f}" for v in values) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
