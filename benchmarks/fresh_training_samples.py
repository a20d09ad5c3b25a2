"""Fresh training samples of a shipped model's physics that no card measured: its plan's training-split
materials (one zone axis each, interleaved over structure types, as scripts/card_dose_curve.py picks
them) at a variant no run simulated (``simulation.first_variant``), so another thickness and focus draw of
the same materials. For `benchmarks/input_report_false_alarms.py`: every finding on them is false.

    nice -n 10 .venv/bin/python benchmarks/fresh_training_samples.py runs/ranges-fresh/data --n 40 \\
        --first-variant 3 [--model study-scan-camera]

Resumable (samples already stored are skipped); one process on the CPU, ~5 s a sample at the study's
physics on a 2-core VM.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

from card_dose_curve import split_specs  # noqa: E402

from models import flagship_name, pretrained_card  # noqa: E402
from namsa.plan import plan_samples  # noqa: E402
from workflow.data_runners import simulate_specs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="the data folder to write (its store-000)")
    ap.add_argument("--n", type=int, default=40, help="training samples, one per material")
    ap.add_argument("--first-variant", type=int, default=3, help="a variant no run simulated (>= 1)")
    ap.add_argument("--model", default=flagship_name(), help="the shipped model whose physics and split to take")
    args = ap.parse_args(argv)
    if args.first_variant < 1 or args.n < 1:
        ap.exit(2, "fresh_training_samples: error: --first-variant must be >= 1 (0 is the runs' own) and --n >= 1\n")
    card = pretrained_card(args.model)
    cfg = card.simulation_config.model_copy(update={"first_variant": args.first_variant, "workers": 1})
    started = time.time()
    plan = plan_samples(cfg)
    specs = split_specs(card, plan.specs, "train", args.n)
    print(f"planned {len(plan.specs)} samples in {time.time() - started:.0f} s; simulating {len(specs)}", flush=True)
    summary = simulate_specs(cfg, card.data_config, args.data / "store-000", specs, plan.sources, progress=False)
    print(summary.line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
