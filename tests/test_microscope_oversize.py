"""A scan whose least hold at once does not fit `namsa reconstruct`'s memory budget (issue 39, item 6).

An 18 MB gzip .hspy held 8 x 8 x 4096 x 4096 float32 (4 GiB): reconstruct read it for 226 s up to
3.6 GB, then exited 1 with the CLI's catch-all advice for simulate and train. Its header says the
shape and dtype, so the least a reconstruction holds at once (one model tile of patterns as stored,
the checks' float64 copies of one pattern: stage.microscope.memory) is known before the first read
and refused in one line with reconstruct's own advice. The files here are small: the big one
declares its 4 GiB and stores one noisy chunk (the declared-size check asks for that much), and the
one chunk it stores is damaged, so a read of it would fail: the refusal comes before any read.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
pytest.importorskip("rsciio")
from microscope_helpers import damage_first_chunk, disc_scan, write_hspy  # noqa: E402
from test_microscope_damaged_reads import _one_line  # noqa: E402
from test_reconstruct_cli import _run  # noqa: E402

#: what the CLI's catch-all MemoryError line advises (simulate's and train's settings, a resume)
FOREIGN_ADVICE = ("cell_lateral_A", "thickness_A", "batch_size", "execution.workers", "rerun")


def _declaring(path: Path, shape: tuple[int, int, int, int]) -> Path:
    """A HyperSpy .hspy whose gzip dataset declares ``shape`` float32 in (1, 1, 512, 512) chunks,
    of which only the first is written (noise: 1 MiB that does not compress); then damaged."""
    write_hspy(path, disc_scan((2, 2)))
    with h5py.File(path, "a") as fh:
        name = "Experiments/scan/data"
        attrs = dict(fh[name].attrs)
        del fh[name]
        data = fh.create_dataset(name, shape=shape, dtype="f4", chunks=(1, 1, 512, 512), compression="gzip")
        data[0, 0, :512, :512] = np.random.default_rng(0).random((512, 512), dtype=np.float32)
        data.attrs.update(attrs)
    return damage_first_chunk(path)


def test_a_small_gzip_file_of_4_gib_is_refused_before_any_read(tmp_path, capsys):
    path = _declaring(tmp_path / "big.hspy", (8, 8, 4096, 4096))
    assert path.stat().st_size < 2 * 2**20
    assert _run("reconstruct", path, "--model", "pretrained:study-scan", "--out", tmp_path / "out") == 2
    line = _one_line(capsys)
    assert "its 8 x 8 x 4096 x 4096 float32 scan (4 GiB decompressed" in line
    assert "needs at least 4 GiB at once (64 patterns as stored" in line and "--memory-gb 2 gives" in line
    assert ("crop or bin its patterns to at most 2048 x 2048 px (the model reads 32 x 32 px of 0.17-0.236 "
            "1/Angstrom around k = 0)") in line
    assert "pass --memory-gb 8" in line or "machine with at least 8 GB" in line
    # what the header shows against the model comes in the same line: 8 positions, a tile is 32
    assert "the scan has 8 positions along y" in line
    assert not any(word in line for word in FOREIGN_ADVICE), line
    assert not (tmp_path / "out").exists()


def test_the_budget_is_the_one_memory_gb_gives(tmp_path, capsys):
    """A scan that fits by default is refused under a smaller --memory-gb, with the one that holds it."""
    path = _declaring(tmp_path / "scan.hspy", (32, 32, 512, 512))
    argv = ["reconstruct", path, "--model", "pretrained:study-scan", "--out", tmp_path / "out"]
    assert _run(*argv, "--memory-gb", "0.5") == 2
    line = _one_line(capsys)
    assert "needs at least 1 GiB at once (1024 patterns as stored: the model's 32 x 32-position tile)" in line
    assert "--memory-gb 0.5 gives the data blocks 0.25 GiB (50% of it)" in line
    assert "crop or bin its patterns to at most 256 x 256 px" in line and "pass --memory-gb 2" in line
    assert _run(*argv) == 2  # --memory-gb 2 holds it: the first read finds the damaged chunk
    assert "its data could not be read" in _one_line(capsys)


def test_running_out_of_memory_all_the_same_gets_reconstruct_s_advice(tmp_path):
    """A MemoryError inside reconstruct (here from its pattern hook, as from other programs taking the
    memory) is reconstruct's one line, not the CLI's catch-all for simulate and train."""
    from namsa.errors import MemoryShortage
    from workflow.reconstruct import reconstruct

    path = write_hspy(tmp_path / "scan.hspy", disc_scan((32, 32)))  # the study-scan model's physics

    def exhausted(block: np.ndarray, y0: int, x0: int) -> np.ndarray:
        raise MemoryError

    with pytest.raises(MemoryShortage, match=r"^namsa reconstruct ran out of memory at --memory-gb 0.05 \(.* GB available "
                                       r"now\); pass a smaller --memory-gb .* or bin the detector's patterns") as err:
        reconstruct(path, "pretrained:study-scan", tmp_path / "out", memory_gb=0.05, pattern_transform=exhausted)
    assert not any(word in str(err.value) for word in FOREIGN_ADVICE)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_a_memory_gb_above_the_machine_s_buys_nothing():
    """The budget is at most the machine's memory: --memory-gb 100 on a 2 GiB machine is refused
    with the machine's size, and the advice is another machine, not a flag it cannot honour."""
    from stage.microscope import LazyScan, RawScan, memory_problem

    data = np.broadcast_to(np.float32(0), (8, 8, 4096, 4096))  # the shape and dtype, no bytes
    scan = RawScan(data=LazyScan(data, "big.hspy"), found={}, path="big.hspy")
    line = memory_problem(scan, (32, 32), (32, (0.17, 0.236)), memory_gb=100, share=0.5, machine_bytes=2 * 2**30)
    assert "needs at least 4 GiB at once" in line and "but this machine has 2 GiB in all" in line
    assert line.endswith("or run it on a machine with at least 8 GB (this one has 2)")
    assert memory_problem(scan, (32, 32), (32, (0.17, 0.236)), memory_gb=100, share=0.5,
                          machine_bytes=64 * 2**30) is None
