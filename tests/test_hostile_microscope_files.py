"""Microscope files and model directories a user received, fed to `namsa reconstruct` (issue 18).

Each case is a real file (HDF5 through h5py and rosettasciio, EMPAD and Merlin written byte by
byte) or a real trained model with a doctored card, run through `workflow.cli.main`: a file that
reaches outside itself, is incomplete or holds NaN/inf is refused with exit 2 and one line before
any map is written; nothing is ever written outside ``--out``. The two-process cases (kill -9
mid-write, a file-size limit) run the installed `namsa` console script.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)

h5py = pytest.importorskip("h5py")
pytest.importorskip("rsciio")
from test_reconstruct_cli import (_calibration_flags, _run, _write, _write_empad,  # noqa: E402, F401
                                  _write_mib, sample, tiny_model)  # sample, tiny_model: shared fixtures

NAMSA = Path(sys.executable).parent / "namsa"


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("namsa: error: ")
    return err[0]


def _tree(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (relative path -> bytes), hidden siblings included, except the
    empty ``.<out>.lock`` files of workflow.outlock, which every writing command leaves beside its --out."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not (p.name.startswith(".") and p.name.endswith(".lock"))}


def _tree_names(root: Path) -> list[str]:
    """The names directly in ``root``, less the ``.<out>.lock`` files of workflow.outlock."""
    return [p.name for p in root.iterdir() if not (p.name.startswith(".") and p.name.endswith(".lock"))]


def _refused(capsys, tmp_path: Path, path: Path, model: Any, *flags: Any) -> str:
    """Run reconstruct on ``path`` into tmp/out: exit 2, one line, and not one file written."""
    before = _tree(tmp_path)
    assert _run("reconstruct", path, "--model", model, "--out", tmp_path / "out", *flags) == 2
    line = _one_error_line(capsys)
    assert _tree(tmp_path) == before
    assert not (tmp_path / "out").exists()
    return line


# -- output names come from a fixed set -------------------------------------------------------


def _doctored_model(tmp_path: Path, model_dir: Path, target: str) -> Path:
    """A copy of a real trained model whose card names its output ``target`` (the weights untouched)."""
    copy = tmp_path / "doctored-model"
    shutil.copytree(model_dir, copy)
    card_path = copy / "model_card.json"
    card = json.loads(card_path.read_text())
    old = card["targets"][0]
    card["targets"][0] = target
    card["normalizer"]["targets"][target] = card["normalizer"]["targets"].pop(old)
    card_path.write_text(json.dumps(card))
    return copy


@pytest.mark.parametrize("target", ["../../escaped", "ABSOLUTE", "sub/escaped", "escaped"])
def test_a_card_target_never_becomes_a_path(sample, tiny_model, tmp_path, capsys, target):
    """`targets` of a model card name the map files: only potential / density are accepted."""
    target = str(tmp_path / "abs" / "escaped") if target == "ABSOLUTE" else target
    work = tmp_path / "work" / "deep"
    work.mkdir(parents=True)
    model = _doctored_model(tmp_path, Path(tiny_model[0]), target)
    scan = _write(tmp_path / "scan.hspy", sample)
    before = _tree(tmp_path)
    assert _run("reconstruct", scan, "--model", model, "--out", work / "out") == 2
    line = _one_error_line(capsys)
    assert "targets" in line and ("escaped" in line or "got '/" in line), line  # long paths are shortened
    assert _tree(tmp_path) == before and not (work / "out").exists()


def test_write_maps_refuses_names_that_are_not_plain_map_names(tmp_path):
    from stage.microscope import ExperimentalInputError
    from workflow.reconstruct_maps import write_maps

    image = np.ones((4, 4), dtype=np.float32)
    for name in ("../x", "/tmp/x", "potential/../../x", "x"):
        with pytest.raises(ExperimentalInputError, match="not one of the maps"):
            write_maps(tmp_path / "out", {"potential": image, name: image}, (1.0, 1.0), {})
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


# -- HDF5 files open only themselves ----------------------------------------------------------


def _outside_data(tmp_path: Path, sample: Any) -> Path:
    """Another HDF5 file, outside the scan's, holding data of the scan's shape under /data."""
    sy, sx = sample.meta.scan_shape
    path = tmp_path / "elsewhere" / "other.h5"
    path.parent.mkdir()
    with h5py.File(path, "w") as fh:
        fh["data"] = sample.cbed.reshape(sy, sx, *sample.cbed.shape[1:])
    return path


def _data_name(fh: "h5py.File") -> str:
    names: list[str] = []
    fh.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) and obj.ndim == 4 else None)
    return "/" + names[0]


def test_hdf5_external_link_is_refused(sample, tiny_model, tmp_path, capsys):
    scan = _write(tmp_path / "scan.hspy", sample)
    other = _outside_data(tmp_path, sample)
    with h5py.File(scan, "a") as fh:
        fh["Experiments/outside"] = h5py.ExternalLink(str(other), "/data")
    line = _refused(capsys, tmp_path, scan, tiny_model[0])
    assert "/Experiments/outside is an external link to" in line and str(other) in line


def test_hdf5_virtual_dataset_is_refused(sample, tiny_model, tmp_path, capsys):
    """The scan's own data replaced by a virtual dataset that maps another file's data."""
    scan = _write(tmp_path / "scan.hspy", sample)
    other = _outside_data(tmp_path, sample)
    with h5py.File(scan, "a") as fh:
        name = _data_name(fh)
        shape, dtype = fh[name].shape, fh[name].dtype
        layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
        layout[...] = h5py.VirtualSource(str(other), "data", shape=shape)
        del fh[name]
        fh.create_virtual_dataset(name, layout)
    line = _refused(capsys, tmp_path, scan, tiny_model[0])
    assert f"dataset {name} is virtual" in line and str(other) in line


def test_hdf5_external_raw_storage_is_refused(sample, tiny_model, tmp_path, capsys):
    """A dataset whose bytes live in /etc/passwd (the case of the issue) and one beside the file."""
    scan = _write(tmp_path / "scan.hspy", sample)
    with h5py.File(scan, "a") as fh:
        name = _data_name(fh)
        attrs = dict(fh[name].attrs)
        del fh[name]
        size = os.path.getsize("/etc/passwd")
        fh.create_dataset(name, shape=(1, 1, 1, size), dtype="u1", external=[("/etc/passwd", 0, size)])
        fh[name].attrs.update(attrs)
    line = _refused(capsys, tmp_path, scan, tiny_model[0])
    assert f"dataset {name} keeps its raw data in external file(s) /etc/passwd" in line


def test_hdf5_soft_link_inside_the_file_is_fine(sample, tiny_model, tmp_path):
    scan = _write(tmp_path / "scan.hspy", sample)
    with h5py.File(scan, "a") as fh:
        fh["shortcut"] = h5py.SoftLink(_data_name(fh))
        fh["Experiments/self"] = fh["Experiments"]  # a hard-link cycle: walked once
    assert _run("reconstruct", scan, "--model", tiny_model[0], "--out", tmp_path / "out") == 0
    assert (tmp_path / "out" / "potential.npy").is_file()


# -- EMPAD raw files only beside the header ---------------------------------------------------


def _empad_flags(sample: Any) -> list[Any]:
    return ["--energy-kv", sample.meta.energy_kv, "--semiangle-mrad", sample.meta.semiangle_mrad]


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink-out"])
def test_empad_raw_file_outside_the_header_folder_is_refused(sample, tiny_model, tmp_path, capsys, where):
    """The raw file moved out of the header's folder, and the header naming it there."""
    scan = tmp_path / "scan"
    scan.mkdir()
    header = _write_empad(scan, sample)
    raw = next(scan.glob("*.raw"))
    outside = tmp_path / "secret.raw"
    raw.rename(outside)
    name = {"parent": "../secret.raw", "absolute": str(outside), "symlink-out": "linked.raw"}[where]
    if where == "symlink-out":
        (scan / name).symlink_to(outside)
    header.write_text(header.read_text().replace(f'filename="{raw.name}"', f'filename="{name}"'))
    line = _refused(capsys, tmp_path, header, tiny_model[0], *_empad_flags(sample))
    assert ("is a symbolic link" in line) if where == "symlink-out" else ("not a plain file name" in line)


