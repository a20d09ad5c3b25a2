"""scripts/build_horovod.sh records why a build failed instead of dying with it.

The script is run for real on a venv whose python cannot install anything (every `-m pip` exits
3, like a machine without a package index), so the build fails at its first step in a second.
"""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_horovod.sh"

#: a python that has torch but no Horovod and no working pip
PYTHON = """#!/bin/bash
case "$*" in
  *"import horovod.torch"*) exit 1 ;;
  *"import sys, torch"*) echo cp311-torchtest; exit 0 ;;
  *) echo "pip: no index reachable" >&2; exit 3 ;;
esac
"""


@pytest.fixture
def broken_venv(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("NAMSA_WHEEL_CACHE", str(tmp_path / "wheels"))
    return venv


def run_script(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(venv), *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ))


def test_a_failed_soft_build_records_its_reason_and_is_not_retried(broken_venv, tmp_path):
    done = run_script(broken_venv, "--soft")
    assert done.returncode == 0, done.stderr  # --soft never fails make test
    status = (broken_venv / ".horovod-status").read_text()
    assert status.startswith("unavailable: wheel build failed: build exited 3 after ")
    marker = tmp_path / "wheels" / "cp311-torchtest" / "build-failed.txt"
    assert marker.read_text().startswith("build exited 3 after ")
    # The next soft run reports the recorded failure at once instead of building again.
    again = run_script(broken_venv, "--soft")
    assert again.returncode == 0
    assert "an earlier build failed (build exited 3" in (broken_venv / ".horovod-status").read_text()
    assert "building" not in again.stdout


def test_a_failed_hard_build_exits_non_zero_with_the_reason(broken_venv):
    done = run_script(broken_venv)
    assert done.returncode == 1
    assert "horovod: wheel build failed: build exited 3" in done.stderr
