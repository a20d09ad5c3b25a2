"""`namsa reconstruct` with the files and tools around it: a detector's own formats (EMPAD, Merlin MIB)
and a scan HyperSpy itself saved as input; maps HyperSpy and py4DSTEM open with their pixel size, and
a py4DSTEM DataCube in memory (the .hspy and EMD round trips and the command line: test_reconstruct_cli.py).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture of tiny_model)
from test_reconstruct_cli import (_calibration_flags, _rel_l2, _run, _write, _write_empad, _write_mib,  # noqa: F401
                                  sample, tiny_model)  # sample, tiny_model: fixtures

pytest.importorskip("rsciio")
pytest.importorskip("tifffile")  # the maps are written as TIFF too


def test_empad_file_round_trip(sample, tiny_model, tmp_path):
    """EMPAD: scan step and detector pixel from the XML, beam energy and angle from the flags; the
    128 px detector is cropped around k = 0 to the model's pattern exactly."""
    model_dir, rec = tiny_model
    meta = sample.meta
    path = _write_empad(tmp_path, sample)
    assert _run("reconstruct", path, "--model", model_dir, "--out", tmp_path / "out", "--energy-kv", meta.energy_kv,
                "--semiangle-mrad", meta.semiangle_mrad) == 0
    expected = rec.predict(sample.cbed)[0]
    np.testing.assert_allclose(np.load(tmp_path / "out" / "potential.npy"), expected, rtol=1e-6,
                               atol=1e-6 * float(np.abs(expected).max()))
    info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
    assert info["calibrations"]["step_A"]["source"] == "file metadata"
    assert info["calibrations"]["dk_inv_A"]["source"] == "file metadata"
    np.testing.assert_allclose(info["calibrations"]["step_A"]["value"],
                               [meta.fov_A[2] / meta.scan_shape[0], meta.fov_A[3] / meta.scan_shape[1]],
                               rtol=1e-6)
    assert info["resampling"][0].startswith("detector ky: centred crop 128 -> 16 px")


def test_mib_file_round_trip(sample, tiny_model, tmp_path):
    """MIB (integer counts, no calibrations: all from the flags): the counts are brought to a mean
    total intensity of 1 and give the prediction on the equally normalised simulated stack."""
    model_dir, rec = tiny_model
    path, counts = _write_mib(tmp_path, sample)
    assert _run("reconstruct", path, "--model", model_dir, "--out", tmp_path / "out", *_calibration_flags(sample)) == 0
    normalised = counts.astype(np.float64) / counts.sum(axis=(1, 2)).mean()
    expected = rec.predict(normalised.astype(np.float32))[0]
    got = np.load(tmp_path / "out" / "potential.npy")
    assert _rel_l2(got, expected) < 1e-5
    assert _rel_l2(got, rec.predict(sample.cbed)[0]) < 0.05
    info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
    assert any(note.startswith("patterns divided by their mean total") for note in info["resampling"])
    assert {c["source"] for c in info["calibrations"].values()} == {"command line"}


def test_file_saved_by_hyperspy_round_trips(sample, tiny_model, tmp_path):
    """HyperSpy (optional, not a dependency) as a microscopist would save a calibrated scan."""
    hs = pytest.importorskip("hyperspy.api")
    model_dir, rec = tiny_model
    meta = sample.meta
    sy, sx = meta.scan_shape
    signal = hs.signals.Signal2D(sample.cbed.reshape(sy, sx, *sample.cbed.shape[1:]))
    nav_x, nav_y = signal.axes_manager.navigation_axes  # HyperSpy lists axes x first
    for axis, scale, unit in ((nav_y, meta.fov_A[2] / sy, "Å"), (nav_x, meta.fov_A[3] / sx, "Å"),
                              *((a, meta.pattern_dk_inv_A, "1/Å") for a in signal.axes_manager.signal_axes)):
        axis.scale, axis.units = scale, unit
    signal.metadata.set_item("Acquisition_instrument.TEM.beam_energy", meta.energy_kv)
    signal.metadata.set_item("Acquisition_instrument.TEM.convergence_angle", meta.semiangle_mrad)
    signal.save(tmp_path / "scan.hspy")
    assert _run("reconstruct", tmp_path / "scan.hspy", "--model", model_dir, "--out", tmp_path / "out") == 0
    expected = rec.predict(sample.cbed)[0]
    np.testing.assert_allclose(np.load(tmp_path / "out" / "potential.npy"), expected, rtol=1e-6,
                               atol=1e-6 * float(np.abs(expected).max()))


