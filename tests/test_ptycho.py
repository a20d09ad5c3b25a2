"""namsa.ptychography (single_slice / multislice / convergence): single-slice and multislice
ptychography (py4DSTEM) of real namsa simulations, the data-error stop rule and the evaluation's
multislice subset."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from evaluation.baselines import fit_to_truth, ptycho_baseline
from namsa.ptychography.convergence import ConvergenceRule, iterate
from namsa.ptychography.multislice import MultisliceSettings, multislice_from_sample, slicing
from namsa.ptychography.single_slice import PtychoError, ptycho_from_sample, require_py4dstem
from evaluation.config import EvaluationConfig
from evaluation.methods import MULTISLICE_PTYCHO
from evaluation.scoring import _method_maps, subset_rules
from evaluation.metrics import fit_affine, pearson_r, relative_l2
from namsa.targets import to_target_resolution
from namsa.errors import UserError
from namsa.sample_meta import SampleMeta


@pytest.fixture(scope="module")
def graphite():
    """Two graphene layers (6.7 A) along [001]: a weak phase object (sigma V_p < 0.1 rad), 24 x 24 scan
    of 32 x 32 patterns over the 5 A cell (the geometry tests/test_icom.py checks iCoM on)."""
    from namsa.config import SimulationConfig
    from namsa.simulate import simulate_sample

    cfg = SimulationConfig(cell_lateral_A=5.0, thickness_A=3.0, scan_shape=(24, 24), pattern_px=32, target_px=32,
                           sampling_A=0.1, semiangle_mrad=25.0, energy_kv=200.0, workers=2)
    return simulate_sample("C-graphite", (0, 0, 1), cfg)


def test_ptycho_recovers_thin_graphite_potential(graphite):
    """Measured 2026-11-23 (py4dstem-lite 0.14.16, 4 iterations, 64 positions per update): r = 0.962
    against the projected potential, iCoM 0.928 on the same stack; the threshold 0.93 leaves room
    for solver and BLAS rounding but fails for a misplaced grid (one target pixel off: r ~ 0.3 on
    the prototype) or a wrong calibration."""
    truth = graphite.potential.astype(np.float64)
    result = ptycho_from_sample(graphite, iterations=4, batch_size=64)
    assert result.potential.shape == truth.shape and result.seconds > 0 and np.isfinite(result.error)
    # at the targets' resolution, as the evaluation compares it (evaluation.baselines.maps)
    potential = to_target_resolution(result.potential, graphite.meta.fov_A, graphite.meta.target_fwhm_A)
    r = pearson_r(potential, truth)
    assert r > 0.93
    scale, _ = fit_affine(potential, truth)
    assert scale > 0          # phase = +sigma * V_p: the sign convention matches namsa's transmission
    shifted = pearson_r(np.roll(potential, (truth.shape[0] // 4, truth.shape[1] // 4), (0, 1)), truth)
    assert shifted < r - 0.3  # the map is registered to the target grid, not just a lattice


def test_ptycho_baseline_is_a_raw_map_in_physical_units_made_without_the_truth(graphite):
    """The evaluation's ptychography map: phase over sigma at the targets' resolution, from a sample that
    carries no potential at all; its views (evaluation.views) are scoring's business."""
    truth = graphite.potential.astype(np.float64)
    raw, facts = ptycho_baseline(_without_truth(graphite), truth.shape, iterations=2, batch_size=64)
    assert set(facts) == {"seconds", "error", "iterations", "converged"}
    assert facts["seconds"] > 0 and facts["iterations"] == 2 and facts["converged"] is False
    assert raw.shape == truth.shape and raw.dtype == np.float32 and np.all(np.isfinite(raw))
    fitted, fit = fit_to_truth(raw, truth)          # the structure view's fit
    assert fit["scale"] > 0 and fitted.mean() == pytest.approx(truth.mean(), rel=1e-4)
    constant = relative_l2(np.full_like(truth, truth.mean()), truth)
    assert relative_l2(fitted, truth) < constant


def test_ptycho_needs_a_detector_sampling(graphite):
    meta = graphite.meta.replace(pattern_dk_inv_A=None, pattern_mrad_per_px=None)
    sample = SimpleNamespace(cbed=graphite.cbed, potential=graphite.potential, meta=meta)
    with pytest.raises(UserError, match="detector sampling"):
        ptycho_from_sample(sample, iterations=1)


def test_ptycho_rejects_a_stack_that_does_not_match_the_scan(graphite):
    sample = SimpleNamespace(cbed=graphite.cbed[:-1], potential=graphite.potential, meta=graphite.meta)
    with pytest.raises(PtychoError, match="24x24 scan"):
        ptycho_from_sample(sample, iterations=1)


