"""The Makefile's install step says what it is doing before each (quiet, minute-long) pip call."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_every_pip_step_of_make_venv_is_announced(tmp_path):
    # -n: print the recipe without running it; -B: as if .venv were not yet built.
    dry = subprocess.run(["make", "-n", "-B", "venv", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    commands = [line for line in dry if not line.startswith("#")]
    pip_steps = [i for i, line in enumerate(commands) if " -m pip install" in line or " -m venv " in line]
    assert len(pip_steps) == 4   # venv, pip, torch, the package with its extras
    for i in pip_steps:
        assert commands[i - 1].startswith('echo "make: '), (commands[i - 1], commands[i])
    assert "about a minute" in commands[pip_steps[-1] - 1]
