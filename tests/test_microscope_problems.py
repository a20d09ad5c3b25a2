"""Every problem of a file that no flag can fix, found in the first run and said in one line (issue
31, item 3), and spot patterns (parallel-beam or precession diffraction) refused as such, while
convergent-beam data of thick crystals, blurred by a detector or smeared by a descan, pass."""
from __future__ import annotations

import pytest
from scipy import ndimage

from microscope_helpers import disc_scan, precession_scan, simulated_scan, spot_scan
from models.reconstructor import pretrained_card
from models.scan_fit import model_expectation, plan_fit
from models.scan_fit.fit import sampling_problems
from namsa.camera import CameraSettings, record
from stage.microscope import Calibrations, ExperimentalInputError, RawScan, check_before_inference
from stage.microscope.disc import find_disc, not_cbed

FOUND = {"energy_kv": 200.0, "semiangle_mrad": 20.0, "dk_inv_A": (0.1736, 0.1736), "step_A": (0.375, 0.375)}


@pytest.fixture(scope="module")
def expect():
    return model_expectation(pretrained_card("study-scan"))


def test_precession_and_parallel_beam_spots_are_refused_as_spots():
    with pytest.raises(ExperimentalInputError, match="the direct beam has no edge: it fades from 70% of its level"):
        check_before_inference(RawScan(precession_scan(), dict(FOUND, dk_inv_A=(0.08, 0.08)), "pend.blo"), {})
    with pytest.raises(ExperimentalInputError, match="do not look like CBED"):
        check_before_inference(RawScan(spot_scan(), FOUND, "spots.hspy"), {})


@pytest.mark.parametrize("material, axis, semiangle, px, blur", [("SrTiO3-perovskite", (0, 0, 1), 20.0, 32, 1.0),
                                                                 ("GaAs-zincblende", (0, 1, 1), 10.0, 64, 0.0)])
def test_thick_crystals_through_a_blurring_detector_are_cbed(material, axis, semiangle, px, blur):
    """The hardest CBED namsa makes for the edge criterion: 150 Angstrom thick, a structured disc,
    or a small semi-angle on a fine detector, after a Gaussian detector blur."""
    import namsa

    cfg = namsa.SimulationConfig(scan_shape=(4, 4), pattern_px=px, cell_lateral_A=12.0, thickness_A=150.0,
                                 semiangle_mrad=semiangle)
    mean = namsa.simulate_sample(material, axis, cfg).cbed.mean(axis=0)
    assert not_cbed(find_disc(ndimage.gaussian_filter(mean, blur) if blur else mean)) is None


def test_a_descan_smearing_the_mean_disc_is_not_taken_for_a_spot():
    """A descan of 10 x 5 px over the scan smears the plain mean's disc into an oval (the check before
    refused such data as "not round"); the disc is judged on the mean of the patterns recentred by
    the fitted descan, and measures as the mean disc without a descan."""
    data, meta = simulated_scan()
    frames = record(data, (0.5, 0.5), CameraSettings(dose_e_per_A2=1e6, descan_px_per_A=((3.0, 0.0), (0.0, 1.5)),
                                                     detector_px=64))
    assert "not round" in not_cbed(find_disc(frames.reshape(-1, 64, 64).mean(axis=0).astype(float)))
    found = dict(FOUND, dk_inv_A=(meta.pattern_dk_inv_A,) * 2, step_A=(0.5, 0.5))
    _, report, calib = check_before_inference(RawScan(frames, found, "descan.hspy"), {})
    undisturbed = find_disc(data.reshape(-1, 32, 32).mean(axis=0))
    assert report["measured"]["disc_radius_px"]["value"] == pytest.approx(undisturbed.radius_px, abs=0.3)
    assert report["measured"]["disc_radius_px"]["edge_px"] < 1.5
    assert calib.descan.slope_y == pytest.approx((1.5, 0.0), abs=0.1)


def test_plan_fit_names_every_problem_in_one_line(expect):
    """A 128 Angstrom step on a 3 x 2 scan with a coarse detector: three problems, one refusal."""
    cal = Calibrations(energy_kv=200.0, semiangle_mrad=20.0, dk_inv_A=(0.5, 0.5), step_A=(128.0, 128.0),
                       sources={k: "file metadata" for k in ("energy_kv", "semiangle_mrad", "dk_inv_A", "step_A")})
    with pytest.raises(ExperimentalInputError) as info:
        plan_fit((3, 2, 144, 144), cal, expect)
    line = str(info.value)
    assert line.startswith("3 problems: (1) the scan step along y is 128 Angstrom") and "\n" not in line
    assert "its 3 positions are fewer than the 32" in line and "its 2 positions are fewer" in line
    assert "(3) the detector pixel is 0.5 1/Angstrom" in line


def test_what_the_shape_alone_tells_is_found_without_calibrations(expect):
    problems = sampling_problems((3, 2, 16, 144), {}, expect)
    assert [p.split(";")[0] for p in problems] == [
        "the scan has 3 positions along y", "the scan has 2 positions along x",
        "the detector has 16 px along ky, fewer than the model's 32 px patterns at any pixel size"]
    assert sampling_problems((64, 64, 64, 64), {}, expect) == []


def test_the_first_run_lists_missing_calibrations_and_the_models_problems_together(expect):
    """The NanoMegas case of issue 31 on CBED discs: no detector pixel or semi-angle in the file, a
    128 Angstrom step and a 3 x 2 scan. Checked with the model's problems (as `namsa reconstruct`
    can ask), the first run names all of them in one line instead of one per attempt."""
    data = disc_scan((3, 2), px=32, radius=4.6)
    scan = RawScan(data, {"energy_kv": 200.0, "step_A": (128.0, 128.0)}, "nanomegas.hspy")
    with pytest.raises(ExperimentalInputError) as info:
        check_before_inference(scan, {}, model_problems=lambda known: sampling_problems(data.shape, known, expect))
    line = str(info.value)
    assert line.startswith("3 problems: (1) the file's metadata lacks 2 calibration(s): convergence semi-angle")
    assert "(2) the scan step along y is 128 Angstrom" in line and "(3) the scan step along x" in line


def test_a_single_problem_is_said_as_before(expect):
    data = disc_scan((8, 40), px=32, radius=4.6)
    with pytest.raises(ExperimentalInputError, match=r"^the scan has 8 positions along y"):
        plan_fit(data.shape, Calibrations(200.0, 20.0, (0.1736, 0.1736), (0.375, 0.5),
                                          {k: "file metadata" for k in ("energy_kv", "semiangle_mrad")}), expect)