def _reconstructed_hspy(sample: Any, tiny_model: Any, tmp_path: Path) -> Any:
    """`namsa reconstruct` of the sample written as .hspy into tmp_path/out; returns the reconstructor."""
    model_dir, rec = tiny_model
    assert _run("reconstruct", _write(tmp_path / "scan.hspy", sample), "--model", model_dir, "--out",
                tmp_path / "out") == 0
    return rec


def test_calibrated_hspy_output_opens_in_hyperspy(sample, tiny_model, tmp_path):
    hs = pytest.importorskip("hyperspy.api")
    rec = _reconstructed_hspy(sample, tiny_model, tmp_path)
    signal = hs.load(str(tmp_path / "out" / "reconstruction.hspy"))
    names = signal.metadata.Signal.map_names
    assert names[0] == rec.targets[0] and names[-1] == "icom_potential"
    np.testing.assert_array_equal(signal.data[0], np.load(tmp_path / "out" / f"{names[0]}.npy"))
    info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
    y, x = signal.axes_manager.signal_axes[1], signal.axes_manager.signal_axes[0]
    assert (y.units, x.units) == ("Å", "Å")
    np.testing.assert_allclose([y.scale, x.scale], info["pixel_size_A"], rtol=1e-9)


def test_the_maps_open_in_py4dstem_with_their_pixel_size(sample, tiny_model, tmp_path):
    py4dstem = pytest.importorskip("py4DSTEM")
    rec = _reconstructed_hspy(sample, tiny_model, tmp_path)
    image = py4dstem.read(str(tmp_path / "out" / "reconstruction_py4dstem.h5"))
    info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
    np.testing.assert_array_equal(image.data[..., 0], np.load(tmp_path / "out" / f"{rec.targets[0]}.npy"))
    assert list(image.slicelabels[:2]) == [rec.targets[0], "icom_potential"] or rec.targets[0] in image.slicelabels
    assert image.calibration.get_R_pixel_units() == "A"
    assert image.calibration.get_R_pixel_size() == pytest.approx(info["pixel_size_A"][0], rel=1e-9)
    assert info["py4dstem_file"].startswith("reconstruction_py4dstem.h5: py4DSTEM RealSlice")


def test_py4dstem_datacube_in_memory_gives_the_file_s_maps(sample, tiny_model, tmp_path):
    py4dstem = pytest.importorskip("py4DSTEM")
    from workflow.reconstruct import reconstruct

    model_dir, rec = tiny_model
    meta = sample.meta
    sy, sx = meta.scan_shape
    cube = py4dstem.DataCube(sample.cbed.reshape(sy, sx, *sample.cbed.shape[1:]))
    cube.calibration.set_R_pixel_size(meta.fov_A[2] / sy)
    cube.calibration.set_R_pixel_units("A")
    cube.calibration.set_Q_pixel_size(meta.pattern_dk_inv_A)
    cube.calibration.set_Q_pixel_units("A^-1")
    cube.calibration.set_convergence_semiangle_mrad(meta.semiangle_mrad)
    if meta.fov_A[2] / sy != meta.fov_A[3] / sx:  # py4DSTEM keeps one R pixel size
        given = {"energy_kv": meta.energy_kv, "step_A": (meta.fov_A[2] / sy, meta.fov_A[3] / sx)}
    else:
        given = {"energy_kv": meta.energy_kv}
    summary = reconstruct(cube, model_dir, tmp_path / "out", calibrations=given)
    got = np.load(summary["files"]["potential.npy"])
    expected = rec.predict(sample.cbed)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6 * float(np.abs(expected).max()))
