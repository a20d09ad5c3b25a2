"""Grid search over reduction knobs on this machine (in the spirit of Anthony et al. 2020, who
recovered 23.9% scaling efficiency by tuning Horovod's fusion threshold and cycle time), writing
the best settings to a JSON file that ``DistributedConfig(tuned_settings=FILE)`` applies.

    python -m models.distributed.tuning --ranks 2 --out tuned.json [--horovod]

Each trial is a real multi-rank run (gloo on 127.0.0.1) timed over a few steps; the file holds
every trial and, under ``best``, the fastest DDP bucket size, the fastest grouping, and (with
``--horovod``, when Horovod is importable) the fastest fusion threshold and cycle time.
"""
from __future__ import annotations

import argparse
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


def _horovod_worker(spec_path: str) -> None:
    """Entry point on horovodrun ranks: time one Horovod setting, rank 0 writes the result.

    The spec is plain JSON (the problem as `BenchProblem.to_json`), never a pickle: this entry
    point takes any path on its command line, and unpickling a file runs whatever it holds.
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
                        "-m", "models.distributed.tuning", "--horovod-worker", str(spec)],
                       check=True, env={**env, "OMP_NUM_THREADS": "1", "PYTHONSAFEPATH": "1"},   # -m: no cwd imports
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.distributed.tuning", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write the tuned settings JSON here")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--width", type=int, default=48)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--preset", choices=["tiny", "small"], help="time this FC-DenseNet preset instead of BenchNet")
    parser.add_argument("--px", type=int, default=32, help="pattern size for --preset")
    parser.add_argument("--horovod", action="store_true", help="also tune Horovod fusion threshold / cycle time")
    parser.add_argument("--horovod-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.horovod_worker:
        _horovod_worker(args.horovod_worker)
        return 0
    if not args.out:
        parser.error("--out is required")
    problem = PresetProblem(args.preset, px=args.px) if args.preset else BenchProblem(args.width, args.depth)
    result = grid_search(problem, args.ranks, steps=args.steps, horovod=args.horovod)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"best settings {result['best']} -> {args.out} (set distributed.tuned_settings: {args.out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
