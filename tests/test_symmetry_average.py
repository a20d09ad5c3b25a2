"""Symmetry averaging at prediction (models/symmetry_average.py, `Reconstructor.predict(symmetry_average=...)`,
`evaluation.symmetry_average`, `namsa reconstruct --single-pass`): the maps of the square group's 8
turns of a stack, each turned back, averaged. That each turn of a stack is the simulation of the turned
specimen is tests/test_symmetry_augmentation.py's (the same `stage.symmetry` operations)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import models
from _models_fixture import tiny_trained_model  # noqa: F401  (one real tiny training per session)
from models.reconstructor import ReconstructorInputError
from models.symmetry_average import SymmetryAverageError, averaged_over_turns, transposed_calibration
from namsa.icom import ScanCalibration
from stage.symmetry import OPS, SymmetryOp, apply_op, turn_maps, turn_stacks, unturn_maps

RNG = np.random.default_rng(3)


def test_the_identity_comes_first_and_unturning_inverts_every_turn():
    assert OPS[0] == SymmetryOp(False, False, False)
    maps = RNG.normal(size=(2, 3, 5, 5))
    for op in OPS:
        np.testing.assert_array_equal(unturn_maps(op, turn_maps(op, maps)), maps)
    # a quarter turn is not its own inverse: undoing it is the opposite quarter turn
    quarter, back = SymmetryOp(True, True, False), SymmetryOp(True, False, True)
    np.testing.assert_array_equal(unturn_maps(quarter, maps[0, 0]), turn_maps(back, maps[0, 0]))
    assert not np.array_equal(unturn_maps(quarter, maps[0, 0]), turn_maps(quarter, maps[0, 0]))


def test_a_batch_is_turned_as_each_of_its_stacks():
    stacks = RNG.normal(size=(3, 16, 6, 6)).astype(np.float32)
    for op in OPS:
        batched = turn_stacks(op, stacks)
        for b in range(3):
            one = stacks[b].copy()
            apply_op(op, one, [])
            np.testing.assert_array_equal(batched[b], one)


def _scan_map(stacks: np.ndarray) -> np.ndarray:
    """(B, 1, n, n): each probe position's total intensity, a map that turns exactly with the scan."""
    n = int(np.sqrt(stacks.shape[1]))
    return stacks.sum(axis=(-2, -1)).reshape(len(stacks), 1, n, n)


def test_an_equivariant_map_is_its_own_average_and_transposing_turns_say_so():
    stacks = RNG.random((2, 25, 7, 7))
    flags = []

    def predict(turned: np.ndarray, transposed: bool) -> np.ndarray:
        flags.append(transposed)
        return _scan_map(turned)

    averaged, turns = averaged_over_turns(predict, stacks, required=True)
    assert turns == 8 and flags == [op.transpose for op in OPS]
    np.testing.assert_allclose(averaged, _scan_map(stacks), rtol=1e-6)


def test_a_map_shifted_by_one_pixel_averages_to_the_mean_of_the_four_unit_shifts():
    stacks = RNG.random((1, 36, 5, 5))
    truth = _scan_map(stacks)[0, 0]
    averaged, _ = averaged_over_turns(lambda s, _: np.roll(_scan_map(s), 1, axis=-1), stacks, required=False)
    shifts = [np.roll(truth, k, axis=a) for a in (0, 1) for k in (1, -1)]
    np.testing.assert_allclose(averaged[0, 0], np.mean(shifts, axis=0), rtol=1e-6)


def test_maps_of_another_size_than_the_scan_get_the_single_pass_or_a_one_line_refusal():
    stacks = RNG.random((1, 16, 5, 5))
    twice = lambda s, _: np.repeat(np.repeat(_scan_map(s), 2, axis=-1), 2, axis=-2)  # noqa: E731
    out, turns = averaged_over_turns(twice, stacks, required=False)
    assert turns == 1 and out.shape == (1, 1, 8, 8)
    with pytest.raises(SymmetryAverageError, match="maps of the scan's size.*symmetry_average=None or False"):
        averaged_over_turns(twice, stacks, required=True)


