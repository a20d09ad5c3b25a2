"""What a card or a config says is checked, not believed (issue 39, item 5).

A model card's training ranges are refused at load when they are no range (low above high) or when
they leave what their estimator can give (a dose below one electron a pattern would silence the
low-dose check of every scan); a config's ``evaluation.network_ptycho.seed`` and ``max_slice_A`` are
bounded at load, not found out by py4DSTEM after 20 s; a defocus outside the bright-field parallax's
search window is reported as outside it, not as the wrapped number inside it; and `namsa inspect
--verify` tells a store being written by a live writer from one a killed writer left.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import namsa
from models.card import read_card_file
from models.errors import ModelDirError
from models.scan_fit import card_checks, trained_dose_range
from namsa.constants import MIN_DOSE_E_PER_A2
from namsa.optics import scan_step_A
from namsa.random_streams import MAX_SEED
from stage.scan_statistics import parallax_defocus
from workflow.cli import main

REPO = Path(__file__).resolve().parents[1]
#: the shipped card that records training_statistics (measured over its training split)
MEASURED = REPO / "models" / "pretrained" / "study-scan-gpu"


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("namsa: error: "), err
    return lines[0]


# ------------------------------------------------------------------------------------- model cards

def _card_dir(tmp_path: Path, change) -> Path:
    """A copy of the shipped ``study-scan-gpu`` model directory whose card JSON ``change`` edits."""
    model = tmp_path / "model"
    shutil.copytree(MEASURED, model)
    card = json.loads((model / "model_card.json").read_text())
    change(card)
    (model / "model_card.json").write_text(json.dumps(card))
    return model


def _set_range(name: str, low: float, high: float):
    def change(card: dict) -> None:
        card["training_statistics"]["ranges"].setdefault(name, {"samples": 8, "unit": "e/A^2"}).update(
            low=low, high=high)
    return change


def _augmentation(low: float, high: float):
    def change(card: dict) -> None:
        card["trained_on"]["dose_augmentation"]["dose_range_e_per_A2"] = [low, high]
    return change


@pytest.mark.parametrize("change, says", [
    (_set_range("defocus_A", 200.0, -200.0), "training_statistics: Value error, ranges.defocus_A is [200, -200]: "
                                             "low above high"),
    (_set_range("scattered_fraction", 0.5, 0.1), "ranges.scattered_fraction is [0.5, 0.1]: low above high"),
    (_set_range("dose_e_per_A2", 1e-300, 1e6), "ranges.dose_e_per_A2 [1e-300, 1e+06] leaves [1, inf]"),
    (_augmentation(1e-300, 1e6), "dose_range_e_per_A2 [1e-300, 1e+06] leaves [1, inf], the values it can take "
                                 "(below it a pattern holds less than one electron)"),
    (_augmentation(1e6, 1e2), "dose_range_e_per_A2 is [1e+06, 100]: low above high"),
    (_set_range("defocus_A", -1e9, 100.0), "ranges.defocus_A [-1e+09, 100] leaves [-100000, 100000]"),
], ids=["defocus-low-above-high", "scattering-low-above-high", "measured-dose-1e-300", "augmented-dose-1e-300",
        "augmented-dose-reversed", "defocus-of-a-kilometre"])
def test_a_card_whose_training_ranges_are_nonsense_is_refused_at_load(tmp_path, change, says):
    model = _card_dir(tmp_path, change)
    with pytest.raises(ModelDirError) as caught:
        read_card_file(model / "model_card.json")
    assert says in str(caught.value) and "\n" not in str(caught.value)
    from models import load_reconstructor

    with pytest.raises(ModelDirError, match="use the model_card.json that namsa train wrote"):
        load_reconstructor(model, device="cpu")


def test_the_shipped_cards_ranges_stand():
    card = read_card_file(MEASURED / "model_card.json")
    assert card.training_statistics.ranges["defocus_A"].low < card.training_statistics.ranges["defocus_A"].high
    assert trained_dose_range(card) == (100.0, 1e6)


def test_the_low_dose_check_fires_below_the_lowest_dose_a_card_may_state(tmp_path):
    """A card may state training down to MIN_DOSE_E_PER_A2 and no lower, so data at less (a pattern
    holding a fraction of an electron) always draw the dose warning."""
    card = read_card_file(_card_dir(tmp_path, _augmentation(MIN_DOSE_E_PER_A2, 1e6)) / "model_card.json")
    maps = {"potential": np.full((8, 8), card.normalizer.targets["potential"][0], np.float32)}
    report = card_checks.check_after_inference(maps, card, {"measured": {"dose_e_per_A2": {"value": 0.5}}})
    assert [w["code"] for w in report["warnings"]] == ["dose"]
    assert "below the 1-1e+06 e/Angstrom^2 the model was trained at" in report["warnings"][0]["message"]


@pytest.mark.parametrize("override, says", [
    ("data.dose_augmentation.dose_range_e_per_A2=[1e-300, 1e6]", "starts below 1 electron/A^2"),
    ("simulation.variations.dose_e_per_A2=0.5", "dose_e_per_A2=0.5 is below 1 electron/Angstrom^2"),
])
def test_a_training_config_cannot_ask_for_a_dose_its_card_could_not_state(tmp_path, capsys, override, says):
    assert main(["simulate", "--out", str(tmp_path / "out"), "--set", override]) == 2
    assert says in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ config

@pytest.mark.parametrize("override, says", [
    ("evaluation.network_ptycho.seed=1000000000000000000000000000000",
     "evaluation.network_ptycho.seed: Input should be less than or equal to 9223372036854775807"),
    ("evaluation.network_ptycho.seed=1.0e+30", "evaluation.network_ptycho.seed: "),
    ("evaluation.network_ptycho.max_slice_A=1.0e-300",
     "evaluation.network_ptycho.max_slice_A: Input should be greater than or equal to 0.5"),
    ("evaluation.multislice_ptycho.max_slice_A=0.1",
     "evaluation.multislice_ptycho.max_slice_A: Input should be greater than or equal to 0.5"),
], ids=["seed-1e30", "seed-1e30-float", "slice-1e-300", "multislice-slice-0.1"])
def test_ptychography_settings_are_bounded_at_config_load(tmp_path, capsys, override, says):
    assert main(["simulate", "--out", str(tmp_path / "out"), "--set", override]) == 2
    assert says in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_the_largest_seed_refines(tmp_path):
    """Every config seed may be up to MAX_SEED; py4DSTEM's numpy seeding takes less, so it wraps."""
    pytest.importorskip("py4DSTEM")
    from namsa.ptychography.convergence import ConvergenceRule
    from namsa.ptychography.refine import PY4DSTEM_SEEDS, RefineSettings, refine_from_sample

    cfg = namsa.SimulationConfig(cell_lateral_A=5.0, thickness_A=3.0, scan_shape=(8, 8), pattern_px=32, target_px=16,
                                 sampling_A=0.1, semiangle_mrad=25.0, workers=1)
    sample = namsa.simulate_sample("C-graphite", (0, 0, 1), cfg)
    rule = ConvergenceRule(max_iterations=2)
    largest = refine_from_sample(sample, sample.potential, RefineSettings(seed=MAX_SEED, convergence=rule))
    wrapped = refine_from_sample(sample, sample.potential,
                                 RefineSettings(seed=MAX_SEED % PY4DSTEM_SEEDS, convergence=rule))
    assert largest.skipped is None and largest.iterations == 2
    np.testing.assert_array_equal(largest.potential, wrapped.potential)


