"""Every 4D-STEM format `namsa reconstruct` reads, on files each library writes, read lazily.

Files are written by the library that owns the format (rosettasciio's hspy / zspy / blockfile
writers, h5py for an EMD (NCEM) file, byte by byte from the published layouts for MIB and EMPAD);
the two real files of issue 21 (a NanoMegas blockfile and an FEI TIA .ser/.emi) are fetched at test
time from Debian's python3-hyperspy (GPL test data: never committed), skipped when apt cannot.
Each file is opened without being read (`RawScan.data` is a `LazyScan`), and a slice reads the
same numbers as the array written.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("rsciio")

from namsa.sample_meta import SampleMeta  # noqa: E402
from stage.microscope import LazyScan, MicroscopeFileError, read_scan  # noqa: E402
from microscope_helpers import write_arina  # noqa: E402
from test_reconstruct_cli import _signal, _write_empad, _write_mib  # noqa: E402

SCAN, P = (6, 5), 16


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    """(6, 5, 16, 16) float32 patterns, each different (a slice mix-up shows)."""
    rng = np.random.default_rng(21)
    return rng.random((*SCAN, P, P), dtype=np.float32) + np.arange(30, dtype=np.float32).reshape(*SCAN, 1, 1)


def _check_lazy(scan, data: np.ndarray) -> None:
    """Lazy: shape and dtype without reading; slices and strided subsamples read as numpy arrays."""
    assert isinstance(scan.data, LazyScan) and scan.data.shape == data.shape
    block = scan.data[1:4, 2:5]
    assert isinstance(block, np.ndarray)
    np.testing.assert_allclose(block, data[1:4, 2:5], rtol=1e-6)
    np.testing.assert_allclose(scan.data[::4, ::4], data[::4, ::4], rtol=1e-6)


def test_hspy_is_read_lazily_with_signed_scales(data, tmp_path):
    from rsciio.hspy import file_writer

    signal = _signal(data, (-0.5, 0.4), 0.2, {"beam_energy": 200.0, "convergence_angle": 20.0})
    file_writer(str(tmp_path / "scan.hspy"), signal)
    scan = read_scan(tmp_path / "scan.hspy")
    _check_lazy(scan, data)
    assert scan.found["step_A"] == (-0.5, 0.4)  # a flipped axis is kept, not "no scan step"
    assert scan.found["energy_kv"] == 200.0 and scan.found["dk_inv_A"] == (0.2, 0.2)


def test_zspy_folder_is_read_and_a_link_inside_is_refused(tmp_path):
    """A .zspy folder rosettasciio's writer made (tests/data/make_zspy_fixture.py, in a zarr-2
    environment: rsciio's zspy needs zarr < 3, abTEM here needs zarr >= 3.1), read with zarr 3 by
    stage.microscope.formats.zspy: lazily, with its metadata and its flipped (negative) y scale."""
    fixture = Path(__file__).resolve().parent / "data"
    folder = tmp_path / "scan.zspy"
    shutil.copytree(fixture / "hyperspy-written.zspy", folder)
    data = np.load(fixture / "hyperspy-written.npy")
    scan = read_scan(folder)
    _check_lazy(scan, data)
    assert scan.found["energy_kv"] == 200.0 and scan.found["semiangle_mrad"] == 20.0
    assert scan.found["step_A"] == (-0.5, 0.5) and scan.found["dk_inv_A"] == (0.2, 0.2)
    chunk = next(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    chunk.unlink()
    chunk.symlink_to("/etc/passwd")
    with pytest.raises(MicroscopeFileError, match="symbolic link"):
        read_scan(folder)


def test_emd_ncem_written_with_h5py(data, tmp_path):
    """An EMD 0.2 (Berkeley / NCEM) file as h5py writes it: /data/<name>/data with dim1..dim4, the
    array stored with its axes reversed (kx, ky, x, y: the layout rsciio's own EMD writer uses)."""
    import h5py

    path = tmp_path / "scan.emd"
    with h5py.File(path, "w") as f:
        f.attrs.update({"version_major": 0, "version_minor": 2})
        group = f.create_group("data/scan")
        group.attrs["emd_group_type"] = 1
        group.create_dataset("data", data=data.transpose(3, 2, 1, 0), chunks=(P, P, 1, 1))
        for i, (name, unit, step) in enumerate((("kx", "1/nm", 2.0), ("ky", "1/nm", 2.0), ("x", "nm", 0.04),
                                                ("y", "nm", 0.05))):
            dim = group.create_dataset(f"dim{i + 1}", data=np.arange(data.shape[3 - i]) * step)
            dim.attrs.update({"name": name, "units": unit})
        f.create_group("microscope").attrs.update({"beam_energy": 300.0, "convergence_angle": 25.0})
    scan = read_scan(path)
    _check_lazy(scan, data)
    np.testing.assert_allclose(scan.found["step_A"], (0.5, 0.4))
    np.testing.assert_allclose(scan.found["dk_inv_A"], (0.2, 0.2))
    assert scan.found["energy_kv"] == 300.0 and scan.found["semiangle_mrad"] == 25.0


def test_blockfile_written_by_rsciio_carries_its_beam_energy(data, tmp_path):
    from rsciio.blockfile import file_writer

    counts = np.rint(data / data.max() * 255).astype(np.uint8)
    signal = _signal(counts, (0.5, 0.5), None, {})
    signal["axes"][0]["units"] = signal["axes"][1]["units"] = "nm"
    # the writer copies a blockfile header it is given, as after reading a blockfile (energy in V)
    signal["original_metadata"] = {"blockfile_header": {"Beam_energy": 200000, "Note": ""}}
    file_writer(str(tmp_path / "scan.blo"), signal)
    scan = read_scan(tmp_path / "scan.blo")
    _check_lazy(scan, counts)
    assert scan.found["energy_kv"] == 200.0  # the header's Beam_energy (V), through rsciio's mapping


def test_mib_with_header_and_empad_raw(data, tmp_path):
    meta = SampleMeta(scan_shape=tuple(SCAN), fov_A=(0, 0, 3.0, 2.0), pattern_dk_inv_A=0.2)
    sample = SimpleNamespace(meta=meta, cbed=data.reshape(-1, P, P))
    (tmp_path / "mib").mkdir()
    mib, counts = _write_mib(tmp_path / "mib", sample)
    _check_lazy(read_scan(mib), counts.reshape(*SCAN, P, P).astype(np.float32))
    (tmp_path / "empad").mkdir()
    scan = read_scan(_write_empad(tmp_path / "empad", sample))
    assert scan.data.shape == (*SCAN, 128, 128)
    np.testing.assert_allclose(scan.data[2:4, 1:3, 56:72, 56:72], data[2:4, 1:3], rtol=1e-6)
    np.testing.assert_allclose(scan.found["step_A"], (0.5, 0.4))


def test_non_finite_values_are_refused_in_the_block_read(data, tmp_path):
    from rsciio.hspy import file_writer

    bad = data.copy()
    bad[5, 4, 3, 3] = np.nan
    file_writer(str(tmp_path / "scan.hspy"), _signal(bad, (0.5, 0.5), 0.2, {}))
    scan = read_scan(tmp_path / "scan.hspy")  # opening reads nothing: no refusal yet
    scan.data[:2]
    with pytest.raises(MicroscopeFileError, match=r"not finite .* the first at scan position \(y=5, x=4\)"):
        scan.data[4:6, 2:]


@pytest.fixture(scope="module")
def debian_files(tmp_path_factory) -> Path:
    """The hyperspy test files of Debian's python3-hyperspy, unpacked (GPL: fetched, never committed)."""
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        pytest.skip("apt-get / dpkg-deb are not available: the real files of issue 21 cannot be fetched")
    where = tmp_path_factory.mktemp("deb")
    got = subprocess.run(["apt-get", "download", "python3-hyperspy"], cwd=where, capture_output=True, text=True,
                         timeout=300)
    debs = list(where.glob("python3-hyperspy_*.deb"))
    if got.returncode or not debs:
        pytest.skip(f"apt-get download python3-hyperspy failed: {(got.stderr or got.stdout).strip()[-200:]}")
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(where / "x")], check=True, timeout=300)
    found = list((where / "x").rglob("hyperspy/tests/io"))
    if not found:
        pytest.skip("the python3-hyperspy package holds no tests/io folder in this release")
    return found[0]


