"""The house's layering (docs/architecture.md): import-linter's contracts in pyproject.toml hold for
the tree, and an import that runs back up (a physics module importing the evaluation) breaks them."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOMS = ("namsa", "stage", "models", "evaluation", "workflow")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """Run import-linter on the tree at ``root`` (its pyproject.toml holds the contracts)."""
    exe = Path(sys.executable).parent / "lint-imports"
    # The rooms are imported from ``root`` (first on the path), not from the editable install.
    return subprocess.run([str(exe), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_the_rooms_keep_their_layering():
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_an_import_running_back_up_breaks_the_contract(tmp_path):
    for room in ROOMS:
        shutil.copytree(REPO / room, tmp_path / room, ignore=shutil.ignore_patterns("__pycache__", "pretrained"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "namsa" / "constants.py", "a") as fh:
        fh.write("\nfrom evaluation import metrics  # runs back up: physics must not know the evaluation\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    assert "rooms depend one way" in done.stdout and "BROKEN" in done.stdout
    assert "namsa.constants -> evaluation" in done.stdout
