"""Store a config's simulation plan in DIR (`workflow.plan_cache`) ahead of a run elsewhere that sets
execution.plan_cache_dir to DIR, so that run reads the plan's slow choices (generated materials,
automatic zone axes; checked against its config there) instead of spending a minute or two of one
core on them (scripts/gpu_wheels.sh stores the GPU study's, which scripts/gpu_study.sh reads).

    [NAMSA_PLAN_KEY=KEYFILE] python scripts/store_plan.py CONFIG DIR [--wheels WHEELS] [--set KEY=VALUE ...]

The plan is signed with the key file NAMSA_PLAN_KEY names (made when missing; default: the user's
~/.cache/namsa/plan-cache.key, `workflow.plan_signature`): the other run reads it only with the same
key, so carry that file beside DIR (not in it) and set NAMSA_PLAN_KEY to it there. A key file that
cannot be trusted stores nothing: one line, exit 1.

``--wheels``: the wheels the other machine installs; the plan is only read there when their
pymatgen and spglib are this interpreter's versions, so a difference is reported.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workflow.config import load_config  # noqa: E402
from workflow.plan_cache import PLANNING_LIBRARIES, cached_plan, library_version, plan_key, plan_path  # noqa: E402
from workflow.plan_signature import PlanKeyRefused, key_path, plan_secret  # noqa: E402


def wheel_versions(wheels: Path) -> dict[str, str]:
    """{normalised distribution name: version} of the wheels in ``wheels``."""
    out = {}
    for wheel in wheels.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        out[re.sub(r"[-_.]+", "-", name.lower())] = version
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("dir", type=Path)
    parser.add_argument("--wheels", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    cfg = load_config(args.config, args.set).simulation
    try:
        secret = plan_secret()
    except PlanKeyRefused as exc:
        print(f"store_plan: {exc}, so no plan is stored: {exc.advice}", file=sys.stderr)
        return 1
    plan, read_from = cached_plan(cfg, args.dir)
    stored = plan_path(plan_key(cfg), args.dir, secret)
    print(f"{args.config}: {len(plan.specs)} samples, {len(plan.failures)} materials not planned; "
          f"{'already stored' if read_from else 'stored'} in {args.dir} ({stored.name}, signed with {key_path()})")
    if args.wheels:
        carried = wheel_versions(args.wheels)
        for name in PLANNING_LIBRARIES:
            if name in carried and carried[name] != library_version(name):
                print(f"warning: {args.wheels} carries {name} {carried[name]}, this interpreter has {library_version(name)}: "
                      f"the other machine will not find this plan and will plan afresh", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