def test_a_transposing_turn_gets_the_calibration_with_y_and_x_swapped():
    cal = ScanCalibration(scan_shape=(4, 6), k_sampling_invA=(0.1, 0.2), energy_kv=200.0, scan_step_A=(0.5, 0.7),
                          shift_frac=(0.1, 0.3), periodic=False)
    swapped = transposed_calibration(cal)
    assert (swapped.scan_shape, swapped.k_sampling_invA, swapped.scan_step_A, swapped.shift_frac) == \
        ((6, 4), (0.2, 0.1), (0.7, 0.5), (0.3, 0.1))
    assert (swapped.energy_kv, swapped.periodic) == (200.0, False)
    assert transposed_calibration(cal.to_dict())["scan_step_A"] == [0.7, 0.5]
    assert transposed_calibration(None) is None
    assert transposed_calibration(swapped) == cal


@pytest.fixture(scope="module")
def flagship():
    return models.load_reconstructor("pretrained:study-scan-gpu", device="cpu")


def test_predict_averages_the_eight_turned_single_passes_by_default(flagship):
    stack = RNG.random((1024, 32, 32)).astype(np.float32) / 1024
    cal = ScanCalibration(scan_shape=(32, 32), k_sampling_invA=(0.17, 0.17), energy_kv=200.0,
                          scan_step_A=(0.45, 0.54))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # a random stack is far from the training data: warned, irrelevant here
        averaged = flagship.predict(stack, cal)
        assert flagship.last_turns == 8
        singles = [unturn_maps(op, flagship.predict(turn_stacks(op, stack),
                                                    transposed_calibration(cal) if op.transpose else cal,
                                                    symmetry_average=False)) for op in OPS]
        assert flagship.last_turns == 1
        np.testing.assert_allclose(averaged, np.mean(singles, axis=0), rtol=1e-4, atol=1e-3)
        assert not np.allclose(averaged, singles[0], rtol=1e-3)
        with pytest.raises(ReconstructorInputError, match="symmetry_average must be None, True or False"):
            flagship.predict(stack, cal, symmetry_average="yes")


def test_the_tiny_model_whose_maps_are_twice_its_scan_is_refused_averaging_in_one_line(tiny_trained_model,
                                                                                       tiny_data_dir):
    import stage

    rec = models.load_reconstructor(tiny_trained_model.model_dir, device="cpu")
    with stage.open_stores(stage.find_stores(tiny_data_dir)) as stores:
        cbed = stores[0].cbed
    assert rec.predict(cbed).shape[-1] == 2 * int(np.sqrt(cbed.shape[0])) and rec.last_turns == 1
    with pytest.raises(ReconstructorInputError, match="square scan, square patterns and maps of the scan's size"):
        rec.predict(cbed, symmetry_average=True)


def test_evaluation_scores_the_averaged_maps_unless_told_not_to(flagship, tmp_path):
    import json

    import namsa
    import stage
    from evaluation import EvaluationConfig, evaluate
    from evaluation.views import FIELD, field_map

    cfg = namsa.SimulationConfig(scan_shape=(32, 32), pattern_px=32, target_px=32)   # the flagship's physics
    sample = namsa.simulate_sample(namsa.load_structure("Si-diamond"), (0, 0, 1), cfg)
    with stage.StoreWriter(tmp_path / "data" / "store-0", config_hash=cfg.physics_hash()) as writer:
        writer.put(sample)
    scored = {}
    for averaged in (True, False):
        eval_cfg = EvaluationConfig(split="all", mean_baseline=False, n_bootstrap=0, n_panels=0, worst_k=0,
                                    symmetry_average=averaged)
        result = evaluate(eval_cfg, stage.DataConfig(), [tmp_path / "data"], "pretrained:study-scan-gpu",
                          tmp_path / f"eval-{averaged}")
        metrics = json.loads(result.metrics_json.read_text())
        assert metrics["config"]["symmetry_average"] is averaged
        scored[averaged] = metrics["samples"][0]["metrics"]["potential"]["network"][FIELD]["rel_l2"]
    with stage.open_stores(tmp_path / "data") as stores:
        sample = stores[0]   # as stored (float16 patterns): what the evaluation read
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for averaged in (True, False):
            own = flagship.predict(sample.cbed.astype(np.float32), sample.meta.calibration,
                                   symmetry_average=None if averaged else False)[0]
            truth = sample.potential.astype(np.float64)
            expected = np.linalg.norm(field_map(own, truth) - truth) / np.linalg.norm(truth)
            assert scored[averaged] == pytest.approx(expected, rel=1e-4)
    assert scored[True] != pytest.approx(scored[False], rel=1e-3)
