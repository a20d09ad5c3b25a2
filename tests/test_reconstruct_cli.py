"""`namsa reconstruct FILE --model ... --out DIR`: experimental 4D-STEM files -> maps.

Real namsa simulations are written to .hspy and EMD (NCEM) files through rosettasciio with the
calibrations in their metadata, reconstructed through the CLI, and compared with the model's
prediction on the simulated stack itself. The helpers and fixtures here are shared with the other
reconstruct tests (detector formats, HyperSpy and py4DSTEM: test_reconstruct_other_tools.py).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from _train_helpers import DATA_CFG, one_thread, tiny_train_cfg  # noqa: F401

pytest.importorskip("rsciio")
tifffile = pytest.importorskip("tifffile")


#: a test specimen without a mirror or inversion that would hide a swapped or flipped axis, with
#: different scan steps along y and x (a sample of the tiny training data)
MATERIAL, AXIS = "GaAs-zincblende", (0, 1, 1)


def _signal(data: np.ndarray, step_A: tuple[float, float] | None, dk_inv_A: float | None,
            tem: dict[str, float], microscope: dict[str, float] | None = None) -> dict[str, Any]:
    """An rsciio signal dict of (scan_y, scan_x, ky, kx) data; a None calibration gets no unit."""
    def axis(i: int, name: str, scale: float | None, unit: str) -> dict[str, Any]:
        return {"name": name, "size": data.shape[i], "offset": 0.0, "scale": 1.0 if scale is None else scale,
                "units": "" if scale is None else unit, "navigate": i < 2, "index_in_array": i}

    return {"data": data,
            "axes": [axis(0, "y", step_A and step_A[0], "Å"), axis(1, "x", step_A and step_A[1], "Å"),
                     axis(2, "ky", dk_inv_A, "1/Å"), axis(3, "kx", dk_inv_A, "1/Å")],
            "metadata": {"General": {"title": "scan"}, "Signal": {"signal_type": ""},
                         "Acquisition_instrument": {"TEM": tem}},
            "original_metadata": {"microscope": microscope or {}}, "tmp_parameters": {},
            "attributes": {"_lazy": False}, "learning_results": {}, "models": {},
            "package_info": {"name": "namsa-tests", "version": "0"}}


def _write(path: Path, sample: Any, *, energy_kv: float | None = None, semiangle_mrad: float | None = None,
           step: bool = True, dk: bool = True, data: np.ndarray | None = None) -> Path:
    """Write ``sample``'s scan (or ``data``) with its calibrations: .hspy in HyperSpy's TEM
    metadata, .emd (NCEM) in the microscope attributes; axis scales in Angstrom and 1/Angstrom."""
    meta = sample.meta
    sy, sx = meta.scan_shape
    if data is None:
        data = sample.cbed.reshape(sy, sx, *sample.cbed.shape[1:])
    phys = {"beam_energy": meta.energy_kv if energy_kv is None else energy_kv,
            "convergence_angle": meta.semiangle_mrad if semiangle_mrad is None else semiangle_mrad}
    phys = {k: v for k, v in phys.items() if v > 0}
    step_A = (meta.fov_A[2] / sy, meta.fov_A[3] / sx) if step else None
    dk_inv_A = meta.pattern_dk_inv_A if dk else None
    if path.suffix == ".emd":
        from rsciio.emd import file_writer

        file_writer(str(path), _signal(data, step_A, dk_inv_A, {}, microscope=phys))
    else:
        from rsciio.hspy import file_writer

        file_writer(str(path), _signal(data, step_A, dk_inv_A, phys))
    return path


def _rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _write_empad(folder: Path, sample: Any, detector_px: int = 128) -> Path:
    """An EMPAD scan written byte by byte from the published layout: ``scan_x{X}_y{Y}.raw`` holds
    one frame per probe position (row-major), each (128 + 2) x 128 little-endian float32 with the
    pattern in the top 128 rows (k = 0 at pixel 64) and 2 footer rows; the XML gives the scan size,
    the scan's field of view [y, x] in metres and the detector pixel (``calibrated_pixelsize``,
    read as 1e9 x value 1/nm). Returns the XML path (the file `namsa reconstruct` is given)."""
    meta = sample.meta
    sy, sx = meta.scan_shape
    p = sample.cbed.shape[-1]
    frames = np.zeros((sy * sx, detector_px + 2, detector_px), dtype="<f4")
    lo = detector_px // 2 - p // 2
    frames[:, lo: lo + p, lo: lo + p] = sample.cbed
    raw = f"scan_x{sx}_y{sy}.raw"
    (folder / raw).write_bytes(frames.tobytes())
    fov_m = [meta.fov_A[2] * 1e-10, meta.fov_A[3] * 1e-10]
    xml = (f'<root><timestamp><isoformat>2026-01-01T00:00:00</isoformat></timestamp>'
           f'<pix_x>{sx}</pix_x><pix_y>{sy}</pix_y><raw_file filename="{raw}"/>'
           f'<iom_measurements><optics><get_full_scan_field_of_view>{fov_m!r}</get_full_scan_field_of_view>'
           f'</optics><calibrated_pixelsize>{meta.pattern_dk_inv_A * 10 / 1e9!r}</calibrated_pixelsize>'
           f'</iom_measurements></root>')
    (folder / "scan.xml").write_text(xml)
    return folder / "scan.xml"


def _write_mib(folder: Path, sample: Any, counts_per_max: float = 60000.0) -> tuple[Path, np.ndarray]:
    """A Quantum Detectors Merlin ``.mib`` + ``.hdr`` written byte by byte: per frame a 384-byte
    ASCII header (``MQ1,<frame>,00384,<chips>,<width>,<height>,U16,<geometry>,...,<timestamp>,
    <exposure>ns,...``) then the frame as big-endian uint16 counts, rows stored bottom-up (the
    reader flips them); the ``.hdr`` gives frames per trigger (= scan_x) and in total. Returns
    the path and the (S, P, P) counts as written (top-down)."""
    sy, sx = sample.meta.scan_shape
    p = sample.cbed.shape[-1]
    counts = np.rint(sample.cbed / sample.cbed.max() * counts_per_max).astype(np.uint16)
    chunks = []
    for i, frame in enumerate(counts):
        fields = ["MQ1", f"{i + 1:06d}", "00384", "01", f"{p:05d}", f"{p:05d}", "U16", "   1x1", "01",
                  "2026-01-01T00:00:00.000000000Z", "1000000ns", "0", ""]
        chunks.append(",".join(fields).ljust(384).encode() + frame[::-1].astype(">u2").tobytes())
    (folder / "scan.mib").write_bytes(b"".join(chunks))
    (folder / "scan.hdr").write_text(f"HDR,\t\nFrames in Acquisition (Number):\t{sy * sx}\n"
                                     f"Frames per Trigger (Number):\t{sx}\nEnd\t\n")
    return folder / "scan.mib", counts


def _calibration_flags(sample: Any) -> list[Any]:
    meta = sample.meta
    sy, sx = meta.scan_shape
    return ["--energy-kv", meta.energy_kv, "--semiangle-mrad", meta.semiangle_mrad,
            "--dk-inv-a", repr(meta.pattern_dk_inv_A),
            "--scan-step-a", f"{meta.fov_A[2] / sy!r},{meta.fov_A[3] / sx!r}"]


def _run(*argv: Any) -> int:
    from workflow.cli import main

    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def sample(tiny_sim_config):
    """GaAs [011] with the tiny data's physics (8 x 8 scan, 16 px patterns)."""
    import namsa

    return namsa.simulate_sample(MATERIAL, AXIS, tiny_sim_config)


