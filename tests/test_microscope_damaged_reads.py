"""Microscope files whose damage, odd layout or odd values show only when they are read (issue 32,
D3-D6): the first check reads bounded memory whatever the detector; a damaged file read lazily is
one line about the input (not a traceback at the first slice, not a write error under ``--out``);
a blanked frame is data (iCoM: zero signal); a contiguous ``.hspy`` is read lazily and reconstructed;
dark-subtracted noise is not "negative data"; a .zspy folder with chunk files missing is refused (zarr
would fill them in as zeros), and namsa's own .zspy writer stores an empty chunk too. Real files
(rsciio, h5py) and a real trained model.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)

h5py = pytest.importorskip("h5py")
pytest.importorskip("rsciio")
from microscope_helpers import disc_scan, rewrite_data, write_arina, write_hspy  # noqa: E402
from stage.microscope import ExperimentalInputError, MicroscopeFileError, read_scan  # noqa: E402
from test_reconstruct_cli import _run, _signal, _write, sample, tiny_model  # noqa: E402, F401


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("namsa: error: "), err
    return err[0]


class _Requests:
    """A (sy, sx, ky, kx) float32 array-like that records the bytes each slice asks for and returns
    zeros of the sliced shape: a stand-in for a huge file, so nothing big is ever allocated by it."""

    def __init__(self, shape: tuple[int, int, int, int]) -> None:
        self.shape, self.dtype, self.asked = shape, np.dtype(np.float32), []

    def __getitem__(self, key):
        picked = np.empty(self.shape[:2], dtype=bool)[key[:2]]
        self.asked.append(picked.size * self.shape[2] * self.shape[3] * 8)
        return np.zeros((*picked.shape, *self.shape[2:]), np.float32)


def test_the_mean_pattern_reads_bounded_bytes_whatever_the_detector():
    from stage.microscope import autocal

    for shape in [(64, 64, 1024, 1024), (3, 1000, 1024, 1024), (1000, 3, 2048, 2048)]:
        data = _Requests(shape)
        patterns = autocal.subsample(data)
        assert 1 <= len(patterns) <= max(1, autocal.SUBSAMPLE_BYTES // (shape[2] * shape[3] * 8))
        assert data.asked == [len(patterns) * shape[2] * shape[3] * 8]


def test_a_truncated_blockfile_is_one_line_about_the_file(tmp_path, capsys):
    from rsciio.blockfile import file_writer

    counts = np.rint(disc_scan((8, 8)) / disc_scan().max() * 255).astype(np.uint8)
    signal = _signal(counts, (0.5, 0.5), None, {})
    signal["original_metadata"] = {"blockfile_header": {"Beam_energy": 200000, "Note": ""}}
    path = tmp_path / "scan.blo"
    file_writer(str(path), signal)
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size // 2)
    scan = read_scan(path)  # opening reads no frame
    with pytest.raises(MicroscopeFileError, match=r"scan.blo: its data could not be read \(mmap length"):
        scan.data[:2]
    assert _run("reconstruct", path, "--model", "pretrained:study-scan", "--out", tmp_path / "out",
                "--semiangle-mrad", "20", "--dk-inv-a", "0.17", "--scan-step-a", "0.5") == 2
    assert "scan.blo: its data could not be read" in _one_line(capsys)
    assert not (tmp_path / "out").exists()


def test_a_blanked_frame_is_zero_signal_not_an_error(sample, tiny_model, tmp_path):
    """One frame without counts (beam blanked): iCoM takes its CoM as 0 and the maps are written."""
    from namsa.icom import center_of_mass

    sy, sx = sample.meta.scan_shape
    data = sample.cbed.reshape(sy, sx, *sample.cbed.shape[1:]).copy()
    data[3, 4] = 0.0
    com = center_of_mass(data.reshape(-1, *data.shape[2:]), 0.1)
    assert np.all(com[3 * sx + 4] == 0.0) and np.all(np.isfinite(com))
    np.testing.assert_array_equal(com[:5], center_of_mass(sample.cbed[:5], 0.1))
    scan = _write(tmp_path / "blank.hspy", sample, data=data)
    assert _run("reconstruct", scan, "--model", tiny_model[0], "--out", tmp_path / "out") == 0
    assert np.all(np.isfinite(np.load(tmp_path / "out" / "icom_potential.npy")))


def test_a_contiguous_hspy_is_read_lazily_and_reconstructed(sample, tiny_model, tmp_path):
    sy, sx = sample.meta.scan_shape
    data = sample.cbed.reshape(sy, sx, *sample.cbed.shape[1:])
    chunked = _write(tmp_path / "chunked.hspy", sample)
    contiguous = rewrite_data(_write(tmp_path / "contiguous.hspy", sample), data)
    with h5py.File(contiguous) as fh:
        assert fh["Experiments/scan/data"].chunks is None
    scan = read_scan(contiguous)
    np.testing.assert_array_equal(scan.data[2:5, 1:3], data[2:5, 1:3])
    assert scan.found == read_scan(chunked).found
    for name in ("chunked", "contiguous"):
        assert _run("reconstruct", tmp_path / f"{name}.hspy", "--model", tiny_model[0], "--out", tmp_path / name) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "contiguous" / "potential.npy"),
                                  np.load(tmp_path / "chunked" / "potential.npy"))


def test_dark_subtracted_noise_is_not_negative_data_but_negated_data_is():
    from stage.microscope.checks import refuse_if_negative

    rng = np.random.default_rng(3)
    mean = disc_scan((1, 1), px=32)[0, 0].astype(np.float64) + rng.normal(0, 2e-4, (32, 32))
    assert mean.min() < 0
    refuse_if_negative(mean, "dark-subtracted")
    with pytest.raises(ExperimentalInputError, match="the data are negative"):
        refuse_if_negative(-mean, "negated")


@pytest.mark.parametrize("size", [np.array([b"0.05 nm"]), np.array([]), np.array([np.nan]), np.array([-0.05]),
                                  np.array([np.inf])])
def test_arina_pixel_size_that_is_no_positive_number_is_no_calibration(tmp_path, size):
    frames = np.ones((4, 8, 8), np.uint16)
    master = write_arina(tmp_path, frames, per_file=4)
    with h5py.File(master, "a") as fh:
        fh["STEM Metadata"].attrs["Pixel Size"] = size
    assert "step_A" not in read_scan(master).found


def test_a_small_file_declaring_a_large_dataset_is_refused_before_any_read(tmp_path):
    path = rewrite_data(write_hspy(tmp_path / "scan.hspy", disc_scan()), declared=(256, 256, 256, 256))
    with pytest.raises(MicroscopeFileError, match=r"declares a 256 x 256 x 256 x 256 float32 dataset .* but holds "
                                                  rf"only {os.path.getsize(path)} bytes"):
        read_scan(path)


def test_an_empad_raw_is_refused_with_the_way_to_read_it(tmp_path):
    raw = Path(tmp_path / "scan_x8_y8.raw")
    raw.write_bytes(bytes(130 * 128 * 4 * 64))
    with pytest.raises(ExperimentalInputError, match=r"pass the \.xml beside it"):
        read_scan(raw)


def _zspy(path: Path, data: np.ndarray) -> Path:
    """``data`` written by namsa's own .zspy writer (HyperSpy's zarr-2 layout, one scan row per chunk)."""
    from stage.microscope import ScanCalibrations, write_scan

    write_scan(path, data, ScanCalibrations(200.0, 20.0, 0.2, (0.375, 0.375)))
    return path


def test_a_zspy_with_chunk_files_missing_is_refused_naming_them(tmp_path, capsys):
    """Issue 39 (6): zarr reads a missing chunk as its fill value without a word, so a folder copied in
    part reconstructed half a scan of zeros with exit 0; it is one line naming the chunks and scan rows."""
    path = _zspy(tmp_path / "scan.zspy", disc_scan((8, 8)))
    chunks = path / "Experiments" / "scan" / "data"
    for row in (3, 5, 6):
        (chunks / f"{row}.0.0.0").unlink()
    assert _run("reconstruct", path, "--model", "pretrained:study-scan", "--out", tmp_path / "out") == 2
    line = _one_line(capsys)
    assert ("3 of the 8 chunk files of Experiments/scan/data are missing (3.0.0.0, 5.0.0.0, 6.0.0.0; scan rows 3, "
            "5-6)") in line
    assert "not blanked frames" in line and "copy it again" in line
    assert not (tmp_path / "out").exists()


def test_namsa_s_zspy_writer_stores_the_chunk_of_a_blanked_row(tmp_path):
    """A blanked scan row is data: its (all zero) chunk is written, so the missing-chunk check never
    takes it for lost data (zarr 3 skips empty chunks unless told)."""
    data = disc_scan((4, 4))
    data[2] = 0.0
    path = _zspy(tmp_path / "blank.zspy", data)
    assert sorted(p.name for p in (path / "Experiments" / "scan" / "data").glob("[0-9]*")) == [
        f"{row}.0.0.0" for row in range(4)]
    np.testing.assert_array_equal(read_scan(path).data[:], data)