# --------------------------------------------------------------------------------- parallax window

def _scan(material: str, axis: tuple[int, int, int], c1_A: float) -> namsa.Sample:
    """A 20 Angstrom specimen at the shipped model's physics with namsa's C1 at ``c1_A``."""
    return namsa.simulate_sample(material, axis, namsa.SimulationConfig(thickness_A=20.0, workers=1,
                                                                          aberrations={"C1_A": c1_A}))


def _defocus_report(sample: namsa.Sample) -> dict:
    from models import pretrained_card

    step = scan_step_A(sample.meta.fov_A, sample.meta.scan_shape)
    return card_checks.input_report(sample.cbed, pretrained_card("study-scan"), {"scan_step_A": list(step)})


def test_a_defocus_of_3000_A_is_outside_the_search_window_not_a_number_inside_it():
    """+3000 Angstrom wraps past the ~+-450 Angstrom window: Si [110]'s focus curve peaks at the window's
    edge, said with no number."""
    how = "the focus curve peaks at the window's edge"
    sample = _scan("Si-diamond", (1, 1, 0), 3000.0)
    step = scan_step_A(sample.meta.fov_A, sample.meta.scan_shape)
    found = parallax_defocus(sample.cbed, sample.meta.scan_shape, step, 20.0)
    assert found.outside and found.value_A is None and how in found.reason
    report = _defocus_report(sample)
    assert report["measured"]["defocus_A"]["value"] is None
    assert [w["code"] for w in report["warnings"]] == ["defocus"]
    message = report["warnings"][0]["message"]
    assert message.startswith(f"defocus outside the search window (+-{found.search_A:.0f} A) of the bright-field "
                              f"parallax: {how}") and "the model was trained on -35..115 A" in message


