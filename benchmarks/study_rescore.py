"""Re-score a shipped reconstructor on its own held-out split by today's rule, without its training data:
re-simulate the test materials its card lists (same physics config, so the same sample ids and
prototype split), then `namsa evaluate` the shipped weights on them.

    python benchmarks/study_rescore.py [--model study-scan] [--out runs/study-rescore] [--workers 2]
        [--ptycho-samples N]

Writes OUT/config.yaml, OUT/data (the test materials' samples, simulated on --workers processes),
OUT/eval (every method on every test sample: network, iCoM) and, with --ptycho-samples N, OUT/eval-ptycho
(the same plus converged ptychography and network+ptycho on the first N test samples in store order).
The mean-image baseline needs the training split's targets, which are not re-simulated: it is off.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def rescore_config(card: dict) -> dict:
    """The pipeline config: the card's physics with the card's test materials as the plan."""
    sim = dict(card["simulation_config"])
    sim.update(materials=sorted(card["trained_on"]["data"]["materials"]["test"]),
               generator={"count": 0}, device="cpu")
    data = {k: v for k, v in card["data_config"].items() if k in ("split_by", "split_fractions", "split_seed",
                                                                 "cbed_dtype", "transform")}
    return {"name": "study-rescore", "simulation": sim, "data": {**data, "num_workers": 0},
            "evaluation": {"split": "test", "n_bootstrap": 500, "mean_baseline": False,
                           "thickness_bins_A": [50.0, 100.0]},
            "execution": {"profile": "local", "workers": 1}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="study-scan")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "study-rescore")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ptycho-samples", type=int, default=0)
    args = parser.parse_args()
    namsa = str(Path(sys.executable).with_name("namsa"))
    card = json.loads((ROOT / "models" / "pretrained" / args.model / "model_card.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    config = args.out / "config.yaml"
    config.write_text(yaml.safe_dump(rescore_config(card), sort_keys=False))
    data = args.out / "data"
    workers = [subprocess.Popen([namsa, "simulate", str(config), "--out", str(data), "--no-progress",
                                 "--worker", str(w), "--of", str(args.workers)]) for w in range(args.workers)]
    if any(w.wait() for w in workers):
        sys.exit("a simulation worker failed; rerun this command (finished samples are kept)")
    model = f"pretrained:{args.model}"
    subprocess.run([namsa, "evaluate", str(config), "--data", str(data), "--model", model, "--out",
                    str(args.out / "eval"), "--no-progress"], check=True)
    if args.ptycho_samples:
        subprocess.run([namsa, "evaluate", str(config), "--data", str(data), "--model", model, "--out",
                        str(args.out / "eval-ptycho"), "--no-progress", "--set", "evaluation.ptycho=true",
                        "--set", "evaluation.network_ptycho={}", "--set",
                        f"evaluation.max_samples={args.ptycho_samples}"], check=True)


if __name__ == "__main__":
    main()