def test_real_nanomegas_blockfile(debian_files):
    scan = read_scan(debian_files / "blockfile_data" / "test1.blo")
    assert scan.data.shape == (3, 2, 144, 144)
    assert scan.found["energy_kv"] == 200.0  # in the file, reported missing before issue 21
    assert scan.data[1:2, :].shape == (1, 2, 144, 144)


def test_real_nanomegas_precession_patterns_are_refused_as_spots_in_the_first_run(debian_files):
    """test1.blo is precession electron diffraction (a saturated direct beam fading over ~9 px, Bragg
    spots): issue 31 found it passed the CBED check; it is refused as a spot pattern before any
    calibration is asked for (no detector pixel or semi-angle is in the file)."""
    from stage.microscope import ExperimentalInputError, check_before_inference

    scan = read_scan(debian_files / "blockfile_data" / "test1.blo")
    with pytest.raises(ExperimentalInputError, match="do not look like CBED .the direct beam has no edge"):
        check_before_inference(scan, {})


def test_real_tia_ser_and_emi(debian_files):
    emi = read_scan(debian_files / "FEI_new" / "16x16-diffraction_imagel_5x5x256x256_EDS.emi")
    assert emi.data.shape == (5, 5, 256, 256)
    assert emi.found["energy_kv"] == 200.0  # ObjectInfo's "High tension_kV" in the .emi
    step_y, step_x = emi.found["step_A"]
    assert step_y < 0 < step_x  # TIA's y axis: a flipped axis, not "no scan step"
    ser = read_scan(debian_files / "FEI_new" / "16x16-diffraction_imagel_5x5x256x256_EDS_2.ser")
    np.testing.assert_array_equal(ser.data[::2, ::2], emi.data[::2, ::2])


def test_arina_master_is_read_frame_by_frame_and_a_link_outside_is_refused(data, tmp_path):
    counts = np.rint(data[:5, :5] * 10).astype(np.uint16)  # a square 5 x 5 scan
    master = write_arina(tmp_path, counts.reshape(25, P, P), per_file=7)  # 4 data files, rows split across them
    scan = read_scan(master)
    _check_lazy(scan, counts)
    np.testing.assert_allclose(scan.found["step_A"], (0.5, 0.5))
    (tmp_path / "other").mkdir()
    bad = write_arina(tmp_path / "other", counts.reshape(25, P, P), per_file=25, link_to="../scan_data_000001.h5")
    with pytest.raises(MicroscopeFileError, match="not a file beside the master"):
        read_scan(bad)
