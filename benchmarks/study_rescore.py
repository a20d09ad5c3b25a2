"""Re-score reconstructors on a study's held-out split by today's rule, without their training data:
re-simulate the test materials (same physics config, so the same sample ids and prototype split), then
`namsa evaluate` each model on them.

    python benchmarks/study_rescore.py [--model pretrained:study-scan | DIR ...] [--plan CONFIG]
        [--out runs/study-rescore]
        [--workers 2] [--ptycho-samples N] [--network-ptycho YAML] [--single-pass]

Without --plan the test materials are those the first (shipped) model's card lists, at its card's physics (the
split it was scored on when published). With --plan CONFIG they are every test material of that config's
whole plan (e.g. configs/gpu-study.yaml: the study's new plan, of which a GPU run simulated only a part):
the split a model trained on any part of that plan never saw.

Writes OUT/config.yaml, OUT/data (the test materials' samples, simulated on --workers processes) and per
model OUT/eval-<name> (<name>: the pretrained name, the folder's name, or a run's name for RUN/model;
network and iCoM on every test sample) and, with --ptycho-samples N, OUT/eval-ptycho-<name> (the same
plus converged ptychography and network+ptycho on the first N test samples in store order; ptychography
is cached in OUT/baseline-cache, so the second model reuses the first's). The network's maps are averaged
over the 8 turns of each stack (`evaluation.symmetry_average`); with --single-pass they are its single pass,
written to OUT/eval-<name>-single-pass and OUT/eval-ptycho-<name>-single-pass (how every figure before
2026-11-27 was made). An evaluation whose metrics.json exists is not run again (rerun the command after a kill). The
mean-image baseline needs the training split's targets, which are not re-simulated: it is off.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PRETRAINED = "pretrained:"


def rescore_config(simulation: dict[str, Any], data: dict[str, Any], materials: list[str]) -> dict[str, Any]:
    """The pipeline config: the given physics with ``materials`` (the test split) as the whole plan, with
    this machine's defaults for device and memory (the plan's own may name a GPU node's)."""
    from namsa.config import MACHINE_FIELDS

    sim = {k: v for k, v in simulation.items() if k not in MACHINE_FIELDS}
    sim.update(materials=sorted(materials), generator={"count": 0})
    data = {k: v for k, v in data.items() if k in ("split_by", "split_fractions", "split_seed", "cbed_dtype",
                                                   "transform")}
    return {"name": "study-rescore", "simulation": sim, "data": {**data, "num_workers": 0},
            "evaluation": {"split": "test", "n_bootstrap": 500, "mean_baseline": False,
                           "thickness_bins_A": [50.0, 100.0]},
            "execution": {"profile": "local", "workers": 1}}


def card_test_split(model: str) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(simulation, data, test materials) of a shipped model's card (``pretrained:NAME``)."""
    if not model.startswith(PRETRAINED):
        sys.exit(f"without --plan the first --model must be a shipped one (pretrained:NAME), not {model}")
    card = json.loads((ROOT / "models" / "pretrained" / model[len(PRETRAINED):] / "model_card.json").read_text())
    return card["simulation_config"], card["data_config"], list(card["trained_on"]["data"]["materials"]["test"])


def plan_split(config_path: Path, split: str = "test") -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(simulation, data, ``split`` materials) of a config's whole plan, split as the study splits it."""
    from namsa.plan import plan_samples
    from namsa.structure_type import prototype_label
    from stage.splits import split_of
    from workflow.config import load_config

    cfg = load_config(config_path)
    if cfg.data.split_by != "prototype":
        sys.exit(f"{config_path}: data.split_by is {cfg.data.split_by!r}; --plan needs a prototype split")
    plan = plan_samples(cfg.simulation)
    materials = {spec.material_id for spec in plan.specs
                 if split_of(prototype_label(spec.material_id), cfg.data.split_fractions,
                             cfg.data.split_seed) == split}
    raw = yaml.safe_load(config_path.read_text())
    return raw["simulation"], raw["data"], sorted(materials)


def _folder_name(model_dir: Path) -> str:
    """A model folder's name, or its run's name for a run's ``model/``."""
    return model_dir.parent.name if model_dir.name == "model" else model_dir.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=None,
                        help="pretrained:NAME or a model folder (repeatable; default: pretrained:study-scan)")
    parser.add_argument("--plan", type=Path, default=None, help="score on this config's whole test split")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "study-rescore")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ptycho-samples", type=int, default=0)
    parser.add_argument("--network-ptycho", default="{}", metavar="YAML",
                        help="evaluation.network_ptycho for the ptychography runs (default {}: RefineSettings' "
                             "defaults; '{refine_below_A: null, max_phase_rad: null}' refines every sample, as "
                             "before 2026-11-26's dev choices)")
    parser.add_argument("--single-pass", action="store_true",
                        help="score the network's single pass (evaluation.symmetry_average=false), into *-single-pass")
    args = parser.parse_args()
    models = args.model or [f"{PRETRAINED}study-scan"]
    namsa = str(Path(sys.executable).with_name("namsa"))
    simulation, data_config, materials = plan_split(args.plan) if args.plan else card_test_split(models[0])
    args.out.mkdir(parents=True, exist_ok=True)
    config = args.out / "config.yaml"
    config.write_text(yaml.safe_dump(rescore_config(simulation, data_config, materials), sort_keys=False))
    data = args.out / "data"
    workers = [subprocess.Popen([namsa, "simulate", str(config), "--out", str(data), "--no-progress",
                                 "--worker", str(w), "--of", str(args.workers)]) for w in range(args.workers)]
    if any(w.wait() for w in workers):
        sys.exit("a simulation worker failed; rerun this command (finished samples are kept)")
    ptycho = ["--set", "evaluation.ptycho=true", "--set", f"evaluation.network_ptycho={args.network_ptycho}", "--set",
              f"evaluation.max_samples={args.ptycho_samples}", "--set",
              f"evaluation.baseline_cache={args.out / 'baseline-cache'}"]
    for model in models:
        name = model[len(PRETRAINED):] if model.startswith(PRETRAINED) else _folder_name(Path(model))
        evaluate = [namsa, "evaluate", str(config), "--data", str(data), "--model", model, "--no-progress",
                    "--set", f"evaluation.symmetry_average={str(not args.single_pass).lower()}"]
        suffix = "-single-pass" if args.single_pass else ""
        for out, extra in ((f"eval-{name}{suffix}", []),
                           (f"eval-ptycho-{name}{suffix}", ptycho if args.ptycho_samples else None)):
            if extra is not None and not (args.out / out / "metrics.json").is_file():
                subprocess.run([*evaluate, "--out", str(args.out / out), *extra], check=True)


if __name__ == "__main__":
    main()
