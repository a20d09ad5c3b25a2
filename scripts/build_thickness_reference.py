"""Build the thickness reference of a model (models/scan_fit/thickness_reference.py) and store it beside it.

    .venv/bin/python scripts/build_thickness_reference.py                      # pretrained:study-scan-gpu
    .venv/bin/python scripts/build_thickness_reference.py --model DIR --out DIR/thickness_reference.safetensors

About 5 minutes on 2 CPU cores for the 25 materials of `MATERIALS` (`--materials` picks fewer).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.card import CARD_FILE, read_card_file  # noqa: E402
from models.scan_fit.thickness import REFERENCE_FILE  # noqa: E402
from models.scan_fit.thickness_reference import MATERIALS, build_reference, save_reference  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(ROOT / "models" / "pretrained" / "study-scan-gpu"),
                        help="model directory whose card's expects_input gives the physics")
    parser.add_argument("--out", default=None, help=f"output file (default: MODEL/{REFERENCE_FILE})")
    parser.add_argument("--materials", nargs="*", default=list(MATERIALS), help="library ids (default: all)")
    args = parser.parse_args()
    card = read_card_file(Path(args.model) / CARD_FILE)
    if card.expects_input is None:
        sys.exit(f"{args.model}: the card has no expects_input, so its physics is unknown")
    start = time.perf_counter()
    reference = build_reference(card.expects_input.simulation_config(), args.materials,
                                progress=lambda name: print(f"{time.perf_counter() - start:7.1f} s  {name}",
                                                            flush=True))
    out = Path(args.out or Path(args.model) / REFERENCE_FILE)
    save_reference(reference, out)
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(reference.names)} materials x "
          f"{len(reference.depths_A)} depths)")


if __name__ == "__main__":
    main()