@pytest.fixture(scope="module")
def tiny_model(tiny_trained_model):  # noqa: F811
    import models

    return tiny_trained_model.model_dir, models.load_reconstructor(tiny_trained_model.model_dir, device="cpu")


@pytest.mark.parametrize("suffix", [".hspy", ".emd"])
def test_file_round_trip_equals_the_prediction_on_the_sample(sample, tiny_model, tmp_path, suffix):
    model_dir, rec = tiny_model
    path = _write(tmp_path / f"scan{suffix}", sample)
    assert _run("reconstruct", path, "--model", model_dir, "--out", tmp_path / "out") == 0
    expected = rec.predict(sample.cbed)[0]
    got = np.load(tmp_path / "out" / "potential.npy")
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6 * float(np.abs(expected).max()))
    np.testing.assert_array_equal(tifffile.imread(tmp_path / "out" / "potential.tif"), got)
    info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
    assert info["maps"]["potential"]["unit"] == "V*Angstrom"
    fov = sample.meta.fov_A
    np.testing.assert_allclose(info["pixel_size_A"], [fov[2] / got.shape[0], fov[3] / got.shape[1]], rtol=1e-9)
    assert {c["source"] for c in info["calibrations"].values()} == {"file metadata"}
    assert info["resampling"] == ["none: the file's sampling is the model's"]
    icom = np.load(tmp_path / "out" / "icom_potential.npy")
    assert icom.shape == got.shape and np.isfinite(icom).all() and icom.std() > 0
    assert (tmp_path / "out" / "reconstruction.png").stat().st_size > 1000


