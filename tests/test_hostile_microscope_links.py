"""Microscope files that lead their reader out of the input's folder (issue 32, D1-D2), through
`namsa reconstruct` (`workflow.cli.main`): an Arina master with a virtual dataset, external raw
storage or an external link outside ``/entry/data``; symbolic links as the input, an Arina data
file, a Merlin ``.hdr``, an EMPAD raw file or a TIA ``.ser``. Each is refused with exit 2 and one
line before anything outside the folder is opened: the outside file is then replaced by one that
would read as valid data (or removed), so a reader that followed the link would have succeeded
or failed differently. The files are real (h5py, rsciio, byte by byte); no reader is mocked.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
pytest.importorskip("rsciio")
from namsa.sample_meta import SampleMeta  # noqa: E402
from microscope_helpers import disc_pattern, disc_scan, write_arina, write_hspy  # noqa: E402
from test_reconstruct_cli import _run  # noqa: E402

MODEL = "pretrained:study-scan"  # every refusal here comes before a model is loaded
FLAGS = ["--energy-kv", "200", "--semiangle-mrad", "20", "--dk-inv-a", "0.1736", "--scan-step-a", "0.375"]


def _refused(capsys, path: Path, out: Path) -> str:
    """reconstruct ``path``: exit 2, one ``namsa: error:`` line, nothing at ``out``."""
    capsys.readouterr()
    assert _run("reconstruct", path, "--model", MODEL, "--out", out, *FLAGS) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("namsa: error: "), err
    assert not out.exists()
    return err[0]


def _frames() -> np.ndarray:
    """A 6 x 6 scan of 16 px disc patterns as counts, (36, 16, 16) uint16."""
    return np.rint(disc_scan((6, 6), px=16, radius=3.0).reshape(36, 16, 16) * 1e5).astype(np.uint16)


def _outside(tmp_path: Path) -> Path:
    """An HDF5 file outside the scan's folder holding frames under /data: valid data a reader that
    followed a link would take."""
    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    other = tmp_path / "elsewhere" / "other.h5"
    with h5py.File(other, "w") as fh:
        fh["data"] = _frames()
        fh.create_group("m").attrs["Pixel Size"] = np.array([0.0375])
    return other


def _arina(tmp_path: Path) -> Path:
    (tmp_path / "scan").mkdir()
    return write_arina(tmp_path / "scan", _frames(), per_file=36)


# -- D1: an Arina master reads only itself and its data files ---------------------------------


def test_arina_virtual_dataset_pointing_outside_is_refused(tmp_path, capsys):
    master, other = _arina(tmp_path), _outside(tmp_path)
    with h5py.File(master, "a") as fh:
        del fh["entry/data/data_000001"]
        layout = h5py.VirtualLayout(shape=(36, 16, 16), dtype="u2")
        layout[...] = h5py.VirtualSource(str(other), "data", shape=(36, 16, 16))
        fh.create_virtual_dataset("entry/data/data_000001", layout)
    line = _refused(capsys, master, tmp_path / "out")
    assert "dataset /entry/data/data_000001 is virtual" in line and str(other) in line


@pytest.mark.parametrize("where", ["/etc/passwd", "tmp-file-outside"])
def test_arina_external_raw_storage_is_refused(tmp_path, capsys, where):
    master = _arina(tmp_path)
    if where != "/etc/passwd":
        (tmp_path / "elsewhere").mkdir()
        where = str(tmp_path / "elsewhere" / "frames.raw")
        _frames().tofile(where)
    size = os.path.getsize(where)
    with h5py.File(master, "a") as fh:
        del fh["entry/data/data_000001"]
        fh.create_dataset("entry/data/data_000001", shape=(1, 1, size), dtype="u1", external=[(where, 0, size)])
    line = _refused(capsys, master, tmp_path / "out")
    assert f"dataset /entry/data/data_000001 keeps its raw data in external file(s) {where}" in line


def test_arina_external_link_under_stem_metadata_is_refused(tmp_path, capsys):
    master, other = _arina(tmp_path), _outside(tmp_path)
    with h5py.File(master, "a") as fh:
        del fh["STEM Metadata"]
        fh["STEM Metadata"] = h5py.ExternalLink(str(other), "/m")
    line = _refused(capsys, master, tmp_path / "out")
    assert f"/STEM Metadata is an external link to {other}:/m" in line


def test_arina_data_file_followed_by_namsa_not_by_hdf5_search_path(tmp_path, monkeypatch):
    """HDF5 would also look for a linked data file in the working directory; namsa opens the one
    beside the master (checked), so a same-named file in the working directory is never read."""
    from stage.microscope import read_scan

    master = _arina(tmp_path)
    (tmp_path / "cwd").mkdir()
    decoy = tmp_path / "cwd" / "scan_data_000001.h5"
    with h5py.File(decoy, "w") as fh:
        fh.create_dataset("entry/data/data", data=np.zeros((36, 16, 16), np.uint16))
    monkeypatch.chdir(tmp_path / "cwd")
    np.testing.assert_array_equal(read_scan(master).data[:, :], _frames().reshape(6, 6, 16, 16))


@pytest.mark.parametrize("target", ["outside", "beside"])
def test_arina_data_file_that_is_a_symlink_is_refused(tmp_path, capsys, target):
    master = _arina(tmp_path)
    data = tmp_path / "scan" / "scan_data_000001.h5"
    real = tmp_path / ("elsewhere" if target == "outside" else "scan") / "real_data.h5"
    real.parent.mkdir(exist_ok=True)
    data.rename(real)
    data.symlink_to(real)
    line = _refused(capsys, master, tmp_path / "out")
    assert f"its companion file {data} is a symbolic link" in line


# -- D2: symbolic links as the input and as its companion files -------------------------------


def test_input_symlink_leaving_its_folder_is_refused_and_one_beside_it_is_read(tmp_path, capsys):
    from stage.microscope import read_scan

    (tmp_path / "elsewhere").mkdir()
    real = write_hspy(tmp_path / "elsewhere" / "real.hspy", disc_scan())
    (tmp_path / "scan").mkdir()
    link = tmp_path / "scan" / "scan.hspy"
    link.symlink_to(real)
    line = _refused(capsys, link, tmp_path / "out")
    assert f"{link} is a symbolic link to {real}, outside its own folder" in line
    beside = tmp_path / "elsewhere" / "alias.hspy"
    beside.symlink_to("real.hspy")
    assert read_scan(beside).data.shape == (8, 8, 32, 32)


def test_mib_header_symlinked_elsewhere_is_refused_before_it_is_parsed(tmp_path, capsys):
    from test_reconstruct_cli import _write_mib

    (tmp_path / "scan").mkdir()
    cbed = np.broadcast_to(disc_pattern(16, 3.0), (36, 16, 16))
    meta = SampleMeta(scan_shape=(6, 6), fov_A=(0, 0, 2.25, 2.25), pattern_dk_inv_A=0.17)
    mib, _ = _write_mib(tmp_path / "scan", type("S", (), {"meta": meta, "cbed": cbed})())
    (tmp_path / "elsewhere").mkdir()
    outside = tmp_path / "elsewhere" / "secret.hdr"
    mib.with_suffix(".hdr").rename(outside)
    mib.with_suffix(".hdr").symlink_to(outside)
    line = _refused(capsys, mib, tmp_path / "out")
    assert f"its companion file {mib.with_suffix('.hdr')} is a symbolic link (to {outside})" in line


def test_empad_raw_symlink_inside_the_folder_is_refused(tmp_path, capsys):
    from test_reconstruct_cli import _write_empad

    cbed = np.broadcast_to(disc_pattern(16, 3.0), (36, 16, 16))
    meta = SampleMeta(scan_shape=(6, 6), fov_A=(0, 0, 2.25, 2.25), pattern_dk_inv_A=0.17)
    header = _write_empad(tmp_path, type("S", (), {"meta": meta, "cbed": cbed})())
    raw = next(tmp_path.glob("*.raw"))
    raw.rename(tmp_path / "real.raw")
    raw.symlink_to(tmp_path / "real.raw")
    line = _refused(capsys, header, tmp_path / "out")
    assert f"its companion file {raw} is a symbolic link" in line


def test_tia_ser_companion_symlink_is_refused_before_the_emi_is_read(tmp_path, capsys):
    """A TIA .emi's reader opens every ``<name>_N.ser`` beside it: one that is a link is refused
    before the .emi itself is parsed (its bytes here are not even a TIA file)."""
    emi = tmp_path / "scan.emi"
    emi.write_bytes(b"not parsed: refused before")
    (tmp_path / "scan_1.ser").symlink_to("/etc/passwd")
    line = _refused(capsys, emi, tmp_path / "out")
    assert f"its companion file {tmp_path / 'scan_1.ser'} is a symbolic link (to /etc/passwd)" in line
