"""Shared pytest setup: GPU tests skip cleanly on machines without a CUDA device; hypothesis' fuzzing
profiles (tests/fuzzing.py) are registered before any test module builds its settings, and every
hypothesis test is marked ``fuzz`` (what `make fuzz` selects)."""
from __future__ import annotations

import pytest

from fuzzing import register_profiles

register_profiles()


def _cuda_available() -> bool:
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        try:
            import torch

            return torch.cuda.is_available()
        except Exception:
            return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.fuzz)
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU on this machine (run with -m gpu on a GPU node)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


#: materials of the shared tiny data set and the split each lands in with TINY_SPLIT (0.6/0.2/0.2,
#: seed 0): Al-fcc is dev, GaAs and CaF2 are test, the rest train.
TINY_MATERIALS = ["Si-diamond", "MgO-rocksalt", "SrTiO3-perovskite", "Cu-fcc", "Al-fcc",
                  "GaAs-zincblende", "CaF2-fluorite"]
TINY_SPLIT = (0.6, 0.2, 0.2)


@pytest.fixture(scope="session")
def tiny_sim_config():
    """A SimulationConfig small enough for CPU tests: 8x8 scan (64 patterns), 16 px patterns."""
    from namsa import SimulationConfig

    return SimulationConfig(scan_shape=(8, 8), pattern_px=16, target_px=16, cell_lateral_A=8.0,
                            thickness_A=8.0, sampling_A=0.25, materials=TINY_MATERIALS,
                            zone_axes="auto", max_zone_axes=2)


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory, tiny_sim_config):
    """A data directory holding one real store of ~14 simulated samples with material splits.

    Real namsa multislice through plan_samples/simulate_sample, written with stage.StoreWriter;
    the store lives at ``<dir>/store-0``. Treat it as read-only: it is shared by the session.
    """
    import namsa
    import stage

    root = tmp_path_factory.mktemp("tiny_data")
    cfg = tiny_sim_config
    plan = namsa.plan_samples(cfg)
    assert not plan.failures, plan.failures
    data_cfg = stage.DataConfig(cbed_dtype="float32", split_fractions=TINY_SPLIT)
    with stage.StoreWriter(root / "store-0", config_hash=cfg.physics_hash(), data_cfg=data_cfg) as writer:
        for spec in plan.specs:
            writer.put(namsa.simulate_sample(spec.material_id, spec.zone_axis, cfg, variant=spec.variant))
    return root
