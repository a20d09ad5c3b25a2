"""Every shipped reconstructor against its own card: a few of its held-out samples re-made from
scratch (simulated from their ids with the card's physics, stored as its data were) and scored by the
project's evaluator must give the card's per-sample figures. Catches weights, normalisation,
simulation or scoring drifting away from what the card claims."""
from __future__ import annotations

import json

import pytest

from evaluation.views import LEGACY
from models import pretrained_names

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", pretrained_names())
def test_a_shipped_model_scores_its_cards_figures_on_re_simulated_held_out_samples(tmp_path, name):
    import namsa
    import stage
    from evaluation import EvaluationConfig, evaluate
    from models import pretrained_card
    from namsa.material_id import parse_sample_id

    card = pretrained_card(name)
    checks = card.check_samples
    assert checks, f"pretrained:{name} has no check_samples: publish it with namsa publish"
    cfg, data_cfg = card.simulation_config, card.data_config   # typed; portable: no machine fields
    with stage.StoreWriter(tmp_path / "data" / "store-0", config_hash=cfg.physics_hash(), data_cfg=data_cfg) as writer:
        for check in checks:
            material_id, zone_axis, variant = parse_sample_id(check.sample_id)
            sample = namsa.simulate_sample(material_id, zone_axis, cfg, variant=variant)
            assert sample.meta.sample_id == check.sample_id   # the same physics hash: the same sample
            writer.put(sample)
    # the card's figures were made with or without symmetry averaging (cards before it: the single pass)
    averaged = card.held_out_evaluation.symmetry_average if card.held_out_evaluation else False
    eval_cfg = EvaluationConfig(split="all", mean_baseline=False, n_bootstrap=0, n_panels=0, worst_k=0,
                                symmetry_average=averaged)
    result = evaluate(eval_cfg, data_cfg, [tmp_path / "data"], f"pretrained:{name}", tmp_path / "eval")
    scored = {s["sample_id"]: s for s in json.loads(result.metrics_json.read_text())["samples"]}
    for check in checks:
        for target, expected in check.network_rel_l2.items():
            # the card's figures are the network as predicted: the legacy view's (no mean taken from the truth)
            got = scored[check.sample_id]["metrics"][target]["network"][LEGACY]["rel_l2"]
            assert got == pytest.approx(expected, rel=0.02, abs=2e-3), (check.sample_id, target)
