"""Fill ``evaluation.baseline_cache`` with a split's ptychography before any model exists
(`evaluation.precompute`):

    python -m workflow.precompute CONFIG --data DATA [--set KEY=VALUE ...]
"""
from __future__ import annotations

import argparse

from evaluation.precompute import precompute
from namsa.errors import UserError

from .config import load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="pipeline YAML: its evaluation section says what to compute")
    parser.add_argument("--data", action="append", required=True, help="data directory (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one config value")
    args = parser.parse_args(argv)
    try:
        precompute(load_config(args.config, args.set).evaluation, args.data)
    except UserError as exc:
        parser.exit(2, f"namsa: error: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
