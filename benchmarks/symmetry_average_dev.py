"""Symmetry averaging chosen on dev: the network's maps averaged over the square group's 8 turns
(`models.symmetry_average`) against its single pass, by the field's rule, with iCoM, converged
ptychography and network+ptycho (started from each map) beside them; and, as a control, the single
pass smoothed by a Gaussian of sigma 0.35 / 0.5 / 0.7 px (is the averaging more than a low-pass filter?).

    python benchmarks/symmetry_average_dev.py [--plan configs/gpu-study.yaml] [--model pretrained:study-scan-gpu]
        [--materials 20] [--out runs/plan-dev]

Simulates the first N dev materials (sorted ids) of the plan into OUT/data as benchmarks/refine_dev.py
does (a rerun skips what is stored), then `namsa evaluate --split dev` once per variant, each in its own
process (ptychography read from OUT/baseline-cache after the first), into OUT/eval-single-pass and
OUT/eval-symmetry-average, and prints their tables (`rescore_table.table`) and seconds per sample. The
test split is not touched.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from refine_dev import dev_data  # noqa: E402
from rescore_table import table  # noqa: E402

VARIANTS = {"single-pass": "false", "symmetry-average": "true"}
SIGMAS_PX = (0.35, 0.5, 0.7)


def smoothing_control(model: str, data: Path) -> dict[str, float]:
    """Mean potential relative L2 (field's rule) over the dev samples of ``data`` of the single pass
    smoothed by each Gaussian of ``SIGMAS_PX`` (periodic edges: the scans cover whole supercells)."""
    from scipy.ndimage import gaussian_filter

    import stage
    from evaluation.metrics import relative_l2
    from evaluation.views import field_map
    from models import load_reconstructor

    rec = load_reconstructor(model)
    errors: dict[str, list[float]] = {f"sigma {s} px": [] for s in SIGMAS_PX}
    with stage.open_stores(data) as stores:
        for index in stores.indices("dev"):
            sample = stores[index]
            truth = np.asarray(sample.potential, dtype=np.float64)
            single = rec.predict(sample.cbed.astype(np.float32), sample.meta.calibration,
                                 check_dose=False, symmetry_average=False)[rec.targets.index("potential")]
            for sigma in SIGMAS_PX:
                est = field_map(gaussian_filter(single.astype(np.float64), sigma, mode="wrap"), truth)
                errors[f"sigma {sigma} px"].append(relative_l2(est, truth))
    return {name: float(np.mean(values)) for name, values in errors.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, default=ROOT / "configs" / "gpu-study.yaml")
    parser.add_argument("--model", default="pretrained:study-scan-gpu")
    parser.add_argument("--materials", type=int, default=20, help="the first N dev materials (sorted ids)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "plan-dev")
    args = parser.parse_args()
    namsa = str(Path(sys.executable).with_name("namsa"))
    config_path, data = dev_data(args.plan, args.materials, args.out)
    runs = {}
    for name, flag in VARIANTS.items():
        out = args.out / f"eval-{name}"
        if not (out / "metrics.json").is_file():
            subprocess.run([namsa, "evaluate", str(config_path), "--data", str(data), "--model", args.model,
                            "--out", str(out), "--no-progress", "--set", "evaluation.ptycho=true",
                            "--set", "evaluation.network_ptycho={}", "--set", f"evaluation.symmetry_average={flag}",
                            "--set", f"evaluation.baseline_cache={args.out / 'baseline-cache'}"], check=True)
        runs[name] = json.loads((out / "metrics.json").read_text())
        seconds = runs[name]["compute_seconds"]
        print(f"\n{name} ({out}): network {seconds['network']['mean']:.2f} s per sample, network+ptycho "
              f"{seconds['network+ptycho']['mean']:.1f}")
        print(table({out.name: runs[name]}))
        print(table({out.name: runs[name]}, target="density"))
    print("\nsingle pass smoothed (potential, all dev samples): " + ", ".join(
        f"{name} {value:.3f}" for name, value in smoothing_control(args.model, data).items()))


if __name__ == "__main__":
    main()
