"""Choose network+ptycho's settings on dev: the flagship's network+ptycho (`namsa.ptychography.refine`,
`RefineSettings`) against converged ptychography, on the first dev materials of a study plan, by the
field's rule, for each named setting.

    python benchmarks/refine_dev.py [--plan configs/gpu-study.yaml] [--model pretrained:study-scan-gpu]
        [--materials 20] [--settings NAME=YAML ...] [--out runs/plan-dev]

Default settings: ``all-thicknesses`` (every specimen refined, multislice from 100 A), ``prior-0.05`` /
``prior-0.2`` (the same with {prior_weight: w}: after every iteration the object moves back towards the
network's map by w), ``tight`` (the same iterated into the plateau: {convergence: {rel_tol: 0.005,
max_iterations: 128}}), ``below-50`` (only specimens thinner than 50 A refined) and ``below-50-phase-P``
(those, and only where the network's map spans less than P rad of phase, P in 0.5, 0.75, 1, 1.5; the
defaults it chose: 50 A and 0.75 rad). Simulates the first N dev materials
(sorted ids) of the plan into OUT/data (kept: a rerun skips what is stored), then per setting `namsa evaluate
--split dev` with iCoM, ptychography (cached in OUT/baseline-cache after the first) and network+ptycho into
OUT/eval-NAME (a finished one is not run again), and prints each one's table (`rescore_table.table`) and its
network+ptycho seconds per sample. The test split is not touched. The network's maps are its symmetry
average (`evaluation.symmetry_average`); every setting was chosen from its single pass (`--single-pass`, into
an OUT of its own: a finished eval-NAME is not run again).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from rescore_table import table  # noqa: E402
from study_rescore import plan_split, rescore_config  # noqa: E402


#: name -> evaluation.network_ptycho (YAML); each names refine_below_A, whose default is what this chose
DEFAULT_SETTINGS = ("all-thicknesses={refine_below_A: null, max_phase_rad: null}",
                    "prior-0.05={refine_below_A: null, max_phase_rad: null, prior_weight: 0.05}",
                    "prior-0.2={refine_below_A: null, max_phase_rad: null, prior_weight: 0.2}",
                    "tight={refine_below_A: null, max_phase_rad: null, convergence: {rel_tol: 0.005, "
                    "max_iterations: 128}}",
                    "below-50={refine_below_A: 50, max_phase_rad: null}",
                    *(f"below-50-phase-{p:g}={{refine_below_A: 50, max_phase_rad: {p}}}" for p in (0.5, 0.75, 1.0, 1.5)))


def dev_data(plan: Path, n_materials: int, out: Path) -> tuple[Path, Path]:
    """(OUT/config.yaml, OUT/data): the first ``n_materials`` dev materials (sorted ids) of ``plan``
    at its physics, evaluating the dev split, simulated into OUT/data (a rerun skips what is stored)."""
    simulation, data_config, materials = plan_split(plan, split="dev")
    config = rescore_config(simulation, data_config, materials[:n_materials])
    config.update(name="plan-dev")
    config["evaluation"]["split"] = "dev"
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    data = out / "data"
    subprocess.run([str(Path(sys.executable).with_name("namsa")), "simulate", str(config_path), "--out", str(data),
                    "--no-progress"], check=True)
    return config_path, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, default=ROOT / "configs" / "gpu-study.yaml")
    parser.add_argument("--model", default="pretrained:study-scan-gpu")
    parser.add_argument("--materials", type=int, default=20, help="the first N dev materials (sorted ids)")
    parser.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS),
                        help="NAME=YAML: evaluation.network_ptycho for eval-NAME (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "plan-dev")
    parser.add_argument("--single-pass", action="store_true",
                        help="start from the network's single pass (evaluation.symmetry_average=false), how every "
                             "setting was chosen on 2026-11-26; the default starts from its symmetry average")
    args = parser.parse_args()
    namsa = str(Path(sys.executable).with_name("namsa"))
    config_path, data = dev_data(args.plan, args.materials, args.out)
    for name, settings in (item.split("=", 1) for item in args.settings):
        out = args.out / f"eval-{name}"
        if not (out / "metrics.json").is_file():
            subprocess.run([namsa, "evaluate", str(config_path), "--data", str(data), "--model", args.model,
                            "--out", str(out), "--no-progress", "--set", "evaluation.ptycho=true",
                            "--set", f"evaluation.network_ptycho={settings}",
                            "--set", f"evaluation.baseline_cache={args.out / 'baseline-cache'}",
                            "--set", f"evaluation.symmetry_average={str(not args.single_pass).lower()}"], check=True)
        metrics = json.loads((out / "metrics.json").read_text())
        seconds = metrics["compute_seconds"]["network+ptycho"]
        print(f"\n{name}: network_ptycho={settings} ({out}); network+ptycho {seconds['mean']:.1f} s per sample "
              f"(median {seconds['median']:.1f})")
        print(table({out.name: metrics}))


if __name__ == "__main__":
    main()
