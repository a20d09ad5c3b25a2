"""Damaged or hostile checkpoint directories, refused with one line as model directories are
(test_hostile_model_dirs.py, whose tiny real run and mutations these reuse), and a full disk at a
checkpoint save, which keeps the previous checkpoint intact."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import models
from models import checkpoint as ckpt
from test_hostile_model_dirs import (REPO, assert_one_line_refusal, base_run, symlink_inside,  # noqa: F401  (fixture)
                                     symlink_outside)


# ----------------------------------------------------------------------- checkpoint directories

def _state_edit(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(step: Path) -> None:
        state = json.loads((step / ckpt.STATE_FILE).read_text())
        change(state)
        (step / ckpt.STATE_FILE).write_text(json.dumps(state))
    return apply


CHECKPOINT_CASES = [
    ("state-files-traversal", _state_edit(lambda s: s["files"].update(
        {"../../../etc/passwd": {"bytes": 1, "xxh3_128": "0" * 32}})), "'files' must map"),
    ("state-a-list", lambda step: (step / ckpt.STATE_FILE).write_text("[]"), "has format list"),
    ("state-missing-architecture", _state_edit(lambda s: s.pop("architecture")), "missing field architecture"),
    ("state-bad-targets", _state_edit(lambda s: s.update(targets="potential")), "targets"),
    ("state-weights-symlink-outside", symlink_outside(ckpt.MODEL_FILE), "is a symbolic link"),
    ("state-file-symlink-inside", symlink_inside(ckpt.STATE_FILE), "is a symbolic link"),
]


@pytest.mark.parametrize("case", CHECKPOINT_CASES, ids=[c[0] for c in CHECKPOINT_CASES])
def test_hostile_checkpoint_dir_is_one_line(case, base_run, tmp_path):
    _, mutate, says = case
    run = tmp_path / "run"
    shutil.copytree(base_run, run, symlinks=True)
    step = run / "checkpoints" / ckpt.step_dir_name(1)
    mutate(step)
    assert_one_line_refusal(lambda: models.load_reconstructor(step, device="cpu"), says)


def test_the_base_checkpoint_loads(base_run):
    step = base_run / "checkpoints" / ckpt.step_dir_name(1)
    assert models.load_reconstructor(step, device="cpu").targets == ["potential"]


# ----------------------------------------------------------------------- a full disk at a checkpoint

_FULL_DISK = """
import resource, signal, sys, torch
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from test_hostile_model_dirs import tiny_state
from models import checkpoint as ckpt
root = Path(sys.argv[1])
model, state = tiny_state()
opt = torch.optim.Adam(model.parameters())
ckpt.save_checkpoint(root, 1, model.state_dict(), opt.state_dict(), state)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)          # writes past the limit fail with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
try:
    ckpt.save_checkpoint(root, 2, model.state_dict(), opt.state_dict(), state)
except ckpt.CheckpointWriteError as exc:
    print(exc)
    sys.exit(2)
"""


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one(tmp_path):
    """RLIMIT_FSIZE in a subprocess (SIGXFSZ ignored, so the write fails with EFBIG) stands in for
    a full disk: one line, no temporaries left, step 1 intact and loadable."""
    root = tmp_path / "checkpoints"
    done = subprocess.run([sys.executable, "-c", _FULL_DISK, str(root), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and "cannot write checkpoint" in lines[0] and "step-00000001 is intact" in lines[0]
    assert sorted(p.name for p in root.iterdir()) == [ckpt.step_dir_name(1)]
    path, model_state, _, _ = ckpt.load_latest(root)
    assert path.name == ckpt.step_dir_name(1) and "head.weight" in model_state
    assert os.path.getsize(path / ckpt.MODEL_FILE) > 4096  # the limit would have cut a model file
