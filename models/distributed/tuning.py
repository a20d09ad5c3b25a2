"""Grid search over reduction knobs on this machine (in the spirit of Anthony et al. 2020, who
recovered 23.9% scaling efficiency by tuning Horovod's fusion threshold and cycle time), writing
the best settings to a JSON file that ``DistributedConfig(tuned_settings=FILE)`` applies.

    namsa tuning --ranks 2 --out tuned.json [--horovod]      (workflow.cli_distributed)

Each trial is a real multi-rank run (gloo on 127.0.0.1) timed over a few steps; the file holds
every trial and, under ``best``, the fastest DDP bucket size, the fastest grouping, and (with
``--horovod``, when Horovod is importable) the fastest fusion threshold and cycle time.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from models.distributed.measure import BenchProblem, PresetProblem, measure_engine, problem_from_json

DEFAULT_GRID = {
    "ddp": [{"bucket_mb": b} for b in (0.25, 1.0, 4.0, 25.0)],
    "grouped": [{"grouping": "chunks", "group_count": g} for g in (1, 2, 4, 8)]
               + [{"grouping": "per_block"}],
    "horovod": [{"fusion_threshold_mb": f, "cycle_time_ms": c} for f in (1.0, 64.0) for c in (1.0, 5.0)],
}


#: what each horovodrun rank runs (``python -c HOROVOD_WORKER SPEC``): no module is an entry point of its own
HOROVOD_WORKER = "import sys; from models.distributed.tuning import horovod_worker; horovod_worker(sys.argv[1])"


def horovod_worker(spec_path: str) -> None:
    """What a horovodrun rank runs: time one Horovod setting; each rank writes its result.

    The spec is plain JSON (the problem as `BenchProblem.to_json`), never a pickle: the worker
    takes any path on its command line, and unpickling a file runs whatever it holds.
    """
    from models.distributed.measure import _time_steps

    spec = json.loads(Path(spec_path).read_text())
    problem = problem_from_json(spec["problem"])
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    out = _time_steps(rank, spec["cfg"], problem.model, problem.make_batch, spec["steps"], spec["warmup"])
    Path(spec["out"]).with_suffix(f".rank{rank}.json").write_text(json.dumps(out))


def measure_horovod(cfg: dict, ranks: int, problem: BenchProblem, steps: int, warmup: int, timeout_s: float = 300) -> dict:
    """Time one Horovod setting under ``horovodrun --gloo``; step_s is the slowest rank's."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp, "spec.json")
        spec.write_text(json.dumps({"cfg": cfg, "problem": problem.to_json(), "steps": steps, "warmup": warmup,
                                    "out": str(Path(tmp, "out"))}))
        horovodrun = Path(sys.executable).parent / "horovodrun"
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        subprocess.run([str(horovodrun), "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}", sys.executable,
                        "-c", HOROVOD_WORKER, str(spec)],
                       check=True, env={**env, "OMP_NUM_THREADS": "1", "PYTHONSAFEPATH": "1"},   # -c: no cwd imports
                       capture_output=True, timeout=timeout_s)
        results = [json.loads(Path(tmp, f"out.rank{r}.json").read_text()) for r in range(ranks)]
    return {**results[0], "step_s": max(r["step_s"] for r in results)}


def horovod_available() -> bool:
    try:
        import horovod.torch  # noqa: F401
    except ImportError:
        return False
    return (Path(sys.executable).parent / "horovodrun").exists()


def grid_search(problem: BenchProblem, ranks: int = 2, grid: dict | None = None, steps: int = 4, warmup: int = 2,
                horovod: bool = False, log=print) -> dict:
    """Time every setting in ``grid`` (engine -> list of knob dicts); return trials and the best."""
    grid = dict(grid or DEFAULT_GRID)
    if not (horovod and horovod_available()):
        grid.pop("horovod", None)
    trials = []
    for engine, settings in grid.items():
        for knobs in settings:
            cfg = {"engine": engine, "timeout_s": 120, **knobs}
            if engine == "horovod":
                result = measure_horovod(cfg, ranks, problem, steps, warmup)
            else:
                result = measure_engine(cfg, ranks, problem.model, problem.make_batch, steps, warmup)
            trials.append({"engine": engine, **knobs, "step_s": result["step_s"],
                           "collectives": result.get("collectives", 0)})
            log(f"{engine:8s} {json.dumps(knobs):50s} {result['step_s'] * 1e3:8.1f} ms/step")
    best: dict = {}
    for engine in grid:
        fastest = min((t for t in trials if t["engine"] == engine), key=lambda t: t["step_s"])
        best.update({k: v for k, v in fastest.items() if k not in ("engine", "step_s", "collectives")})
    fastest_engine = min(trials, key=lambda t: t["step_s"])["engine"]
    return {"machine": f"{platform.node()} ({os.cpu_count()} cores)", "ranks": ranks, "problem": problem.describe(),
            "steps": steps, "fastest_engine": fastest_engine, "best": best, "trials": trials}


def tune(ranks: int = 2, steps: int = 4, width: int = 48, depth: int = 6, preset: str | None = None, px: int = 32,
         horovod: bool = False) -> dict:
    """`grid_search` timing BenchNet (``width`` x ``depth``), or the FC-DenseNet ``preset`` on ``px`` patterns."""
    problem = PresetProblem(preset, px=px) if preset else BenchProblem(width, depth)
    return grid_search(problem, ranks, steps=steps, horovod=horovod)
