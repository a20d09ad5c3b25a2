"""tests/fuzzing.py: `make test` replays the same fuzz examples every run, `make fuzz` searches new ones."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from make_dry_run import make_dry_run
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from fuzzing import EXAMPLE_DATABASE, REPLAY, SEARCH, fuzz_settings

ROOT = Path(__file__).resolve().parents[1]


def _drawn(profile: str) -> list[int]:
    """The integers one run of a fresh hypothesis test draws under ``profile``."""
    settings.load_profile(profile)
    try:
        seen: list[int] = []

        @fuzz_settings(20)
        @given(st.integers(0, 10**9))
        def probe(value):
            seen.append(value)

        probe()
        return seen
    finally:
        settings.load_profile(REPLAY)


def test_the_replay_tries_the_same_inputs_every_run_and_a_search_new_ones(monkeypatch):
    assert _drawn(REPLAY) == _drawn(REPLAY)
    monkeypatch.setenv("NAMSA_FUZZ_SCALE", "3")
    first, second = _drawn(SEARCH), _drawn(SEARCH)
    assert len(first) >= 40 and set(first) != set(second)   # 3 x 20 examples asked; a fresh seed each run


def test_a_search_keeps_what_it_finds_and_make_test_replays_without_a_database():
    search, replay = settings.get_profile(SEARCH), settings.get_profile(REPLAY)
    assert isinstance(search.database, DirectoryBasedExampleDatabase) and not search.derandomize
    assert Path(search.database.path) == EXAMPLE_DATABASE and search.print_blob
    assert replay.derandomize and replay.database is None
    assert settings.default.derandomize          # what the suite runs under unless told otherwise


def test_a_bad_scale_is_one_line(monkeypatch):
    settings.load_profile(SEARCH)
    try:
        monkeypatch.setenv("NAMSA_FUZZ_SCALE", "ten")
        with pytest.raises(SystemExit, match="NAMSA_FUZZ_SCALE='ten' must be a whole number"):
            fuzz_settings(5)
    finally:
        settings.load_profile(REPLAY)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_fuzz_selects_every_hypothesis_test_under_the_search_profile(tmp_path):
    lines = make_dry_run("fuzz", f"VENV={tmp_path / 'venv'}")
    assert any("-m pytest -m fuzz --hypothesis-profile=search" in line for line in lines), lines
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                                "-m", "fuzz", "tests/test_fuzz_configs.py", "tests/test_icom.py"], cwd=ROOT,
                               capture_output=True, text=True).stdout
    assert "test_fuzz_configs.py::" in collected and "test_icom.py::" not in collected
