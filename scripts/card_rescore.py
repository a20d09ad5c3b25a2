"""Replace a published model card's held-out figures with a newer evaluation of the same weights
(`workflow.rescore_card.rescore_published`), e.g. its maps averaged over the scan's 8 turns.

    python scripts/card_rescore.py models/pretrained/study-scan-gpu runs/rescore-new-plan/eval-study-scan-gpu

The evaluation is `benchmarks/study_rescore.py`'s (or any `namsa evaluate --out DIR` of the published
weights on the test split). Exit 2 with one line when the evaluation cannot be used.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from namsa.errors import UserError  # noqa: E402
from workflow.rescore_card import rescore_published  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a published model folder (models/pretrained/NAME)")
    parser.add_argument("eval_dir", type=Path, help="the `namsa evaluate --out` folder of the same weights")
    args = parser.parse_args(argv)
    try:
        held_out = rescore_published(args.folder, args.eval_dir)
    except UserError as exc:
        parser.exit(2, f"card_rescore: error: {exc}\n")
    print(f"{args.folder / 'model_card.json'}: held_out_evaluation of the {held_out['split']} split, "
          f"symmetry_average={held_out['symmetry_average']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
