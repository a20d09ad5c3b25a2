"""Links and special files in a model or checkpoint directory (issue 32, E): a symlinked file inside
a model directory used to be opened (and read) before anything refused it. Now every file the
loader opens is `lstat`ed first and opened with O_NOFOLLOW (`models.safe_files.open_regular`): a link's
target is never opened. The FIFO here counts every open of it for reading, so a test of "refused"
cannot pass while the target is still opened. `namsa publish` publishes nothing
from a model directory that holds a link.
"""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

import models
from models import checkpoint as ckpt
from models.card import CARD_FILE
from test_hostile_model_dirs import assert_one_line_refusal, base_run, symlink_outside  # noqa: F401  (fixture)


class FifoOpens:
    """A FIFO whose every open for reading is counted: a thread opens its write end again and again
    (each open blocks until a reader comes), writes a byte and closes."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path, self.opens, self.stop = path, 0, False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            with open(self.path, "wb") as fh:  # returns once someone opened the FIFO for reading
                if self.stop:
                    return
                self.opens += 1
                fh.write(b"x")

    def close(self) -> int:
        """Stop the thread (our own non-blocking open releases it) and return the opens it counted."""
        self.stop = True
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self.thread.join(timeout=10)
        os.close(fd)
        return self.opens


class OpenWatch:
    """Every open of one regular file, seen by the kernel (inotify IN_OPEN): whoever opens it, by
    whatever path or link, is noticed."""

    IN_OPEN = 0x20

    def __init__(self, path: Path) -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK)
        assert self.fd >= 0 and libc.inotify_add_watch(self.fd, bytes(path), self.IN_OPEN) >= 0

    def opened(self) -> bool:
        try:
            return bool(os.read(self.fd, 4096))
        except BlockingIOError:
            return False
        finally:
            os.close(self.fd)


def _linked_folder(base: Path, tmp_path: Path, name: str) -> Path:
    run = tmp_path / "run"
    shutil.copytree(base, run, symlinks=True)
    return run / "checkpoints" / ckpt.step_dir_name(1) if name == ckpt.STATE_FILE else run / "model"


NAMES = [ckpt.MODEL_FILE, CARD_FILE, ckpt.STATE_FILE]


@pytest.mark.parametrize("name", NAMES)
def test_a_link_to_a_file_outside_is_refused_before_that_file_is_opened(base_run, tmp_path, name):  # noqa: F811
    """The target is the genuine file moved out: a loader that followed the link would read it."""
    folder = _linked_folder(base_run, tmp_path, name)
    target = tmp_path / f"outside-{name}"
    os.replace(folder / name, target)
    (folder / name).symlink_to(target)
    watch = OpenWatch(target)
    assert_one_line_refusal(lambda: models.load_reconstructor(folder, device="cpu"), "is a symbolic link")
    assert not watch.opened()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", NAMES)
def test_a_link_to_a_fifo_is_refused_before_any_open(base_run, tmp_path, name):  # noqa: F811
    folder = _linked_folder(base_run, tmp_path, name)
    fifo = FifoOpens(tmp_path / "outside.fifo")
    (folder / name).unlink()
    (folder / name).symlink_to(fifo.path)
    try:
        assert_one_line_refusal(lambda: models.load_reconstructor(folder, device="cpu"), "is a symbolic link")
    finally:
        opened = fifo.close()
    assert opened == 0


def test_the_open_watch_sees_an_open(tmp_path):
    (tmp_path / "f").write_text("x")
    watch = OpenWatch(tmp_path / "f")
    (tmp_path / "f").read_text()
    assert watch.opened()


def test_the_fifo_counter_sees_an_open(tmp_path):
    """The counter itself: an ordinary open of the FIFO for reading is counted."""
    fifo = FifoOpens(tmp_path / "f.fifo")
    with open(fifo.path, "rb") as fh:
        assert fh.read(1) == b"x"
    assert fifo.close() >= 1


def test_publishing_a_model_with_a_link_is_refused(base_run, tmp_path):  # noqa: F811
    from workflow.pretrained import publish

    run = tmp_path / "run"
    shutil.copytree(base_run, run, symlinks=True)
    (run / "eval").mkdir()
    (run / "eval" / "metrics.json").write_text("{}")
    (run / "config.resolved.yaml").write_text("{}")
    symlink_outside(ckpt.MODEL_FILE)(run / "model")
    # refused by the run-directory check (workflow.run_paths) before any file of it is opened
    assert_one_line_refusal(lambda: publish(run, "linked", root=tmp_path / "pretrained"),
                            f"model/{ckpt.MODEL_FILE} is a symbolic link")
    assert not (tmp_path / "pretrained").exists()
