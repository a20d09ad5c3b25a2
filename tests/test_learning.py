"""The reconstructor learns: trained on a small generated set, it beats the mean image on
held-out materials (slow: real simulation of ~100 samples and a few hundred CPU training steps)."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_scan_layout_trained_on_generated_materials_beats_the_mean_image(tmp_path):
    import models
    import namsa
    import stage
    from models.distributed import DistributedConfig
    from evaluation import EvaluationConfig, evaluate
    from workflow import data_runners
    from workflow.config import PipelineConfig

    cfg = PipelineConfig(
        simulation=dict(materials=[], generator={"count": 56, "seed": 11}, zone_axes=[[0, 0, 1], [0, 1, 1]],
                        scan_shape=(16, 16), pattern_px=16, target_px=16, cell_lateral_A=8.0, thickness_A=16.0,
                        sampling_A=0.16),
        data=dict(split_fractions=(0.7, 0.1, 0.2), split_seed=1, num_workers=0),
        model=dict(preset="scan", in_channels=256, pattern_bins=8),
        training=dict(optimizer="adam", lr0=2e-3, max_steps=250, batch_size=8, eval_every=50,
                      checkpoint_every=250, device="cpu", progress=False, tensorboard=False),
        evaluation=dict(n_bootstrap=200, n_panels=1, worst_k=1))
    data = tmp_path / "data"
    data_runners.simulate(cfg, data, progress=False)
    result = models.train(cfg.model, cfg.training, DistributedConfig(), cfg.data, [data], tmp_path / "train")
    ev = evaluate(cfg.evaluation, cfg.data, [data], result.model_dir, tmp_path / "eval")
    doc = json.loads(ev.metrics_json.read_text())
    agg = doc["aggregates"]["potential"]
    net, mean = agg["network"]["field"]["rel_l2"], agg["mean"]["field"]["rel_l2"]
    assert ev.n_samples >= 12                                # held-out materials x 2 zone axes
    assert net["high"] < mean["low"], (net, mean)           # better, with non-overlapping 95% intervals
    assert agg["network"]["field"]["pearson_r"]["value"] > agg["mean"]["field"]["pearson_r"]["value"]