def test_command_line_calibrations_fill_in_and_override_the_file(sample, tiny_model, tmp_path, capsys):
    model_dir, rec = tiny_model
    meta = sample.meta
    path = _write(tmp_path / "bare.hspy", sample, energy_kv=300.0, step=False, dk=False)
    mrad = meta.pattern_mrad_per_px
    assert _run("reconstruct", path, "--model", model_dir, "--out", tmp_path / "out", "--energy-kv", meta.energy_kv,
                "--dk-mrad", mrad, "--scan-step-a",
                f"{meta.fov_A[2] / meta.scan_shape[0]!r},{meta.fov_A[3] / meta.scan_shape[1]!r}") == 0
    np.testing.assert_allclose(np.load(tmp_path / "out" / "potential.npy"), rec.predict(sample.cbed)[0],
                               rtol=1e-5, atol=1e-5 * float(np.abs(rec.predict(sample.cbed)).max()))
    info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
    sources = {name: c["source"] for name, c in info["calibrations"].items()}
    assert sources["energy_kv"] == "command line" and sources["semiangle_mrad"] == "file metadata"
    assert sources["dk_inv_A"].startswith("command line (mrad") and sources["step_A"] == "command line"


def test_twice_the_scan_points_is_subsampled_to_the_model_step(sample, tiny_model, tiny_sim_config, tmp_path):
    import namsa

    model_dir, rec = tiny_model
    fine = namsa.simulate_sample(MATERIAL, AXIS, tiny_sim_config.model_copy(update={"scan_shape": (16, 16)}))
    path = _write(tmp_path / "fine-scan.hspy", fine)
    assert _run("reconstruct", path, "--model", model_dir, "--out", tmp_path / "out") == 0
    info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
    assert any("one position in 2 " in note for note in info["resampling"])
    got = np.load(tmp_path / "out" / "potential.npy")
    assert got.shape == sample.potential.shape
    assert _rel_l2(got, rec.predict(sample.cbed)[0]) < 1e-3


def test_finer_detector_is_rebinned_close_to_the_model_sampling(sample, tiny_model, tiny_sim_config, tmp_path):
    import namsa

    model_dir, rec = tiny_model
    fine = namsa.simulate_sample(MATERIAL, AXIS, tiny_sim_config.model_copy(update={"pattern_px": 32}))
    path = _write(tmp_path / "fine-detector.emd", fine)
    assert _run("reconstruct", path, "--model", model_dir, "--out", tmp_path / "out") == 0
    info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
    assert any(note.startswith("detector ky: rebinned 32 px") for note in info["resampling"])
    expected = rec.predict(sample.cbed)[0]
    got = np.load(tmp_path / "out" / "potential.npy")
    assert _rel_l2(got, expected) < 0.1, _rel_l2(got, expected)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("namsa: error: ")
    return err[0]


def test_missing_calibration_names_its_flag(sample, tiny_model, tmp_path, capsys):
    path = _write(tmp_path / "no-step.hspy", sample, step=False)
    assert _run("reconstruct", path, "--model", tiny_model[0], "--out", tmp_path / "out") == 2
    assert "--scan-step-a" in _one_error_line(capsys)
    path = _write(tmp_path / "no-energy.hspy", sample, energy_kv=-1.0)
    assert _run("reconstruct", path, "--model", tiny_model[0], "--out", tmp_path / "out") == 2
    assert "--energy-kv" in _one_error_line(capsys)


def test_all_missing_calibrations_are_named_in_one_line(sample, tiny_model, tmp_path, capsys):
    """A file without any calibration: one run names all four flags (not one per run)."""
    path = _write(tmp_path / "bare.hspy", sample, energy_kv=-1.0, semiangle_mrad=-1.0, step=False, dk=False)
    assert _run("reconstruct", path, "--model", tiny_model[0], "--out", tmp_path / "out") == 2
    line = _one_error_line(capsys)
    assert all(flag in line for flag in ("--energy-kv", "--semiangle-mrad", "--dk-inv-a", "--scan-step-a")), line


