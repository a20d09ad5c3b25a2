"""Launcher detection, world size 1, bad input (mismatched configs, missing rendezvous, missing
Horovod), and a rank killed mid-training."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.distributed import (DistributedConfig, DistributedConfigError, HorovodMissingError, build_engine,
                                detect_launch, init_from_env)
from models.distributed.engines.base import NoopEngine
from models.distributed.spawn import run_local
from test_distributed_helpers import batch, fresh_model, train_one

LAUNCH_ENVS = {
    "torchrun": ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"},
                 (3, 8, 1, 2, 1)),
    "openmpi": ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, (5, 6, 2, 3, None)),
    # MPICH/Hydra mpiexec; Parsl's MpiExecLauncher runs exactly this.
    "mpich": ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}, (2, 4, 0, 2, None)),
    "srun": ({"SLURM_PROCID": "7", "SLURM_NTASKS": "12", "SLURM_STEP_NUM_TASKS": "12", "SLURM_LOCALID": "1",
              "SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "4(x2),4"}, (7, 12, 1, 4, 2)),
    "horovodrun": ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
                    "HOROVOD_CROSS_RANK": "0"}, (1, 2, 1, 2, 0)),
}


@pytest.mark.parametrize("launcher", list(LAUNCH_ENVS))
def test_detect_launch(launcher):
    env, expected = LAUNCH_ENVS[launcher]
    got = detect_launch(env)
    assert got.launcher == launcher
    assert (got.rank, got.world_size, got.local_rank, got.local_size, got.node_rank) == expected


def test_sbatch_batch_step_outside_srun_is_one_task():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "1"}
    assert detect_launch(env).world_size == 1


def test_ranks_without_a_local_rank_do_not_all_take_the_first_gpu():
    from models.distributed.launch import first_device_guess

    # PMI without MPI_LOCALRANKID gives no local rank: 4 ranks on a 4-GPU node take cuda:0..3
    ranks = [detect_launch({"PMI_RANK": str(r), "PMI_SIZE": "4"}) for r in range(4)]
    assert all(launch.local_rank is None for launch in ranks)
    assert [first_device_guess(launch, device_count=4) for launch in ranks] == [0, 1, 2, 3]
    # the launcher's local rank wins when it has one
    assert first_device_guess(detect_launch(LAUNCH_ENVS["torchrun"][0]), device_count=4) == 1


def test_no_launcher_is_world_size_one():
    assert detect_launch({}).world_size == 1


@pytest.mark.parametrize("engine", ["none", "ddp", "grouped", "bitvector", "master_worker", "hierarchical", "horovod"])
def test_world_size_one_engines_are_noops(engine, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "HOROVOD_RANK"):
        monkeypatch.delenv(name, raising=False)
    cfg = DistributedConfig(engine=engine)
    ctx = init_from_env(cfg)
    assert (ctx.world_size, ctx.rank, ctx.is_main, ctx.backend) == (1, 0, True, "none")
    model = fresh_model()
    eng = build_engine(cfg, model, ctx)
    assert isinstance(eng, NoopEngine) and eng.module is model
    x, y = batch(0)
    torch.nn.functional.mse_loss(eng.module(x), y).backward()
    before = [p.grad.clone() for p in model.parameters()]
    assert eng.synchronize() is True
    assert all(torch.equal(a, p.grad) for a, p in zip(before, model.parameters()))
    assert eng.stats()["collectives"] == 0
    ctx.barrier()
    eng.close()


def test_missing_master_addr_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(DistributedConfigError, match="MASTER_ADDR.*export MASTER_ADDR"):
        init_from_env(DistributedConfig(engine="ddp"))


def test_missing_horovod_names_the_install_command(monkeypatch):
    from models.distributed.launch import import_horovod

    monkeypatch.setitem(sys.modules, "horovod.torch", None)  # what Python does for an absent package
    with pytest.raises(HorovodMissingError, match="make horovod"):
        import_horovod()


def test_tuned_settings_override_the_config(tmp_path):
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"best": {"bucket_mb": 2.5, "group_count": 7, "grouping": "chunks"}}))
    cfg = DistributedConfig(engine="ddp", tuned_settings=str(path)).resolved()
    assert (cfg.bucket_mb, cfg.group_count, cfg.grouping, cfg.engine) == (2.5, 7, "chunks", "ddp")
    with pytest.raises(DistributedConfigError, match="tuned_settings"):
        DistributedConfig(tuned_settings=str(tmp_path / "absent.json")).resolved()


def _mismatch(rank: int, what: str) -> str:
    cfg = DistributedConfig(engine="grouped", timeout_s=30,
                            bucket_mb=5.0 if (what == "config" and rank == 1) else 25.0)
    try:
        ctx = init_from_env(cfg)
        build_engine(cfg, fresh_model(width=8 if (what == "model" and rank == 1) else 6), ctx)
    except DistributedConfigError as exc:
        return str(exc)
    return "no error"


@pytest.mark.distributed
@pytest.mark.parametrize("what,message", [("config", "distributed config"), ("model", "model structure")])
def test_mismatch_across_ranks_is_detected_at_startup(what, message):
    results = run_local(_mismatch, 2, what, timeout_s=60)
    for rank in (0, 1):
        text = results[rank][1]
        assert message in text and "ranks [1] differ" in text and "\n" not in text


def _broadcast(rank: int) -> list:
    from models.distributed.engines import broadcast_from_rank0

    ctx = init_from_env(DistributedConfig(timeout_s=60))
    tensors = [torch.full((2, 3), float(rank + 1)), torch.tensor([10 * rank], dtype=torch.int64),
               torch.full((4,), float(rank), dtype=torch.float64)]
    broadcast_from_rank0(tensors, ctx)
    return [t.tolist() for t in tensors]


@pytest.mark.distributed
def test_broadcast_from_rank0_overwrites_every_dtype_in_place():
    results = run_local(_broadcast, 3, timeout_s=60)
    for rank in range(3):
        assert results[rank][1] == [[[1.0] * 3] * 2, [0], [0.0] * 4]


def _affinity(rank: int) -> list[int]:
    return sorted(os.sched_getaffinity(0))


@pytest.mark.distributed
def test_bind_cores_pins_ranks_round_robin():
    cores = sorted(os.sched_getaffinity(0))
    ranks = min(len(cores), 4) + 1  # on a machine of <= 4 cores the last rank wraps to the first core
    bound = run_local(_affinity, ranks, timeout_s=60, bind_cores=True)
    assert {r: v for r, (_, v) in bound.items()} == {r: [cores[r % len(cores)]] for r in range(ranks)}
    assert run_local(_affinity, 1, timeout_s=60)[0][1] == cores  # unbound ranks keep every core


def _backward_twice(rank: int) -> str:
    cfg = DistributedConfig(engine="bitvector", timeout_s=30)
    ctx = init_from_env(cfg)
    engine = build_engine(cfg, fresh_model(), ctx)
    x, y = batch(0)
    torch.nn.functional.mse_loss(engine.module(x), y).backward()
    try:
        torch.nn.functional.mse_loss(engine.module(x), y).backward()
    except DistributedConfigError as exc:
        engine.synchronize()  # the engine still completes the step it has
        return str(exc)
    return "no error"


@pytest.mark.distributed
def test_two_backwards_before_synchronize_is_a_clear_error():
    results = run_local(_backward_twice, 2, timeout_s=60)
    for rank in (0, 1):
        assert "accumulated twice before synchronize()" in results[rank][1]


def _die_at_step(rank: int, engine: str) -> str:
    cfg = DistributedConfig(engine=engine, timeout_s=20)
    ctx = init_from_env(cfg)
    model = fresh_model()
    eng = build_engine(cfg, model, ctx)
    for step in range(5):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(eng.module(x[:2]), y[:2])
        if rank == 2 and step == 2:
            os._exit(3)  # a crashed node: no clean-up, sockets drop
        loss.backward()
        eng.synchronize()
    return "finished"


@pytest.mark.distributed
@pytest.mark.parametrize("engine", ["bitvector", "grouped"])
def test_killed_rank_makes_the_others_fail_clearly(engine):
    results = run_local(_die_at_step, 3, engine, timeout_s=90, allow_failures=True)
    assert results[2] == ("exit", 3)
    for rank in (0, 1):
        status, text = results[rank]
        assert status == "error" and "PeerFailureError" in text and "--resume" in text, text[-400:]


def _die_before_a_gather(rank: int) -> str:
    from models.distributed.launch import all_gather_objects

    ctx = init_from_env(DistributedConfig(timeout_s=20))
    if rank == 1:
        os._exit(3)  # a crashed node, between two of the training loop's small collectives
    all_gather_objects(ctx, rank)
    return "gathered"


@pytest.mark.distributed
def test_a_peer_lost_outside_the_engines_reduction_is_one_peer_failure_line():
    """The training loop's small collectives (the loss average, the checkpoint's RNG gather, the parameter
    broadcast) meet a dead peer too: CI once saw rank 0's loss average fail with gloo's bare "Read error ...
    Connection reset by peer" where the engine's reduction says PeerFailureError and --resume."""
    results = run_local(_die_before_a_gather, 2, timeout_s=90, allow_failures=True)
    assert results[1] == ("exit", 3)
    status, text = results[0]
    first = text.strip().splitlines()[0]
    assert status == "error" and first.startswith("PeerFailureError: rank 0: gathering an object from every rank "
                                                  "failed (") and first.endswith("--resume"), text[-600:]