def test_a_cubic_001_lattice_at_3000_A_reads_as_aliases_the_parallax_cannot_tell_apart():
    """The limit, stated: Si [001] repeats alike along y and x, so +3000 Angstrom wraps to the same pair of
    equal peaks (-104 and +274 A) along both; the y frequencies once read one and the x the other, and that
    was called a wrap, but README's own Si [001] at focus reads its aliases the same way (-277 along y, +26
    along x). Readings that are each other's aliases are one aliased reading: recorded with its aliases, and
    with one alias inside the training range, not judged (stage.scan_statistics, "Outside the search window")."""
    sample = _scan("Si-diamond", (0, 0, 1), 3000.0)
    step = scan_step_A(sample.meta.fov_A, sample.meta.scan_shape)
    found = parallax_defocus(sample.cbed, sample.meta.scan_shape, step, 20.0)
    assert not found.outside and len(found.aliases_A) == 1
    assert sorted([found.value_A, *found.aliases_A]) == pytest.approx([-104, 274], abs=15)
    report = _defocus_report(sample)
    assert report["measured"]["defocus_A"]["note"].startswith("not judged: the focus curve peaks as high at -10")
    assert report["warnings"] == []


def test_a_focus_inside_the_window_still_reads_as_a_number():
    sample = _scan("Si-diamond", (0, 0, 1), 100.0)
    report = _defocus_report(sample)
    measured = report["measured"]["defocus_A"]
    assert "outside_search_window" not in measured and abs(measured["value"] - 110.0) <= measured["tolerance_A"]
    assert [w["code"] for w in report["warnings"]] == []


# --------------------------------------------------------------------------------- inspect --verify

HOLD = """
import sys, stage
with stage.StoreWriter(sys.argv[1], config_hash=sys.argv[2]):
    print("open", flush=True)
    sys.stdin.readline()
"""


def test_inspect_verify_tells_a_live_writers_empty_store_from_a_killed_ones(tmp_path, capsys):
    """A writer that has opened its store and not yet stored a sample (a simulate in its first minute):
    `namsa inspect --verify` names it and exits 0; once that writer is killed (-9), the same empty store
    is what a killed writer left, a problem (exit 1)."""
    from stage_helpers import CONFIG_HASH

    store = tmp_path / "data" / "store-000"
    writer = subprocess.Popen([sys.executable, "-c", HOLD, str(store), CONFIG_HASH], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "open"
        assert main(["inspect", str(tmp_path / "data"), "--verify"]) == 0
        out = capsys.readouterr()
        assert f"being written by a live writer (pid {writer.pid} on " in out.out and "EMPTY" not in out.out
        assert out.err == ""
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert main(["inspect", str(tmp_path / "data"), "--verify"]) == 1
    out = capsys.readouterr()
    assert "EMPTY: no samples (as a writer killed before its first sample leaves a store" in out.out
    assert "live writer" not in out.out and _one_line(out.err).startswith("namsa: error: problems in 1 of 1 store")