def test_a_negative_scan_scale_is_a_flipped_axis_read_back_in_order(sample, tiny_model, tmp_path):
    """The scan stored bottom row first with a negative y scale (TIA's y axis): the same maps as the
    file stored in order, and the flip said in reconstruction.json; a step given by flag keeps the
    file's sign (the map is never mirrored silently)."""
    model_dir, rec = tiny_model
    sy, sx = sample.meta.scan_shape
    flipped = sample.cbed.reshape(sy, sx, *sample.cbed.shape[1:])[::-1]
    from rsciio.hspy import file_writer

    path = tmp_path / "flipped.hspy"
    step = (-sample.meta.fov_A[2] / sy, sample.meta.fov_A[3] / sx)
    tem = {"beam_energy": sample.meta.energy_kv, "convergence_angle": sample.meta.semiangle_mrad}
    file_writer(str(path), _signal(np.ascontiguousarray(flipped), step, sample.meta.pattern_dk_inv_A, tem))
    expected = rec.predict(sample.cbed)[0]
    for extra in ([], ["--scan-step-a", f"{sample.meta.fov_A[2] / sy!r},{sample.meta.fov_A[3] / sx!r}"]):
        assert _run("reconstruct", path, "--model", model_dir, "--out", tmp_path / "out", *extra) == 0
        got = np.load(tmp_path / "out" / "potential.npy")
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * float(np.abs(expected).max()))
        info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
        assert info["sampling_used"]["flipped_yx"] == [True, False]
        assert any("step is negative" in note for note in info["resampling"]), info["resampling"]


def test_wrong_beam_energy_is_refused(sample, tiny_model, tmp_path, capsys):
    path = _write(tmp_path / "300kv.hspy", sample, energy_kv=300.0)
    assert _run("reconstruct", path, "--model", tiny_model[0], "--out", tmp_path / "out") == 2
    line = _one_error_line(capsys)
    assert "300 kV" in line and f"{sample.meta.energy_kv:g} kV" in line
    assert not (tmp_path / "out" / "potential.npy").exists()


def test_wrong_convergence_angle_is_refused(sample, tiny_model, tmp_path, capsys):
    path = _write(tmp_path / "semi.hspy", sample)
    assert _run("reconstruct", path, "--model", tiny_model[0], "--out", tmp_path / "out",
                "--semiangle-mrad", 30) == 2
    assert "30 mrad (command line)" in _one_error_line(capsys)


