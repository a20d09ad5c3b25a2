"""`make -n` on the repository's Makefile, as a user's shell would run it.

Under `make test` or `make test-latest` the suite runs inside make, which hands its command-line
variables to every make below it through MAKEFLAGS (test-latest's ``CONSTRAINTS=/dev/null`` would
then rewrite the recipes these tests read); the dry run drops them, and make's nesting level."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: what a make passes down to the makes it runs
MAKE_ENVIRONMENT = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")


def make_dry_run(*args: str) -> list[str]:
    """The recipe lines ``make -n --no-print-directory ARGS`` prints in the repository root."""
    env = {k: v for k, v in os.environ.items() if k not in MAKE_ENVIRONMENT}
    return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True).stdout.splitlines()