def test_missing_py4dstem_is_a_one_line_error_naming_the_install(monkeypatch):
    for name in [m for m in sys.modules if m == "py4DSTEM" or m.startswith("py4DSTEM.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "py4DSTEM", None)   # import py4DSTEM now raises ImportError
    with pytest.raises(PtychoError) as info:
        require_py4dstem()
    message = str(info.value)
    assert "\n" not in message and "namsa[baselines]" in message and "evaluation.ptycho: false" in message


@pytest.fixture(scope="module")
def thick_si():
    """Si [001] at ~33 A (past where one phase grating holds), 12 x 12 scan of 32 px patterns over
    a 5 A cell: small enough for CPU tests, thick enough that 4 iterations are far from converged."""
    from namsa.config import SimulationConfig
    from namsa.simulate import simulate_sample

    cfg = SimulationConfig(cell_lateral_A=5.0, thickness_A=30.0, scan_shape=(12, 12), pattern_px=32, target_px=32,
                           sampling_A=0.1, semiangle_mrad=25.0, energy_kv=200.0, workers=2)
    return simulate_sample("Si-diamond", (0, 0, 1), cfg)


def _without_truth(sample):
    """The sample as a microscope gives it: the stack and its calibrations, no potential or density."""
    return SimpleNamespace(cbed=sample.cbed, meta=sample.meta)


def test_convergence_rule_reads_only_the_error_history():
    rule = ConvergenceRule(window=2, rel_tol=0.05, max_iterations=10)
    assert not rule.converged([1.0, 0.5])                 # fewer than window + 1 values: too early
    assert not rule.converged([1.0, 0.5, 0.4])            # fell 20% over the window
    assert rule.converged([1.0, 0.5, 0.4, 0.395, 0.39])   # fell 2.5% over the window: a plateau
    assert rule.converged([1.0, 0.4, 0.45, 0.5])          # rose over the window: nothing left to gain


class _ErrorsOnly:
    """A stand-in for py4DSTEM's solver (a third-party class) that replays a given error sequence and
    records the step sizes it is asked for, so the loop's decisions can be checked exactly."""

    def __init__(self, errors):
        self.todo, self.steps, self.resets, self.error = list(errors), [], [], None

    def reconstruct(self, num_iter, step_size, reset, progress_bar, **kwargs):
        assert num_iter == 1 and progress_bar is False
        self.steps.append(step_size)
        self.resets.append(reset)
        self.error = self.todo.pop(0)


def test_iterate_stops_on_the_plateau_halves_the_step_when_the_error_rises_and_respects_the_cap():
    solver = _ErrorsOnly([1.0, 0.6, 0.7, 0.5, 0.499, 0.498, 0.497])
    log = iterate(solver, ConvergenceRule(window=2, rel_tol=0.01, max_iterations=20, step_size=0.5))
    assert log.converged and log.iterations == 6 and log.errors[-1] == 0.498
    assert solver.resets == [True] + [False] * 5           # one reconstruction, continued
    assert solver.steps == [0.5, 0.5, 0.5, 0.25, 0.25, 0.25]  # halved after the rise 0.6 -> 0.7
    capped = iterate(_ErrorsOnly([1.0 / (k + 1) for k in range(10)]), ConvergenceRule(window=2, max_iterations=5))
    assert capped.iterations == 5 and not capped.converged


def test_converged_single_slice_stops_on_its_data_error_without_the_truth_and_beats_four_iterations(thick_si):
    """The truth is not passed at all (no potential attribute); under the evaluation's own stop rule
    (window 4, 2% per window) the converged run explains the data better than 4 iterations and, scored
    afterwards, is closer to the truth.

    The rule is tested where the data error has reached its slow tail, not on the shoulder after the
    first big drop: there (iterations 5-9 of this sample) the error falls 1.2-1.6% an iteration and then
    speeds up again, so a looser 5% rule stopped there or ran on to its cap by the fourth digit of the
    error, which a fresh install's libraries moved (the 5% test fails at its own commit on 2026-11's
    versions, with numpy 2.3.5 or scipy 1.16.3 put back alone too). In the tail the drop per window shrinks steadily, so drift moves the stop by an iteration or
    two and nothing here changes. Measured 2026-11-28: stops after 85 iterations (data error 0.0034
    against 0.0121 at 4); rel. L2 (legacy rule: least-squares scaled) 0.129 against 0.309 at 4."""
    blind = _without_truth(thick_si)
    shape = thick_si.potential.shape
    rule = ConvergenceRule(max_iterations=400)       # the default rule; a cap far past where it stops
    assert (rule.window, rule.rel_tol) == (4, 0.02)
    converged = ptycho_from_sample(blind, output_shape=shape, iterations=None, convergence=rule)
    four = ptycho_from_sample(blind, output_shape=shape, iterations=4)
    assert converged.converged and 4 < converged.iterations < 400 and len(converged.errors) == converged.iterations
    assert not rule.converged(converged.errors[:-1])       # it stopped at the first iteration the rule allowed
    assert converged.error < four.error / 2
    truth = thick_si.potential.astype(np.float64)
    assert relative_l2(fit_to_truth(converged.potential, truth)[0], truth) < \
        relative_l2(fit_to_truth(four.potential, truth)[0], truth)


def test_slicing_from_the_thickness():
    assert slicing(65.0, 20.0) == (4, 16.25)
    assert slicing(20.0, 20.0) == (1, 20.0)
    with pytest.raises(PtychoError, match="thickness_A") as info:
        slicing(float("nan"), 20.0)
    assert "\n" not in str(info.value)


def test_multislice_runs_on_a_thin_stack_and_returns_a_projected_potential_in_volt_angstrom(thick_si):
    settings = MultisliceSettings(max_slice_A=12.0, convergence=ConvergenceRule(max_iterations=6))
    result = multislice_from_sample(_without_truth(thick_si), settings, output_shape=thick_si.potential.shape)
    truth = thick_si.potential.astype(np.float64)
    assert result.n_slices == 3 and result.slice_thickness_A == pytest.approx(thick_si.meta.thickness_A / 3)
    assert result.potential.shape == truth.shape and result.potential.dtype == np.float32
    assert np.all(np.isfinite(result.potential)) and result.iterations == 6 and result.seconds > 0
    # Units: the slices' phases summed over sigma are V * Angstrom, so the least-squares scale to the
    # truth is of order a few (6.1 measured after 6 iterations: the object grows from zero, as the
    # single-slice one does), where a phase left in radians would need ~1 / sigma ~ 1400.
    scale, _ = fit_affine(result.potential, truth)
    assert 0.5 < scale < 30 and pearson_r(result.potential, truth) > 0.5


def test_multislice_subset_takes_the_first_thick_samples_only():
    cfg = EvaluationConfig(multislice_ptycho={"max_samples": 2, "min_thickness_A": 20.0})
    rule = subset_rules(cfg, ["potential"])[MULTISLICE_PTYCHO]
    scan = SampleMeta(scan_shape=(2, 2), fov_A=(0.0, 0.0, 2.0, 2.0))
    taken = [rule.take(scan.replace(thickness_A=t)) for t in (10.0, 30.0, None, 15.0, 40.0, 50.0, 60.0)]
    assert taken == [False, True, False, False, True, False, False]   # an unknown thickness is not thick
    assert rule.note() == "scored on a subset: the first 2 samples at least 20 A thick"
    assert subset_rules(EvaluationConfig(), ["potential"]) == {}   # off: no sample gets it
    assert subset_rules(cfg, ["density"]) == {}                    # it makes potential maps only


def test_scoring_adds_multislice_only_where_due_and_marks_its_subset(thick_si):
    cfg = EvaluationConfig(icom=False, multislice_ptycho={"max_samples": 1, "min_thickness_A": 20.0,
                                                          "convergence": {"max_iterations": 2}})
    preds = {"potential": thick_si.potential}
    maps, seconds = _method_maps(cfg, thick_si, preds, ["potential"], None, due=subset_rules(cfg, ["potential"]))
    entry = maps["potential"]
    assert entry["multislice_ptycho"].shape == thick_si.potential.shape and seconds["multislice_ptycho"] > 0
    facts = entry["multislice_ptycho_fit"]          # the computation's facts: no fit to the truth here
    assert facts["n_slices"] == 2 and "scale" not in facts
    assert "subset" in facts["subset"] and "20 A" in facts["subset"]
    skipped, _ = _method_maps(cfg, thick_si, preds, ["potential"], None)
    assert "multislice_ptycho" not in skipped["potential"]


def test_evaluate_scores_multislice_on_its_subset_only(tiny_trained_model, tiny_data_dir, tmp_path):  # noqa: F811
    """End to end on the tiny real store and trained model: multislice runs on max_samples samples
    only, its fit records say so, and its aggregate and compute time count just those. The tiny
    samples are 8 A thick, so this is the one-slice case (no kz regularisation to apply)."""
    import json

    import stage
    from evaluation import evaluate

    cfg = EvaluationConfig(n_bootstrap=0, n_panels=1, worst_k=1, ptycho=True, ptycho_iterations=2,
                           multislice_ptycho={"max_samples": 1, "min_thickness_A": 0.0,
                                              "convergence": {"max_iterations": 2}})
    result = evaluate(cfg, stage.DataConfig(), [tiny_data_dir], tiny_trained_model.model_dir, tmp_path / "eval")
    doc = json.loads(result.metrics_json.read_text())
    ran = [r for r in doc["samples"] if "multislice_ptycho" in r["metrics"]["potential"]]
    assert len(doc["samples"]) > 1 and len(ran) == 1 and ran[0] is doc["samples"][0]
    assert "subset" in ran[0]["multislice_ptycho_fit"]["subset"]
    assert all(r["multislice_ptycho_fit"] is None for r in doc["samples"][1:])
    assert all(r["ptycho_fit"]["iterations"] == 2 for r in doc["samples"])
    assert doc["compute_seconds"]["multislice_ptycho"]["n"] == 1
    assert doc["aggregates"]["potential"]["multislice_ptycho"]["field"]["rel_l2"]["n"] == 1
    assert ran[0]["multislice_ptycho_fit"]["scale"] >= 0   # the legacy fit, recorded beside the facts
    assert "multislice ptychography" in result.report_html.read_text()
