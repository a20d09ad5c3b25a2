"""Fresh samples of the same plan (`simulation.first_variant`): a later device call of the GPU study
simulates variants its flagship never trained on, of the same materials, zone axes and prototype splits,
with the same config hash (issue 41, item 3: "fresh means new generated materials or variants each call,
with splits still by prototype and the same split seed")."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from namsa import SimulationConfig, simulate_sample
from namsa.plan import plan_samples

MATERIALS = ["Si-diamond", "NaCl-rocksalt"]


def _config(**fields) -> SimulationConfig:
    return SimulationConfig(scan_shape=(4, 4), pattern_px=16, target_px=16, cell_lateral_A=8.0, thickness_A=16.0,
                            sampling_A=0.25, materials=MATERIALS, zone_axes=[(0, 0, 1)],
                            variations={"thickness_range_A": (10.0, 40.0), "defocus_range_A": (-40.0, 40.0)},
                            **fields)


def test_a_later_first_variant_plans_other_samples_of_the_same_materials_and_splits():
    first, later = _config(variants=2), _config(variants=2, first_variant=2)
    assert first.physics_hash() == later.physics_hash()   # the same physics: ids comparable, stores mergeable
    before, after = plan_samples(first).specs, plan_samples(later).specs
    assert [s.variant for s in before] == [0, 1, 0, 1] and [s.variant for s in after] == [2, 3, 2, 3]
    # the same materials and axes: the split, a function of a material (or its prototype) alone, is the same
    assert [(s.material_id, s.zone_axis) for s in before] == [(s.material_id, s.zone_axis) for s in after]


def test_a_fresh_variant_is_another_specimen():
    cfg = _config()
    old = simulate_sample("Si-diamond", (0, 0, 1), cfg, variant=0)
    new = simulate_sample("Si-diamond", (0, 0, 1), cfg.model_copy(update={"first_variant": 1}), variant=1)
    assert new.meta.sample_id != old.meta.sample_id and new.meta.sample_id.endswith(cfg.physics_hash()[:12])
    assert new.meta.thickness_A != old.meta.thickness_A
    assert new.meta.aberrations["C1_A"] != old.meta.aberrations["C1_A"]


def test_first_variant_without_variations_is_refused_in_one_line():
    with pytest.raises(ValidationError, match="with every variation off all variants are one sample"):
        SimulationConfig(sampling_A=0.25, materials=MATERIALS, first_variant=1)
