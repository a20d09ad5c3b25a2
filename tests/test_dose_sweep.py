"""evaluation.doses: the network and the baselines scored again on the same shot-noised patterns."""
from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from evaluation import EvaluationConfig, evaluate
from evaluation.dose_sweep import NoisyStores


def test_noisy_stores_draw_poisson_counts_reproducibly_per_dose(tiny_data_dir):
    import stage

    with stage.open_stores([tiny_data_dir]) as stores:
        clean = stores[0]
        area = clean.meta.scan_step_area_A2
        a, b = NoisyStores(stores, 1e3, seed=0)[0], NoisyStores(stores, 1e3, seed=0)[0]
        other_dose, other_seed = NoisyStores(stores, 1e4, seed=0)[0], NoisyStores(stores, 1e3, seed=1)[0]
    assert np.array_equal(a.cbed, b.cbed)                       # every method sees the same noisy data
    assert not np.array_equal(a.cbed, other_dose.cbed) and not np.array_equal(a.cbed, other_seed.cbed)
    counts = a.cbed.astype(np.float64) * 1e3 * area
    assert np.allclose(counts, np.round(counts), atol=1e-2)    # whole electrons
    expected = clean.cbed.astype(np.float64).sum(axis=(1, 2)) * 1e3 * area
    got = counts.sum(axis=(1, 2))
    # Poisson: the total per pattern scatters about the expected count with variance = mean
    z = (got - expected) / np.sqrt(expected)
    assert abs(z.mean()) < 4 / np.sqrt(len(z)) + 0.05 and 0.6 < z.std() < 1.4
    assert a.meta.dose_e_per_A2 == 1e3 and clean.meta.dose_e_per_A2 is None


def test_evaluate_scores_every_dose_on_the_same_noisy_data(tiny_trained_model, tiny_data_dir, tmp_path):  # noqa: F811
    import stage
    from workflow.summary import headline_lines

    cfg = EvaluationConfig(n_bootstrap=20, n_panels=0, worst_k=0, doses=[30.0, 1e7])
    result = evaluate(cfg, stage.DataConfig(), [tiny_data_dir], tiny_trained_model.model_dir, tmp_path / "eval")
    sweep = json.loads(result.metrics_json.read_text())["dose_sweep"]
    assert [e["dose_e_per_A2"] for e in sweep] == [30.0, 1e7] and sweep == result.dose_sweep
    low, high = (e["headline"]["potential"] for e in sweep)
    clean = result.headline["potential"]
    assert set(low) == set(clean) == {"network", "mean", "icom"}
    low, high, clean = ({m: v["field"] for m, v in scores.items()} for scores in (low, high, clean))
    # at 1e7 e/A^2 the noise is negligible; at 30 e/A^2 it spoils the centre of mass
    assert high["network"]["rel_l2"] == pytest.approx(clean["network"]["rel_l2"], rel=0.05)
    assert low["icom"]["rel_l2"] > high["icom"]["rel_l2"]
    assert low["mean"]["rel_l2"] == pytest.approx(clean["mean"]["rel_l2"])   # the mean image ignores the data
    assert all("icom" in e["verdicts"]["potential"] for e in sweep)
    assert "On shot-noised patterns" in result.report_html.read_text()
    lines = headline_lines(result.headline, result.verdicts, result.dose_sweep)
    assert any(line.startswith("  at 30 e/A^2 (potential rel. L2, field's rule): network ") for line in lines)


def test_doses_must_be_positive_and_finite():
    for bad in ([0.0], [-1e3], [float("inf")]):
        with pytest.raises(ValidationError):
            EvaluationConfig(doses=bad)
    assert EvaluationConfig().doses == []
