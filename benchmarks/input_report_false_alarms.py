"""How often the model's input checks cry wolf: `models.scan_fit.card_checks.input_report` (what
`Reconstructor.predict` warns with) run on held-out samples simulated with the model's own training
physics, where every finding is a false alarm.

    python benchmarks/input_report_false_alarms.py runs/rescore-new-plan/data [--model pretrained:NAME] [--split dev]

The data are `benchmarks/study_rescore.py --plan configs/gpu-study.yaml`'s (the flagship's whole test
split at its card's physics). Prints the samples, the findings per code, and each finding's sample,
thickness and message. Each sample is checked with its own probe step, as `namsa evaluate` passes it.
``--split`` checks one split of the stores only (e.g. the dev split of data whose training split the
card's ranges were measured on: on the training split itself the check is circular).
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

import stage  # noqa: E402
from models import flagship_name, load_reconstructor  # noqa: E402
from models.scan_fit import card_checks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, nargs="+", help="data dirs or stores of the model's physics")
    parser.add_argument("--model", default=f"pretrained:{flagship_name()}")
    parser.add_argument("--split", choices=("train", "dev", "test"), help="one split only (default: every sample)")
    args = parser.parse_args()
    card = load_reconstructor(args.model, device="cpu").card
    samples = stage.open_stores(args.data)
    picked = samples.indices(args.split) if args.split else range(len(samples))
    counts: collections.Counter[str] = collections.Counter()
    found = []
    for i in picked:
        sample = samples[i]
        cbed = np.asarray(sample.cbed, np.float32)
        report = card_checks.input_report(cbed.reshape(-1, *cbed.shape[-2:]), card,
                                          {"scan_step_A": list(sample.meta.scan_step_A)})
        for warning in report["warnings"]:
            counts[warning["code"]] += 1
            found.append(f"{sample.meta.sample_id} ({sample.meta.thickness_A:.0f} A): {warning['code']}: "
                         f"{warning['message'][:140]}")
    which = f" ({args.split} split)" if args.split else ""
    print(f"{args.model} on {len(picked)} samples of its physics{which}: {sum(counts.values())} findings "
          f"{dict(counts) or ''}")
    print("\n".join(found))


if __name__ == "__main__":
    main()
