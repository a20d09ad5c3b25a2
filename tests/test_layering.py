"""The house's layering (docs/architecture.md): import-linter's contracts in pyproject.toml hold for
the tree, an import that runs back up (a physics module importing the evaluation) breaks them, and so
does a circle between the modules of one room (the training loop imported by its own data module)."""
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


def _copy_of_the_tree(root: Path) -> None:
    for room in ROOMS:
        shutil.copytree(REPO / room, root / room, ignore=shutil.ignore_patterns("__pycache__", "pretrained"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")


def test_an_import_running_back_up_breaks_the_contract(tmp_path):
    _copy_of_the_tree(tmp_path)
    with open(tmp_path / "namsa" / "constants.py", "a") as fh:
        fh.write("\nfrom evaluation import metrics  # runs back up: physics must not know the evaluation\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    assert "rooms depend one way" in done.stdout and "BROKEN" in done.stdout
    assert "namsa.constants -> evaluation" in done.stdout


def test_a_circle_inside_a_room_breaks_the_contract(tmp_path):
    _copy_of_the_tree(tmp_path)
    with open(tmp_path / "models" / "training" / "data.py", "a") as fh:   # loop.py imports data.py
        fh.write("\nfrom .loop import Trainer  # a circle: the data module asks the loop that owns it\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    broken = done.stdout[done.stdout.index("Broken contracts"):]
    assert "no circles inside a room" in broken and "No cycles are allowed in models.training" in broken
