"""The typed model card end to end (models.card, models.card_writer): a card read is a `ModelCard`
whose JSON is exactly the file's; the one writer is atomic (a write that fails after its temporary
file exists leaves the old card, and no temporary file); reading a microscope file imports no lmdb."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.card import CARD_FILE, ModelCard, read_card_file, validate_card
from models.card_writer import card_from_state, write_card

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "models" / "pretrained" / "study-scan" / CARD_FILE


def test_the_shipped_card_round_trips_typed(tmp_path):
    card = read_card_file(SHIPPED)
    assert isinstance(card, ModelCard)
    assert card.to_json() == json.loads(SHIPPED.read_text())  # nothing added, dropped or retyped
    assert card.expects_input is not None and card.expects_input.sampling.scan_shape == (32, 32)
    again = read_card_file(write_card(tmp_path, card))
    assert again == card and again.to_json() == card.to_json()
    assert again.expects_input.sampling == card.expects_input.sampling


def test_a_failed_write_leaves_the_old_card(tmp_path, monkeypatch):
    old = read_card_file(SHIPPED)
    write_card(tmp_path, old)
    before = (tmp_path / CARD_FILE).read_bytes()
    new = validate_card({**old.to_json(), "name": "replacement"}, "the new card")
    seen: list[list[str]] = []

    def disk_full(fd: int) -> None:  # the temporary file is written, then the disk fills
        seen.append(sorted(os.listdir(tmp_path)))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_card(tmp_path, new)
    monkeypatch.undo()
    assert len(seen[0]) == 2  # the card and the temporary file beside it, in the same folder
    assert (tmp_path / CARD_FILE).read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [CARD_FILE]  # the temporary file is gone
    assert read_card_file(tmp_path / CARD_FILE).name == old.name != "replacement"


def test_a_write_killed_half_way_leaves_the_old_card(tmp_path):
    """A writer process killed (SIGKILL) while its temporary file is written: the card is the old one."""
    write_card(tmp_path, read_card_file(SHIPPED))
    before = (tmp_path / CARD_FILE).read_bytes()
    script = (f"import os, signal, sys\nsys.path.insert(0, {str(REPO)!r})\n"
              "from models.card import read_card_file\nfrom models.card_writer import write_card\n"
              f"card = read_card_file({str(SHIPPED)!r})\n"
              "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # dies with the data unsynced\n"
              f"write_card({str(tmp_path)!r}, card.model_copy(update={{'name': 'killed'}}))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert (tmp_path / CARD_FILE).read_bytes() == before


def test_card_from_state_is_the_checkpoint_card():
    shipped = read_card_file(SHIPPED).to_json()
    state = {k: shipped[k] for k in ("model_config", "architecture", "targets", "normalizer", "code_version",
                                     "train_config")}
    state.update(format_version=1, files=shipped["files"], optimizer={"not": "a card field"})
    card = card_from_state(state, "a test state", source="checkpoint", step=3)
    assert card.source == "checkpoint" and card.step == 3 and card.architecture.in_channels == 1024
    assert card.files["model.safetensors"].xxh3_128 == shipped["files"]["model.safetensors"]["xxh3_128"]


def test_reading_a_microscope_file_imports_no_lmdb():
    code = "import sys, stage.microscope.files, stage.microscope; assert 'lmdb' not in sys.modules, 'lmdb'"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
