"""The suite's fuzzing settings (hypothesis), one owner for every fuzz test.

`make test` replays a fixed set of examples (profile ``replay``: derandomised, so every run tries the
same inputs and a red run is reproducible). `make fuzz` searches instead (profile ``search``: a fresh
seed each run, NAMSA_FUZZ_SCALE times as many examples, failures kept in hypothesis' example database
under .hypothesis/ and replayed first by the next search). A failure found by a search prints the input
and a ``@reproduce_failure`` blob; it becomes a regression case as an explicit ``@example(...)`` on the
test (or a named test beside it), so `make test` replays it for good (docs/bad-inputs.md, "Fuzzing").

The profiles are registered and ``replay`` loaded by tests/conftest.py before any test module is
imported; pytest's ``--hypothesis-profile=search`` (hypothesis' own plugin) picks the other.
"""
from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

REPLAY, SEARCH = "replay", "search"
#: where a search keeps what it found (gitignored): the next search replays it first
EXAMPLE_DATABASE = Path(__file__).resolve().parents[1] / ".hypothesis" / "examples"
#: fuzz tests build real files and run real commands: their per-test time is not a health problem
_SLOW_BY_DESIGN = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]


def register_profiles() -> None:
    """Register ``replay`` and ``search`` and load ``replay`` (the default of `make test`)."""
    settings.register_profile(REPLAY, derandomize=True, database=None, print_blob=True)
    settings.register_profile(SEARCH, derandomize=False, database=DirectoryBasedExampleDatabase(EXAMPLE_DATABASE),
                              print_blob=True)
    settings.load_profile(REPLAY)


def search_scale() -> int:
    """How many times each test's own example count a search tries (NAMSA_FUZZ_SCALE, default 10);
    1 in the replay, so `make test` keeps its budget."""
    if settings.default.derandomize:
        return 1
    raw = os.environ.get("NAMSA_FUZZ_SCALE", "10")
    if not raw.isdigit() or int(raw) < 1:
        raise SystemExit(f"NAMSA_FUZZ_SCALE={raw!r} must be a whole number >= 1 (e.g. 10)")
    return int(raw)


def fuzz_settings(max_examples: int, **overrides) -> settings:
    """A fuzz test's settings: ``max_examples`` in `make test`, scaled in a search; no deadline unless
    ``overrides`` sets one (each example runs real code on real files)."""
    return settings(max_examples=max_examples * search_scale(), deadline=overrides.pop("deadline", None),
                    suppress_health_check=_SLOW_BY_DESIGN, **overrides)


__all__ = ["REPLAY", "SEARCH", "EXAMPLE_DATABASE", "register_profiles", "search_scale", "fuzz_settings"]
