"""Coordinated engines when ranks get their gradient groups ready in different orders, the
bitvector MIN fallback, and the hierarchical engine on 2 simulated nodes x 2 ranks."""
from __future__ import annotations

import numpy as np
import pytest
import torch.distributed as dist

from models.distributed import DistributedConfig, init_from_env
from models.distributed.spawn import run_local
from test_distributed_helpers import reference, run_configs, train_one

pytestmark = pytest.mark.distributed


def _shuffled_and_min(rank: int) -> dict:
    """Random per-rank readiness orders for bitvector and master_worker, and bitvector with the
    MIN fallback forced (the path taken on NCCL, which has no bitwise AND)."""
    from models.distributed.engines.overlapped import BitvectorEngine

    base = dict(timeout_s=60, grouping="chunks", group_count=6, cycle_time_ms=2.0)
    ctx = init_from_env(DistributedConfig(**base))
    out, built = {}, []

    def keep(cfg, model, x):
        built.append(BitvectorEngine(cfg, model, x))
        return built[-1]

    out["bitvector"] = train_one(DistributedConfig(engine="bitvector", **base), ctx, rank, ctx.world_size,
                                 shuffled_backward=True, engine_factory=keep)
    out["coordination_group"] = (dist.get_backend(built[0].coord_pg), built[0].coord_pg is not built[0].pg)
    out["master_worker"] = train_one(DistributedConfig(engine="master_worker", **base), ctx, rank, ctx.world_size,
                                     shuffled_backward=True)
    out["min"] = train_one(DistributedConfig(engine="bitvector", **base), ctx, rank, ctx.world_size,
                           shuffled_backward=True,
                           engine_factory=lambda c, m, x: BitvectorEngine(c, m, x, force_min=True))
    out["notices"] = list(ctx.notices)
    ctx.close()
    return out


@pytest.fixture(scope="module")
def shuffled():
    # 4 ranks: each shuffles its 6 groups differently and pauses randomly between them.
    return {r: v for r, (_, v) in run_local(_shuffled_and_min, 4, timeout_s=180).items()}


@pytest.mark.parametrize("engine", ["bitvector", "master_worker", "min"])
def test_random_readiness_orders_complete_and_match(shuffled, engine):
    _, ref = reference()
    for rank in range(4):
        np.testing.assert_allclose(shuffled[rank][engine]["params"], ref, rtol=1e-4, atol=1e-5)
    # Readiness really differed: groups trickled in over several coordination cycles.
    assert max(s["coordination_cycles"] for s in shuffled[0][engine]["stats"]) > 1


def test_coordination_runs_over_its_own_gloo_group(shuffled):
    """Readiness flags never touch the gradient group (NCCL on GPUs): CPU tensors over gloo."""
    assert all(shuffled[rank]["coordination_group"] == ("gloo", True) for rank in range(4))


def test_min_fallback_says_so(shuffled):
    assert any("falls back to all_reduce MIN" in n for n in shuffled[0]["notices"])


def _hierarchical(rank: int, cfgs: list[dict], base: dict) -> dict:
    """run_configs, plus the path for backends without reduce_scatter (slices reduced to owners)."""
    out = run_configs(rank, cfgs, base)
    ctx = init_from_env(DistributedConfig(**base))

    def without_reduce_scatter(cfg, model, x):
        from models.distributed.engines.overlapped import HierarchicalEngine

        engine = HierarchicalEngine(cfg, model, x)
        engine.reducer.has_reduce_scatter = False
        return engine

    out["reduce"] = train_one(DistributedConfig(engine="hierarchical", **base), ctx, rank, ctx.world_size,
                              engine_factory=without_reduce_scatter)
    ctx.close()
    return out


def test_hierarchical_two_nodes_of_two():
    cfgs = [{"engine": "hierarchical"}, {"engine": "hierarchical", "compression": "fp16"}]
    base = {"timeout_s": 60, "node_size": 2}
    results = run_local(_hierarchical, 4, cfgs, base, timeout_s=180)
    start, ref = reference()
    for rank, (_, value) in results.items():
        assert value["_ctx"]["local_size"] == 2 and value["_ctx"]["node_rank"] == rank // 2
        exact = value[repr(sorted(cfgs[0].items()))]
        np.testing.assert_allclose(exact["params"], ref, rtol=1e-4, atol=1e-5)
        # Per group: reduce-scatter + cross-node all_reduce + all-gather = 3 collectives.
        assert exact["stats"][-1]["collectives"] % 3 == 0
        half = value[repr(sorted(cfgs[1].items()))]["params"]
        assert np.linalg.norm(half - ref) / np.linalg.norm(ref - start) < 2e-3
        # Reduce to slice owners (2 reduces per node) + cross-node all_reduce + all-gather.
        np.testing.assert_allclose(value["reduce"]["params"], ref, rtol=1e-4, atol=1e-5)
        assert value["reduce"]["stats"][-1]["collectives"] % 4 == 0
