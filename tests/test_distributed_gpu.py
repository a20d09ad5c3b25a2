"""GPU paths (run on a machine with a CUDA GPU: `pytest -m gpu`): engines over a one-rank NCCL
group on CUDA tensors. NCCL has no bitwise AND, but the coordinated engines agree over a gloo group
of their own (models/distributed/engines/overlapped.py), so the bitvector engine keeps its BAND
under NCCL too and never needs the MIN fallback (that fallback is tested on CPU with force_min)."""
from __future__ import annotations

import numpy as np
import pytest

from models.distributed.spawn import run_local

pytestmark = [pytest.mark.gpu, pytest.mark.distributed]


def _one_gpu(rank: int) -> dict:
    import torch
    import torch.distributed as dist

    from models.distributed import DistributedConfig
    from models.distributed.engines import _engine_class
    from models.distributed.launch import DistContext
    from test_distributed_helpers import fresh_model

    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    ctx = DistContext(backend="nccl", device=torch.device("cuda", 0))
    out = {}
    for name in ("ddp", "grouped", "bitvector", "master_worker", "hierarchical"):
        model = fresh_model().cuda()
        engine = _engine_class(name)(DistributedConfig(engine=name), model, ctx)
        x = torch.randn(4, 2, 8, 8, device="cuda")
        engine.module(x).square().mean().backward()
        expected = [p.grad.clone() for p in model.parameters()]
        engine.synchronize()
        out[name] = max(float((p.grad - e).abs().max()) for p, e in zip(model.parameters(), expected))
        if name == "bitvector":
            out["bitvector_band"] = engine.use_band
            out["coordination_backend"] = str(dist.get_backend(engine.coord_pg))
        engine.close()
    out["notices"] = ctx.notices
    return out


def test_engines_on_one_gpu_nccl_group():
    result = run_local(_one_gpu, 1, timeout_s=180)[0][1]
    for name in ("ddp", "grouped", "bitvector", "master_worker", "hierarchical"):
        assert np.isclose(result[name], 0.0, atol=1e-6), name  # the mean over one rank is the gradient
    assert result["coordination_backend"] == "gloo" and result["bitvector_band"] is True
    assert not any("falls back to all_reduce MIN" in n for n in result["notices"]), result["notices"]
