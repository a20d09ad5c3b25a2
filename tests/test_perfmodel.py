"""Performance model (alpha-beta fit, You et al. predictor, coordination cost, paper scaling)
and the tuning grid search."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from models.distributed import DistributedConfig
from models.distributed import perfmodel as pm


def test_fit_recovers_alpha_beta_from_ring_timings():
    truth = pm.AlphaBeta(alpha_s=30e-6, beta_s_per_B=1 / 2e9)
    samples = [(p, n, truth.ring_allreduce(n, p)) for p in (2, 3, 4, 8) for n in (1e3, 1e5, 1e7)]
    fit, err = pm.fit_alpha_beta(samples)
    assert fit.alpha_s == pytest.approx(truth.alpha_s, rel=1e-6)
    assert fit.beta_s_per_B == pytest.approx(truth.beta_s_per_B, rel=1e-6)
    assert err < 1e-9


def test_collective_costs_follow_the_textbook_formulas():
    link = pm.AlphaBeta(1e-6, 1e-9)
    assert link.ring_allreduce(1e6, 4) == pytest.approx(6e-6 + 1.5e6 * 1e-9)
    assert link.tree_allreduce(1e6, 4) == pytest.approx(4 * (1e-6 + 1e-3))
    assert link.allreduce(8, 1024) == link.tree_allreduce(8, 1024)  # tiny messages: latency-bound tree
    assert link.ring_allreduce(1e6, 1) == 0


def test_linear_step_model_recovers_theta():
    rng = np.random.default_rng(0)
    x1, x2 = rng.uniform(0.01, 0.1, 12), rng.uniform(0.001, 0.05, 12)
    model = pm.LinearStepModel.fit(x1, x2, 0.002 + 1.1 * x1 + 0.7 * x2)
    np.testing.assert_allclose(model.theta, (0.002, 1.1, 0.7), atol=1e-9)


def _synthetic_runs(theta=(0.002, 1.1, 0.7), cores=2, noise=0.0):
    """Runs generated from a known theta on the same grid the benchmark measures."""
    rng = np.random.default_rng(1)
    link = pm.AlphaBeta(200e-6, 1.3e-9)
    runs = []
    for width in (16, 32, 48, 64, 96):
        for batch in (2, 6):
            t1 = 2e-4 * width * batch
            for ranks in (1, 2, 3, 4):
                x1, x2 = pm.step_features(t1, ranks, width * 4000, link, cores)
                t = theta[0] + theta[1] * x1 + theta[2] * x2 if ranks > 1 else t1
                runs.append({"width": width, "batch": batch, "ranks": ranks, "x1": x1, "x2": x2,
                             "t": t * (1 + noise * rng.standard_normal())})
    return runs


def test_step_features_scale_compute_by_ranks_per_core():
    link = pm.AlphaBeta(1e-4, 1e-9)
    assert pm.step_features(0.01, 2, 1e6, link, cores=2) == (0.01, link.ring_allreduce(1e6, 2))
    # 3 ranks on 2 cores: one core time-slices 2 ranks and the synchronous step waits for them.
    assert pm.step_features(0.01, 3, 1e6, link, cores=2)[0] == pytest.approx(0.02)
    assert pm.step_features(0.01, 4, 1e6, link, cores=2)[0] == pytest.approx(0.02)
    assert pm.step_features(0.01, 1, 1e6, link, cores=2)[1] == 0


def test_held_out_rule_is_fixed_by_width_position_not_by_outcome():
    assert pm.held_out_widths([96, 16, 48, 32, 64, 16]) == {32, 64}
    runs = _synthetic_runs()
    fit, held = pm.split_runs(runs, "width", cores=2)
    assert {r["width"] for r in held} == {32, 64} and {r["width"] for r in fit} == {16, 48, 96}
    assert all(r["ranks"] == 2 for r in fit + held)  # dedicated cores only; P=1 supplies x1
    fit, held = pm.split_runs(runs, "width-all", cores=2)
    assert len(held) == 12 and len(fit) == 18 and min(r["ranks"] for r in fit + held) == 2
    fit, held = pm.split_runs(runs, "max-ranks", cores=2)
    assert {r["ranks"] for r in held} == {4} and {r["ranks"] for r in fit} == {2, 3}
    # The split depends only on the configuration: measured times do not move it.
    noisy = _synthetic_runs(noise=0.5)
    assert [(r["width"], r["batch"], r["ranks"]) for r in pm.split_runs(noisy, "width", 2)[1]] == \
        [(r["width"], r["batch"], r["ranks"]) for r in pm.split_runs(runs, "width", 2)[1]]
    with pytest.raises(ValueError, match="unknown held-out rule"):
        pm.split_runs(runs, "best-looking", 2)


@pytest.mark.parametrize("rule", ["width", "width-all", "max-ranks"])
def test_fit_and_judge_recovers_theta_and_predicts_held_out_runs(rule):
    result = pm.fit_and_judge(_synthetic_runs(), rule, cores=2)
    np.testing.assert_allclose(result["theta"], (0.002, 1.1, 0.7), rtol=1e-6, atol=1e-9)
    assert result["mape"] < 1e-9 and result["max"] < 1e-9
    assert result["n"] == sum(not r["in_fit"] for r in result["rows"])


def test_noisy_runs_give_a_held_out_error_of_the_noise_size():
    result = pm.fit_and_judge(_synthetic_runs(noise=0.05), "width-all", cores=2)
    assert 0.005 < result["mape"] < 0.15 and result["max"] >= result["mape"]


def test_prediction_errors_are_mape_and_max():
    errors = pm.prediction_errors([1.0, 2.0, 4.0], [1.1, 1.8, 4.0])
    assert errors["mape"] == pytest.approx((0.1 + 0.1 + 0.0) / 3)
    assert errors["max"] == pytest.approx(0.1) and errors["n"] == 3


def test_master_worker_breaks_down_before_27600_ranks_and_bitvector_does_not():
    rows = pm.coordination_table(27_600)
    assert rows[-1]["ranks"] == 27_600
    budget = 5e-3
    broken = pm.breakdown_rank(rows, budget)
    assert broken is not None and broken < 27_600
    assert all(r["bitvector_s"] < budget for r in rows)
    # Linear vs logarithmic growth from 1,024 to 16,384 ranks (16x).
    by = {r["ranks"]: r for r in rows}
    assert by[16384]["master_worker_s"] / by[1024]["master_worker_s"] > 12
    assert by[16384]["bitvector_s"] / by[1024]["bitvector_s"] < 1.5


def test_paper_scaling_prediction():
    rows = pm.paper_scaling()
    assert [r["gpus"] for r in rows] == [6, 48, 384, 3072, 27_600]
    assert rows[0]["compute_s"] == pytest.approx(5.1510e13 / 59.67e12)
    eff = [r["efficiency_bitvector"] for r in rows]
    assert all(0 < e <= 1 for e in eff) and eff == sorted(eff, reverse=True)
    assert rows[-1]["efficiency_master_worker"] < rows[-1]["efficiency_bitvector"]
    # Full overlap of communication with backward hides it completely at this compute/comm ratio.
    assert all(math.isclose(r["efficiency_bitvector"], 1.0) for r in pm.paper_scaling(overlap=1.0))


def namsa(argv: list[str]) -> int:
    """`namsa perfmodel ARGV`, in process."""
    from workflow.cli import main

    return main(["perfmodel", *argv])


def test_cli_scaling_predicts_your_own_job(capsys):
    """A measured single-GPU step and a preset's gradient size on your links, not the paper's."""
    assert pm.preset_parameters("small") == 3_045_088
    argv = ["scaling", "--preset", "small", "--step-s", "0.05", "--gpus-per-node", "4", "--nodes", "1", "8", "64",
            "--bandwidth", "12.5e9", "--grad-bytes", "4"]
    assert namsa(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("3,045,088 parameters x 4 B per gradient, 4 GPUs per node, single-GPU step 0.05 s")
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    inter, intra = pm.AlphaBeta.from_bandwidth(2e-6, 12.5e9), pm.AlphaBeta.from_bandwidth(5e-6, 50e9)
    for row, nodes in zip(rows, (1, 8, 64)):
        assert float(row[2]) == 0.05
        assert float(row[3]) == pytest.approx(pm.hierarchical_allreduce(3_045_088 * 4, nodes, 4, intra, inter), abs=1e-4)
    eff = [float(r[6]) for r in rows]
    assert eff == sorted(eff, reverse=True) and eff[0] < 1
    with pytest.raises(SystemExit):
        namsa(["scaling", "--preset", "small", "--params", "10"])


def test_cli_coordination_writes_figure(tmp_path, capsys):
    assert namsa(["coordination", "--plot", str(tmp_path / "coord.png")]) == 0
    assert (tmp_path / "coord.png").stat().st_size > 1000
    assert "master-worker exceeds the 5 ms cycle at" in capsys.readouterr().out


def test_cli_reads_a_link_fit_and_refuses_another_file_in_one_line(tmp_path, capsys):
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps({"alpha_s": 1e-5, "beta_s_per_B": 1e-9}))
    assert namsa(["coordination", "--fit", str(fit), "--max-ranks", "64"]) == 0
    rows = pm.coordination_table(64, 7, pm.AlphaBeta(1e-5, 1e-9))
    assert capsys.readouterr().out.startswith(pm.markdown_table(rows, pm.COORDINATION_COLUMNS, pm.COORDINATION_FORMATS))
    fit.write_text(json.dumps({"alpha_s": 1e-5}))
    assert namsa(["coordination", "--fit", str(fit)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"namsa: error: {fit} is not a link fit" in err


@pytest.mark.distributed
def test_measured_allreduce_fit_on_gloo():
    from models.distributed.measure import measure_allreduce

    samples = measure_allreduce([4e3, 4e5], [2, 3], repeats=3)
    assert len(samples) == 4 and all(t > 0 for *_, t in samples)
    assert sorted((p, n) for p, n, _ in samples) == [(2, 4e3), (2, 4e5), (3, 4e3), (3, 4e5)]
    fit, mean_rel_error = pm.fit_alpha_beta(samples)
    # Timings on a shared machine are too noisy to say what alpha and beta must be, so check
    # what the fit promises on them: its error figure is the real one, and no feasible
    # (non-negative) step away from (alpha, beta) lowers the relative squared residual.
    def residual(alpha: float, beta: float) -> float:
        model = pm.AlphaBeta(alpha, beta)
        return sum(((model.ring_allreduce(n, p) - t) / t) ** 2 for p, n, t in samples)

    errors = [abs(fit.ring_allreduce(n, p) - t) / t for p, n, t in samples]
    assert mean_rel_error == pytest.approx(sum(errors) / len(errors))
    best = residual(fit.alpha_s, fit.beta_s_per_B)
    for da, db in ((1, 0), (-1, 0), (0, 1), (0, -1), (1, -1), (-1, 1)):
        alpha = fit.alpha_s * (1 + 0.05 * da) if fit.alpha_s else 1e-6 * max(da, 0)
        beta = fit.beta_s_per_B * (1 + 0.05 * db) if fit.beta_s_per_B else 1e-11 * max(db, 0)
        assert residual(alpha, beta) >= best * (1 - 1e-9), (fit, samples, da, db)


@pytest.mark.distributed
def test_grid_search_writes_settings_the_config_applies(tmp_path):
    from models.distributed.measure import BenchProblem
    from models.distributed.tuning import grid_search

    grid = {"ddp": [{"bucket_mb": 0.01}, {"bucket_mb": 4.0}],
            "grouped": [{"grouping": "chunks", "group_count": 1}, {"grouping": "chunks", "group_count": 3}]}
    result = grid_search(BenchProblem(width=8, depth=2, px=8), ranks=2, grid=grid, steps=2, warmup=1, log=lambda _: None)
    assert len(result["trials"]) == 4
    fastest_ddp = min((t for t in result["trials"] if t["engine"] == "ddp"), key=lambda t: t["step_s"])
    fastest_grp = min((t for t in result["trials"] if t["engine"] == "grouped"), key=lambda t: t["step_s"])
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(result))
    cfg = DistributedConfig(engine="grouped", tuned_settings=str(path)).resolved()
    assert cfg.bucket_mb == fastest_ddp["bucket_mb"] and cfg.group_count == fastest_grp["group_count"]
    assert cfg.grouping == "chunks"