def test_empad_short_raw_file_names_the_expected_size(sample, tiny_model, tmp_path, capsys):
    header = _write_empad(tmp_path, sample)
    raw = next(tmp_path.glob("*.raw"))
    full = raw.stat().st_size
    with open(raw, "r+b") as fh:
        fh.truncate(full - 1000)
    line = _refused(capsys, tmp_path, header, tiny_model[0], *_empad_flags(sample))
    assert f"is truncated: expected {full} bytes" in line and f"found {full - 1000}" in line


# -- Merlin .mib: whole frames, as many as announced ------------------------------------------


@pytest.mark.parametrize("cut", ["mid-frame", "whole-frames-missing", "mid-frame-no-hdr"])
def test_truncated_or_short_mib_names_expected_and_actual_size(sample, tiny_model, tmp_path, capsys, cut):
    path, _ = _write_mib(tmp_path, sample)
    full = path.stat().st_size
    frames = int(np.prod(sample.meta.scan_shape))
    frame = full // frames
    keep = {"mid-frame": full - frame // 2, "whole-frames-missing": full - 3 * frame,
            "mid-frame-no-hdr": full - frame // 2}[cut]
    with open(path, "r+b") as fh:
        fh.truncate(keep)
    if cut == "mid-frame-no-hdr":
        path.with_suffix(".hdr").unlink()
    line = _refused(capsys, tmp_path, path, tiny_model[0], *_calibration_flags(sample))
    assert "is truncated" in line and str(keep) in line
    if cut != "mid-frame-no-hdr":
        assert f"expected {full} bytes ({frames} frames of {frame} bytes as scan.hdr says)" in line


# -- NaN / inf pixels -------------------------------------------------------------------------


def test_nan_and_inf_pixels_are_counted_and_located(sample, tiny_model, tmp_path, capsys):
    sy, sx = sample.meta.scan_shape
    data = sample.cbed.reshape(sy, sx, *sample.cbed.shape[1:]).copy()
    data[2, 5, 3, 4] = np.nan
    data[6, 1, 0, 0] = np.inf
    data[7, 7, 1, 1] = -np.inf
    scan = _write(tmp_path / "nan.hspy", sample, data=data)
    line = _refused(capsys, tmp_path, scan, tiny_model[0])
    assert "3 pixel value(s) are not finite (1 NaN, 2 +-inf), the first at scan position (y=2, x=5), " \
           "detector pixel (ky=3, kx=4); replace them" in line


# -- whole-directory replacement, kills and full disks (two processes) ------------------------


def _earlier_result(sample: Any, model: Any, out: Path) -> dict[str, bytes]:
    """A finished earlier reconstruction in ``out`` plus one more map file (density.npy) that the
    next run does not write: it shows whether ``out`` was replaced as a whole."""
    assert _run("reconstruct", _write(out.parent / "earlier.hspy", sample), "--model", model, "--out", out) == 0
    np.save(out / "density.npy", np.zeros((2, 2), np.float32))
    return _tree(out)


def _other_scan(sample: Any, tmp_path: Path) -> Path:
    """The same scan with 1% noise: maps that differ from the earlier result."""
    sy, sx = sample.meta.scan_shape
    rng = np.random.default_rng(0)
    data = sample.cbed.reshape(sy, sx, *sample.cbed.shape[1:]) * (1 + 0.01 * rng.random((sy, sx, 1, 1)))
    return _write(tmp_path / "later.hspy", sample, data=data.astype(np.float32))


def test_kill_mid_write_leaves_the_earlier_result_and_a_rerun_replaces_it(sample, tiny_model, tmp_path, capsys):
    out = tmp_path / "out"
    earlier = _earlier_result(sample, tiny_model[0], out)
    later = _other_scan(sample, tmp_path)
    argv = [str(NAMSA), "reconstruct", str(later), "--model", str(tiny_model[0]), "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = tmp_path / f".out.tmp-{proc.pid}"
    deadline = time.monotonic() + 300
    while not (tmp / "potential.npy").exists():  # killed once the first map file is being written
        assert proc.poll() is None, "reconstruct finished before it could be killed mid-write"
        assert time.monotonic() < deadline
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _tree(out) == earlier
    assert _run("reconstruct", later, "--model", tiny_model[0], "--out", out) == 0
    now = _tree(out)
    assert "density.npy" not in now and now["potential.npy"] != earlier["potential.npy"]
    assert set(now) == {"potential.npy", "potential.tif", "icom_potential.npy", "icom_potential.tif",
                        "reconstruction.png", "reconstruction.json", "reconstruction.hspy",
                        "reconstruction_py4dstem.h5"}
    assert sorted(_tree_names(tmp_path)) == ["earlier.hspy", "later.hspy", "out"]  # leftovers gone


def _limit_file_size() -> None:
    """Child process: files may grow to 300 bytes at most, and a larger write fails with EFBIG
    (SIGXFSZ ignored) — a disk that fills up while the maps are written."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300))


def test_full_disk_while_writing_is_one_line_and_keeps_the_earlier_result(sample, tiny_model, tmp_path, capsys):
    out = tmp_path / "out"
    earlier = _earlier_result(sample, tiny_model[0], out)
    later = _other_scan(sample, tmp_path)
    done = subprocess.run([str(NAMSA), "reconstruct", str(later), "--model", str(tiny_model[0]), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, preexec_fn=_limit_file_size)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr   # the environment failed, not the input
    assert lines[0].startswith(f"namsa: error: writing the maps into --out {out} failed (File too large)")
    assert _tree(out) == earlier
    assert sorted(_tree_names(tmp_path)) == ["earlier.hspy", "later.hspy", "out"]


def test_an_out_holding_other_files_is_refused_not_replaced(sample, tiny_model, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work\n")
    line = _refused_keeping(capsys, tmp_path, sample, tiny_model[0], out)
    assert "holds files this command did not write (e.g. 'thesis.tex')" in line


def _refused_keeping(capsys, tmp_path: Path, sample: Any, model: Any, out: Path) -> str:
    scan = _write(tmp_path / "scan.hspy", sample)
    before = _tree(tmp_path)
    assert _run("reconstruct", scan, "--model", model, "--out", out) == 2
    assert _tree(tmp_path) == before
    return _one_error_line(capsys)


def test_an_aside_result_of_a_kill_between_the_renames_is_put_back(tmp_path):
    """The fallback swap (no renameat2) renames the old result aside first: killed right then,
    ``out`` is missing and the next run restores the aside copy before anything else."""
    from workflow.replace_out import discard, start_replacing

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    aside = tmp_path / f".out.old-{dead}"
    aside.mkdir()
    (aside / "reconstruction.json").write_text("{}")
    (tmp_path / f".out.tmp-{dead}").mkdir()
    tmp = start_replacing(tmp_path / "out", lambda name: True)
    assert (tmp_path / "out" / "reconstruction.json").read_text() == "{}"
    discard(tmp)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
