"""Measure a published model card's ``training_statistics`` again from its training data
(`workflow.restate_statistics.restate_training_statistics`): every training sample's cheap statistics and,
for a fine-tune, the union with the card of the model it started from.

    python scripts/card_statistics.py models/pretrained/study-scan-camera runs/camera-study/data

Only that field of model_card.json changes (checked after writing); exit 2 with one line when the data
are not the card's training data or the initial model's weights are not the ones the card names.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from namsa.errors import UserError  # noqa: E402
from workflow.restate_statistics import restate_training_statistics  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a published model folder (models/pretrained/NAME)")
    parser.add_argument("data", type=Path, nargs="+", help="its training data folders, in the order it was given")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        stats = restate_training_statistics(args.folder, args.data)
    except UserError as exc:
        parser.exit(2, f"card_statistics: error: {exc}\n")
    print(f"{args.folder / 'model_card.json'}: training_statistics over {stats['samples']} stacks "
          f"({time.perf_counter() - started:.0f} s); {stats.get('note', '')}")
    for name, r in stats["ranges"].items():
        print(f"  {name}: {r['low']:.4g} .. {r['high']:.4g} ({r['samples']} stacks)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
