"""The Makefile's install step says what it is doing before each (quiet, minute-long) pip call."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from make_dry_run import make_dry_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_every_pip_step_of_make_venv_is_announced(tmp_path):
    # -n: print the recipe without running it; -B: as if .venv were not yet built.
    dry = make_dry_run("-B", "venv", f"VENV={tmp_path / 'venv'}")
    commands = [line for line in dry if not line.startswith("#")]
    pip_steps = [i for i, line in enumerate(commands) if " -m pip install" in line or " -m venv " in line]
    assert len(pip_steps) == 4   # venv, pip, torch, the package with its extras
    for i in pip_steps:
        assert commands[i - 1].startswith('echo "make: '), (commands[i - 1], commands[i])
    assert "about a minute" in commands[pip_steps[-1] - 1]


def dry_run(target: str, venv: Path) -> list[str]:
    """The recipe lines ``make -n TARGET`` would run, with VENV pointing at a venv not yet built."""
    return make_dry_run(target, f"VENV={venv}")


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_notebook_target_opens_the_notebooks_in_jupyterlab_from_the_venv(tmp_path):
    venv = tmp_path / "venv"
    lines = dry_run("notebook", venv)
    assert any(" -m venv " in line for line in lines)   # it builds the venv first, like demo and test
    launch = lines[-1]
    assert launch.startswith(f"{venv}/bin/jupyter lab ") and "--notebook-dir=notebooks" in launch.split(), launch
    assert (ROOT / "notebooks" / "reconstruct.ipynb").is_file()
    # JupyterLab is installed into the venv on first use only: guarded by an import check, announced.
    install = next(i for i, line in enumerate(lines) if "pip install -q jupyterlab" in line)
    guard = " ".join(lines[install - 1:install + 1])
    assert f"{venv}/bin/python -c 'import jupyterlab'" in guard and "||" in guard and 'echo "make: installing' in guard


def test_jupyterlab_is_not_a_dev_dependency():
    # Large and needed only by `make notebook`: `make venv` (and CI) must not pull it.
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    assert not [d for d in required if d.lower().startswith("jupyterlab")]


def _pins() -> dict[str, str]:
    """constraints.txt as {canonical name: version}."""
    from packaging.utils import canonicalize_name

    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pins = [line.split("==") for line in lines if line.strip() and not line.startswith("#")]
    assert all(len(pin) == 2 for pin in pins), "every line of constraints.txt is NAME==VERSION"
    return {canonicalize_name(name): version for name, version in pins}


def test_every_requirement_of_make_venv_is_pinned_at_a_version_it_allows():
    # A fresh clone must install what the suite passed with: each of pyproject's requirements (the
    # package's and [dev]'s, which make venv installs) has an exact pin inside its own range.
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _pins()
    for spec in project["dependencies"] + project["optional-dependencies"]["dev"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned in constraints.txt: run make lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (spec, pins[name])
    assert "horovod" not in pins and "namsa" not in pins   # built here / this checkout


def test_the_installed_dask_and_distributed_import_together():
    """abtem's distributed pins dask exactly; an unpinned install once paired the newest dask with
    distributed 2021.4.1, which fails on import (pyproject.toml's floor, [dev]). `make test-latest` runs
    this against the newest versions."""
    done = subprocess.run([sys.executable, "-c", "import distributed"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1:]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_venv_installs_from_the_constraints_and_torch_at_their_pin(tmp_path):
    lines = dry_run("venv", tmp_path / "venv")
    installs = [line for line in lines if " -m pip install -q " in line and "--upgrade pip" not in line]
    assert len(installs) == 2 and all(" -c constraints.txt " in line for line in installs), installs
    torch = next(line for line in installs if "torch==" in line).split("torch==")[1].split()[0]
    assert _pins()["torch"] == torch


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_test_latest_runs_the_suite_unconstrained_in_its_own_venv_and_lock_writes_only_after_it(tmp_path):
    latest = tmp_path / "latest"
    lines = make_dry_run("lock", f"LATEST_VENV={latest}")
    suite = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert lines[suite].startswith(f"{latest}/bin/python -m pytest")
    assert any(" -c /dev/null " in line for line in lines[:suite])   # the newest versions, no pins
    written = next(i for i, line in enumerate(lines) if "> constraints.txt.new" in line)
    assert written > suite and "mv constraints.txt.new constraints.txt" in lines[written]