def test_node_size_must_divide_world(monkeypatch):
    from models.distributed.launch import DistContext, LaunchEnv, _node_layout

    ctx = DistContext(rank=0, world_size=6)
    with pytest.raises(DistributedConfigError, match="node_size=4"):
        _node_layout(ctx, LaunchEnv("torchrun", 0, 6), DistributedConfig(node_size=4), ["h"] * 6)
    _node_layout(ctx, LaunchEnv("torchrun", 0, 6), DistributedConfig(), ["a", "b", "a", "b", "a", "b"])
    assert (ctx.local_size, ctx.local_rank, ctx.node_rank) == (3, 0, 0)


TORCHRUN_SCRIPT = """
import sys, json, torch
sys.path.insert(0, {tests!r})
from models.distributed import DistributedConfig, init_from_env
from test_distributed_helpers import reference, train_one
cfg = DistributedConfig(engine="bitvector", timeout_s=60)
ctx = init_from_env(cfg)
out = train_one(cfg, ctx, ctx.rank, ctx.world_size)
_, ref = reference()
# One file per rank: two ranks printing at once can interleave their lines.
open({out!r} + f"/rank{{ctx.rank}}.json", "w").write(json.dumps(
    {{"rank": ctx.rank, "world": ctx.world_size, "local": [ctx.local_rank, ctx.local_size],
      "launcher": ctx.launcher, "err": float(abs(out["params"] - ref).max())}}))
ctx.close()
"""


@pytest.mark.distributed
def test_real_torchrun_launch(tmp_path):
    from models.distributed.spawn import free_port

    script = tmp_path / "job.py"
    script.write_text(TORCHRUN_SCRIPT.format(tests=str(Path(__file__).parent), out=str(tmp_path)))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                           "--master-port", str(free_port()), str(script)], capture_output=True, text=True,
                          timeout=180, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in lines] == [0, 1]
    for r in lines:
        assert r["world"] == 2 and r["launcher"] == "torchrun" and r["local"] == [r["rank"], 2]
        assert r["err"] < 1e-5
