"""namsa.ptychography.refine (a network's potential refined by py4DSTEM ptychography started from it),
its grid mapping, `Reconstructor.predict(refine=...)`, `namsa reconstruct --refine` and the
evaluation's `refined_from_network`, on real namsa simulations and the tiny trained model."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from namsa.ptychography.convergence import ConvergenceRule
from namsa.ptychography.object_grid import from_target_grid, object_coordinates, target_coordinates, to_target_grid
from namsa.ptychography.refine import RefineSettings, refine_from_sample
from namsa.ptychography.single_slice import PtychoError, checked_stack, prepared_solver, ptycho_from_sample

pytest.importorskip("py4DSTEM")

#: few iterations: the tests check the decisions, not the converged maps
FEW = RefineSettings(convergence=ConvergenceRule(max_iterations=6))


@pytest.fixture(scope="module")
def graphite():
    """Two graphene layers (6.7 A) along [001], a weak phase object: 16 x 16 scan of 32 px patterns
    over one 7.4 x 8.5 A cell (the field of view is one period of the supercell)."""
    from namsa.config import SimulationConfig
    from namsa.simulate import simulate_sample

    cfg = SimulationConfig(cell_lateral_A=5.0, thickness_A=3.0, scan_shape=(16, 16), pattern_px=32, target_px=32,
                           sampling_A=0.1, semiangle_mrad=25.0, energy_kv=200.0, workers=2)
    return simulate_sample("C-graphite", (0, 0, 1), cfg)


def _blind(sample, **truth):
    """The stack and its calibrations with the given truth arrays (none: no truth at all)."""
    return SimpleNamespace(cbed=sample.cbed, meta=sample.meta, **truth)


def test_the_refinement_never_reads_the_truth(graphite):
    start = np.random.default_rng(1).normal(100.0, 20.0, graphite.potential.shape).astype(np.float32)
    honest = refine_from_sample(_blind(graphite, potential=graphite.potential, density=graphite.density), start, FEW)
    nan = np.full_like(graphite.potential, np.nan)
    poisoned = refine_from_sample(_blind(graphite, potential=nan, density=np.random.default_rng(2).random(nan.shape)),
                                  start, FEW)
    absent = refine_from_sample(_blind(graphite), start, FEW)
    assert not honest.kept_network
    for other in (poisoned, absent):
        np.testing.assert_array_equal(other.potential, honest.potential)
        assert (other.start_error, other.final_error, other.errors) == \
            (honest.start_error, honest.final_error, honest.errors)


def test_specimens_from_refine_below_A_on_keep_the_networks_map(graphite):
    """At least refine_below_A thick (default 50 A): the network's map comes back unrefined, saying why;
    below it, or with no cut (None) or no known thickness, the stack is refined."""
    start = np.random.default_rng(1).normal(100.0, 20.0, graphite.potential.shape).astype(np.float32)
    thick = SimpleNamespace(cbed=graphite.cbed, meta=graphite.meta.replace(thickness_A=80.0))
    kept = refine_from_sample(thick, start, FEW)
    np.testing.assert_array_equal(kept.potential, start)
    assert kept.kept_network and kept.iterations == 0 and "80 A thick, not below refine_below_A=50 A" in kept.skipped
    assert RefineSettings().too_thick(graphite.meta) is None and RefineSettings().too_thick(graphite.meta.replace(thickness_A=None)) is None
    refined = refine_from_sample(thick, start, FEW.model_copy(update={"refine_below_A": None}))
    assert not refined.kept_network and refined.skipped is None and refined.iterations > 0
    assert not refine_from_sample(_blind(graphite), start, FEW).kept_network   # 6.7 A: refined


def test_a_strong_phase_keeps_the_networks_map(graphite):
    """A network map spanning max_phase_rad (default 0.75 rad) or more is not refined; None refines it."""
    from namsa.constants import interaction_constant

    sigma = interaction_constant(float(graphite.meta.energy_kv))
    weak = graphite.potential - graphite.potential.min()
    strong = (weak * (2.0 / (sigma * float(np.ptp(weak))))).astype(np.float32)   # spans 2 rad
    assert sigma * np.ptp(weak) < 0.75 and RefineSettings().too_strong(weak, graphite.meta) is None   # graphite: weak
    kept = refine_from_sample(_blind(graphite), strong, FEW)
    np.testing.assert_array_equal(kept.potential, strong)
    assert kept.kept_network and "spans 2.00 rad of phase, not below max_phase_rad=0.75" in kept.skipped
    assert refine_from_sample(_blind(graphite), strong, FEW.model_copy(update={"max_phase_rad": None})).skipped is None


def test_the_prior_weight_keeps_the_refined_map_nearer_the_networks(graphite):
    """prior_weight w pulls the object back towards the start after every iteration: from the same
    start, the larger w, the nearer the refined map stays to it; the data error still decides (the
    refined map is kept only where its data error is below the start's)."""
    start = np.random.default_rng(1).normal(100.0, 20.0, graphite.potential.shape).astype(np.float32)
    distances = []
    for weight in (0.0, 0.3, 0.7):
        settings = FEW.model_copy(update={"prior_weight": weight})
        result = refine_from_sample(_blind(graphite), start, settings)
        assert not result.kept_network and result.final_error <= result.start_error
        distances.append(float(np.linalg.norm(result.potential - start)))
    assert distances[0] > distances[1] > distances[2] > 0, distances
    with pytest.raises(ValueError, match="prior_weight"):
        RefineSettings(prior_weight=1.0)


def test_a_converged_start_is_not_made_worse_and_keeps_the_network_mean(graphite):
    converged = ptycho_from_sample(_blind(graphite), output_shape=graphite.potential.shape,
                                   convergence=ConvergenceRule(max_iterations=24))
    start = converged.potential + np.float32(150.0)     # a mean the data cannot see
    result = refine_from_sample(_blind(graphite), start, FEW)
    assert np.isfinite(result.start_error) and result.final_error <= result.start_error
    assert not result.kept_network and result.iterations == 6 and result.n_slices == 1
    assert result.potential.dtype == np.float32 and result.potential.shape == start.shape
    assert result.potential.mean(dtype=np.float64) == pytest.approx(start.mean(dtype=np.float64), rel=1e-6)
    assert result.seconds > 0 and len(result.errors) == 6


@pytest.mark.parametrize("kind", ["zeros", "noise"])
def test_a_bad_start_is_refined_towards_a_lower_data_error(graphite, kind):
    shape = graphite.potential.shape
    start = (np.zeros(shape) if kind == "zeros" else np.random.default_rng(3).normal(80.0, 30.0, shape))
    result = refine_from_sample(_blind(graphite), start.astype(np.float32), FEW)
    assert not result.kept_network and result.final_error < 0.5 * result.start_error
    assert np.abs(result.potential - result.potential.mean()).max() > 1.0   # structure appeared (V * Angstrom)
    assert result.potential.mean() == pytest.approx(start.mean(), abs=1e-3)


def test_a_refinement_that_raises_the_error_returns_the_network_map(graphite):
    start = np.random.default_rng(4).normal(100.0, 20.0, graphite.potential.shape).astype(np.float32)
    wild = RefineSettings(convergence=ConvergenceRule(step_size=1e4, min_step_size=1e4, max_iterations=3))
    result = refine_from_sample(_blind(graphite), start, wild)
    assert result.kept_network and not result.final_error <= result.start_error   # larger, or NaN: diverged
    np.testing.assert_array_equal(result.potential, start)


def test_thick_specimens_get_multislice_with_the_start_split_over_the_slices():
    from namsa.config import SimulationConfig
    from namsa.simulate import simulate_sample

    cfg = SimulationConfig(cell_lateral_A=5.0, thickness_A=30.0, scan_shape=(8, 8), pattern_px=32, target_px=32,
                           sampling_A=0.1, semiangle_mrad=25.0, energy_kv=200.0, workers=2)
    si = simulate_sample("Si-diamond", (0, 0, 1), cfg)
    settings = RefineSettings(multislice_from_A=20.0, max_slice_A=12.0, convergence=ConvergenceRule(max_iterations=3))
    start = np.zeros(si.potential.shape, np.float32)
    result = refine_from_sample(_blind(si), start, settings)
    assert result.n_slices == 3 and result.iterations == 3 and np.isfinite(result.final_error)
    assert RefineSettings().slices(si.meta) == (1, si.meta.thickness_A)     # below 100 A: single-slice
    assert RefineSettings().slices(si.meta.replace(thickness_A=None))[0] == 1   # thickness unknown: single-slice


def test_the_start_goes_onto_the_object_grid_and_reads_back(graphite):
    """target -> object (`target_coordinates`, `from_target_grid`) is the inverse of the read-back
    (`object_coordinates`, `to_target_grid`) for a smooth periodic map; with the mean fill the
    padding beyond the field holds the mean."""
    import py4DSTEM.process.phase as phase

    meta = graphite.meta
    cbed4d, positions = checked_stack(graphite)
    solver = prepared_solver(phase.SingleslicePtychography, meta, cbed4d, positions)
    shape = graphite.potential.shape
    yy, xx = np.meshgrid(np.arange(shape[0]) / shape[0], np.arange(shape[1]) / shape[1], indexing="ij")
    image = 50.0 + 10.0 * np.cos(2 * np.pi * yy) * np.sin(4 * np.pi * xx)
    solver_A = np.asarray(solver.positions)
    coords = target_coordinates(meta, shape, solver._object_shape, positions, solver_A, solver.sampling)
    back_coords = object_coordinates(meta, shape, positions, solver_A, solver.sampling)
    for periodic in (True, False):
        on_object = from_target_grid(image, coords, solver.sampling, meta, periodic)
        back = to_target_grid(on_object, back_coords, solver.sampling, meta, shape)
        inner = (slice(2, -2), slice(2, -2))
        assert np.abs(back - image)[inner].max() < 0.05 * np.ptp(image)
    outside = (coords[0] < -3) | (coords[1] < -3)          # a few target pixels beyond the field
    assert outside.any()
    # the cubic spline's tail reaches a little beyond the edge: within 1 % of the map's range
    np.testing.assert_allclose(on_object[outside], image.mean(), atol=0.01 * np.ptp(image))


def test_the_fill_beyond_the_field_follows_the_field_of_view(graphite):
    assert RefineSettings().periodic(graphite.meta)                         # one whole period of the cell
    tile = graphite.meta.replace(cell_A=None)                               # a microscope tile: unknown
    assert not RefineSettings().periodic(tile)
    part = graphite.meta.replace(fov_A=(0.0, 0.0, 4.0, 4.0))               # a part of the cell
    assert not RefineSettings().periodic(part)
    assert RefineSettings(outside="periodic").periodic(tile) and not RefineSettings(outside="mean").periodic(graphite.meta)


@pytest.mark.parametrize("case, match", [
    ("3d", "one \\(T, T\\) map"), ("nan", "non-finite"), ("meta", "missing: energy_kv"),
])
def test_bad_refinement_input_is_one_line(graphite, case, match):
    start = np.zeros(graphite.potential.shape, np.float32)
    sample = _blind(graphite)
    if case == "3d":
        start = start[None]
    elif case == "nan":
        start[3, 3] = np.nan
    else:
        sample = SimpleNamespace(cbed=graphite.cbed, meta=graphite.meta.replace(energy_kv=None))
    with pytest.raises(PtychoError, match=match) as info:
        refine_from_sample(sample, start, FEW)
    assert "\n" not in str(info.value)


def test_evaluation_gets_the_raw_map_at_the_targets_resolution_and_a_record(graphite):
    from evaluation.baselines.refined import refined_from_network
    from namsa.targets import to_target_resolution

    start = np.zeros(graphite.potential.shape, np.float32)
    raw, record = refined_from_network(FEW, _blind(graphite), start)
    direct = refine_from_sample(_blind(graphite), start, FEW)
    expected = to_target_resolution(direct.potential, graphite.meta.fov_A, graphite.meta.target_fwhm_A)
    np.testing.assert_allclose(raw, expected, rtol=1e-5, atol=1e-4)
    assert set(record) == {"seconds", "start_error", "final_error", "error", "iterations", "converged",
                           "kept_network", "n_slices", "skipped"}
    assert record["error"] == record["final_error"] == direct.final_error and not record["kept_network"]
    wild = RefineSettings(convergence=ConvergenceRule(step_size=1e4, min_step_size=1e4, max_iterations=2))
    kept, record = refined_from_network(wild, _blind(graphite), start + np.float32(7.0))
    assert record["kept_network"] and record["error"] == record["start_error"]
    np.testing.assert_array_equal(kept, start + np.float32(7.0))   # the network's map, not smoothed again


# ---- Reconstructor.predict(refine=...) and `namsa reconstruct --refine` on the tiny trained model ----

@pytest.fixture(scope="module")
def tiny(tiny_trained_model, tiny_sim_config):  # noqa: F811
    """(model dir, reconstructor, a GaAs [011] sample with the tiny data's physics: 8 x 8 scan, 16 px)."""
    import models
    import namsa

    rec = models.load_reconstructor(tiny_trained_model.model_dir, device="cpu")
    return tiny_trained_model.model_dir, rec, namsa.simulate_sample("GaAs-zincblende", (0, 1, 1), tiny_sim_config)


def test_predict_refines_each_potential_from_its_own_stack(tiny):
    _, rec, sample = tiny
    plain = rec.predict(sample.cbed)
    refined = rec.predict(sample.cbed, refine=FEW, refine_meta=sample.meta)
    (result,) = rec.last_refinement
    direct = refine_from_sample(_blind(sample), plain[rec.targets.index("potential")], FEW)
    np.testing.assert_array_equal(refined[rec.targets.index("potential")], direct.potential)
    assert result.start_error == direct.start_error and result.kept_network == direct.kept_network
    batch = rec.predict(np.stack([sample.cbed, sample.cbed]), refine=FEW, refine_meta=[sample.meta, sample.meta])
    assert batch.shape == (2, *plain.shape) and len(rec.last_refinement) == 2
    # the network's batch of two rounds differently from a batch of one: close, not bit-equal
    np.testing.assert_allclose(batch[1], refined, rtol=1e-4, atol=1e-4 * float(np.abs(refined).max()))
    rec.predict(sample.cbed)
    assert rec.last_refinement == []


def test_predict_refine_requests_without_what_they_need_are_one_line(tiny):
    import torch

    from models.fcdensenet import FCDenseNet
    from models.reconstructor import Reconstructor, ReconstructorInputError

    _, rec, sample = tiny
    meta_without_dk = sample.meta.replace(pattern_dk_inv_A=None, pattern_mrad_per_px=None)
    cases = [(dict(refine=True), "pass refine_meta="),
             (dict(refine=True, refine_meta=[sample.meta, sample.meta]), "2 metas for 1 stacks"),
             (dict(refine=True, refine_meta=meta_without_dk), "lacks the calibrations pattern_dk_inv_A"),
             (dict(refine=True, refine_meta=sample.meta.to_json()), "refine_meta\\[0\\] is a dict, not a sample's meta"),
             (dict(refine="yes", refine_meta=sample.meta), "refine must be True, False or")]
    for kwargs, match in cases:
        with pytest.raises(ReconstructorInputError, match=match) as info:
            rec.predict(sample.cbed, **kwargs)
        assert "\n" not in str(info.value)
    density_card = rec.card.model_copy(update={"targets": ["density"]})
    density_only = Reconstructor(FCDenseNet(rec.model.arch), density_card, torch.device("cpu"))
    with pytest.raises(ReconstructorInputError, match="predicts only density"):
        density_only.predict(sample.cbed, refine=True, refine_meta=sample.meta)


def test_reconstruct_refine_end_to_end_records_every_tile(tiny, tmp_path):
    """A simulated scan written as .hspy, reconstructed with --refine: the potential is the model's
    tile refined with the tile's calibration (the same as predict(refine=...) with that meta), and
    reconstruction.json says what the refinement did."""
    pytest.importorskip("rsciio")
    from microscope_helpers import write_hspy
    from namsa.optics import scan_positions
    from namsa.sample_meta import SampleMeta
    from workflow.cli import main

    model_dir, rec, sample = tiny
    meta = sample.meta
    sy, sx = meta.scan_shape
    step = meta.scan_step_A
    path = write_hspy(tmp_path / "scan.hspy", sample.cbed.reshape(sy, sx, *sample.cbed.shape[1:]), step_A=step[0],
                      dk_inv_A=meta.pattern_dk_inv_A, energy_kv=meta.energy_kv,
                      semiangle_mrad=meta.semiangle_mrad)
    out = tmp_path / "out"
    assert main(["reconstruct", str(path), "--model", str(model_dir), "--out", str(out),
                 "--scan-step-a", f"{step[0]!r},{step[1]!r}", "--refine"]) == 0
    info = json.loads((out / "reconstruction.json").read_text())
    (tile,) = info["refinement"]["tiles"]
    assert tile["origin_yx"] == [0, 0] and tile["n_slices"] == 1 and tile["seconds"] > 0
    assert {"start_error", "final_error", "iterations", "kept_network", "converged"} <= set(tile)
    assert info["refinement"]["probe_start_aberrations"] == {"C1_A": 0.0, "C3_mm": 0.0}
    fov = (0.0, 0.0, sy * step[0], sx * step[1])
    tile_meta = SampleMeta(scan_shape=(sy, sx), fov_A=fov,
                           scan_positions_A=tuple(map(tuple, scan_positions(fov, (sy, sx)).tolist())),
                           energy_kv=meta.energy_kv, semiangle_mrad=meta.semiangle_mrad,
                           pattern_dk_inv_A=meta.pattern_dk_inv_A, aberrations={"C1_A": 0.0, "C3_mm": 0.0})
    expected = rec.predict(sample.cbed, refine=True, refine_meta=tile_meta)[rec.targets.index("potential")]
    assert rec.last_refinement[0].start_error == pytest.approx(tile["start_error"], rel=1e-5)
    got = np.load(out / "potential.npy")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * float(np.abs(expected).max()))


def test_the_data_error_of_a_start_is_the_error_of_a_first_iteration_before_its_update(graphite):
    """`data_error` (one forward pass, nothing changed) equals what py4DSTEM's reconstruct reports for a
    first iteration run as one batch, whose error is taken before the update; and it changes nothing."""
    import py4DSTEM.process.phase as phase

    from namsa.ptychography.refine import data_error

    cbed4d, positions = checked_stack(graphite)
    solver = prepared_solver(phase.SingleslicePtychography, graphite.meta, cbed4d, positions)
    before = data_error(solver, 64)
    assert data_error(solver, 64) == before
    solver.reconstruct(num_iter=1, max_batch_size=None, reset=True, progress_bar=False, object_positivity=False)
    assert solver.error == pytest.approx(before, rel=1e-5)
    assert data_error(solver, 64) < before          # the update lowered it