def test_too_few_scan_points_and_a_short_detector_are_refused(sample, tiny_model, tmp_path, capsys):
    sy, sx = sample.meta.scan_shape
    stack = sample.cbed.reshape(sy, sx, *sample.cbed.shape[1:])
    path = _write(tmp_path / "small-scan.hspy", sample, data=stack[: sy // 2])
    assert _run("reconstruct", path, "--model", tiny_model[0], "--out", tmp_path / "out") == 2
    assert f"needs at least {sy}" in _one_error_line(capsys)
    path = _write(tmp_path / "small-detector.hspy", sample, data=stack[:, :, 4:-4, 4:-4])
    assert _run("reconstruct", path, "--model", tiny_model[0], "--out", tmp_path / "out") == 2
    assert "the detector reaches" in _one_error_line(capsys)


def test_unreadable_and_non_4d_files_are_refused(sample, tiny_model, tmp_path, capsys):
    broken = tmp_path / "broken.hspy"
    broken.write_bytes(b"this is not an HDF5 file" * 10)
    assert _run("reconstruct", broken, "--model", tiny_model[0], "--out", tmp_path / "out") == 2
    assert "could not be read" in _one_error_line(capsys)
    flat_3d = tmp_path / "three-d.hspy"
    from rsciio.hspy import file_writer

    signal = _signal(sample.cbed[None], (1.0, 1.0), 1.0, {"beam_energy": 200.0})  # (S, P, P): a stack, not a scan
    signal["data"], signal["axes"] = sample.cbed, signal["axes"][1:]
    for i, axis in enumerate(signal["axes"]):
        axis["index_in_array"] = i
    file_writer(str(flat_3d), signal)
    assert _run("reconstruct", flat_3d, "--model", tiny_model[0], "--out", tmp_path / "out") == 2
    assert "no 4-D dataset" in _one_error_line(capsys)
    assert _run("reconstruct", tmp_path / "missing.hspy", "--model", tiny_model[0], "--out", tmp_path / "out") == 2
    assert "does not exist" in _one_error_line(capsys)
    odd = tmp_path / "scan.xyz"
    odd.write_text("x")
    assert _run("reconstruct", odd, "--model", tiny_model[0], "--out", tmp_path / "out") == 2
    assert "unknown file type" in _one_error_line(capsys)


@pytest.mark.parametrize("case", ["negative-step", "missing-model", "out-is-a-file"])
def test_bad_flags_model_and_out_are_one_line(sample, tmp_path, capsys, case):
    path = _write(tmp_path / "scan.hspy", sample)
    (tmp_path / "a-file").write_text("x")
    args = {"negative-step": ["--model", "pretrained:study-scan", "--out", tmp_path / "o", "--scan-step-a", "-1"],
            "missing-model": ["--model", tmp_path / "no-model", "--out", tmp_path / "o"],
            "out-is-a-file": ["--model", "pretrained:study-scan", "--out", tmp_path / "a-file"]}[case]
    expected = {"negative-step": "must be a positive number", "missing-model": "does not exist",
                "out-is-a-file": "is a file, not a directory"}[case]
    if case == "negative-step":
        with pytest.raises(SystemExit) as exit_info:
            _run("reconstruct", path, *args)
        assert exit_info.value.code == 2
    else:
        assert _run("reconstruct", path, *args) == 2
    assert expected in _one_error_line(capsys)


@pytest.mark.parametrize("scan_px, pattern_px", [(32, 32), (64, 64)], ids=["as-trained", "finer-scan-and-detector"])
def test_pretrained_study_scan_on_a_simulated_file_correlates_with_the_truth(tmp_path, scan_px, pattern_px):
    """The shipped reconstructor on an .hspy file of a namsa simulation with its physics (200 kV,
    20 mrad, 0.12 A sampling, 12 A cell); the second file has twice the scan points and detector
    pixels over the same field and disc, so it is subsampled and rebinned first."""
    import namsa

    cfg = namsa.SimulationConfig(scan_shape=(scan_px, scan_px), pattern_px=pattern_px, target_px=32)
    sample = namsa.simulate_sample(namsa.load_structure("Si-diamond"), (0, 0, 1), cfg)
    path = _write(tmp_path / "si-200kv.hspy", sample)
    assert _run("reconstruct", path, "--model", "pretrained:study-scan", "--out", tmp_path / "out") == 0
    got = np.load(tmp_path / "out" / "potential.npy")
    assert got.shape == sample.potential.shape
    r = np.corrcoef(got.ravel(), sample.potential.ravel())[0, 1]
    assert r > 0.8, r
    info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
    assert info["model_expects"]["source"] == "model card expects_input"
    assert len(info["resampling"]) == (1 if scan_px == 32 else 4), info["resampling"]
    assert info["symmetry_average_turns"] == 8   # each tile's maps averaged over the turns by default
    if scan_px == 32:   # --single-pass: one network pass per tile, a different map of the same specimen
        assert _run("reconstruct", path, "--model", "pretrained:study-scan", "--out", tmp_path / "one",
                    "--single-pass") == 0
        assert json.loads((tmp_path / "one" / "reconstruction.json").read_text())["symmetry_average_turns"] == 1
        single = np.load(tmp_path / "one" / "potential.npy")
        assert single.shape == got.shape and not np.allclose(single, got)


@pytest.mark.usefixtures("one_thread")
def test_a_physics_input_model_gets_the_files_own_calibration(sample, tiny_data_dir, tiny_sim_config, tmp_path):
    """A model with CoM/iCoM input planes computes them with the file's detector sampling and scan
    step (not the training set's typical ones), for a window (not periodic); the JSON records it."""
    import models
    from namsa.icom import ScanCalibration

    model_cfg = models.ModelConfig(preset="tiny", physics_inputs=["com_y", "com_x", "icom"], icom_residual=True)
    result = models.train(model_cfg, tiny_train_cfg(max_steps=2, eval_every=2, checkpoint_every=2), None, DATA_CFG,
                          [tiny_data_dir], tmp_path / "run", simulation=tiny_sim_config)
    rec = models.load_reconstructor(result.model_dir, device="cpu")
    assert _run("reconstruct", _write(tmp_path / "scan.hspy", sample), "--model", result.model_dir, "--out",
                tmp_path / "out") == 0
    info = json.loads((tmp_path / "out" / "reconstruction.json").read_text())
    used = ScanCalibration.from_dict(info["physics_input_calibration"])
    simulated = sample.meta.calibration
    assert used.scan_step_A == pytest.approx(simulated.scan_step_A, rel=1e-6) and not used.periodic
    assert used.k_sampling_invA == pytest.approx(simulated.k_sampling_invA, rel=1e-6)
    got = np.load(tmp_path / "out" / f"{rec.targets[0]}.npy")
    np.testing.assert_allclose(got, rec.predict(sample.cbed, calibration=used)[0], rtol=1e-5,
                               atol=1e-5 * float(np.abs(got).max()))
    typical = rec.predict(sample.cbed)[0]  # the card's typical calibration: another input, another answer
    assert not np.allclose(got, typical, rtol=1e-4, atol=1e-4 * float(np.abs(got).max()))
