"""`make -n` on the repository's Makefile, as a user's shell would run it.

Under `make test` or `make test-latest` the suite runs inside make, which hands its command-line
variables down twice: through MAKEFLAGS to every make below it, and as environment variables of the
recipe (test-latest's ``CONSTRAINTS=/dev/null``, which the Makefile's ``CONSTRAINTS ?= ...`` then
keeps). Either would rewrite the recipes these tests read, so the dry run drops both: make's own
variables, and every variable the Makefile gives a default with ``?=``."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: what a make passes down to the makes it runs
MAKE_ENVIRONMENT = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")


def makefile_defaults() -> set[str]:
    """The variables the Makefile defaults with ``NAME ?= value`` (an environment variable overrides them)."""
    return set(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)\s*\?=", (ROOT / "Makefile").read_text(), re.M))


def make_dry_run(*args: str) -> list[str]:
    """The recipe lines ``make -n --no-print-directory ARGS`` prints in the repository root."""
    dropped = set(MAKE_ENVIRONMENT) | makefile_defaults()
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True).stdout.splitlines()
