"""Wall time of a whole `namsa run` split by stage, and Parsl's own overhead as a fraction of it.

    .venv/bin/python benchmarks/bench_workflow.py                       # the quickstart, local profile
    .venv/bin/python benchmarks/bench_workflow.py --set execution.profile=local-htex
    .venv/bin/python benchmarks/bench_workflow.py --config configs/micro.yaml

Runs the pipeline from scratch in a fresh run directory (deleted first) and prints each stage's
wall time as a share of the total. Parsl's overhead is measured in the same run: for each stage,
the part of its wall time (first submission -> last result back in the driver) not covered by the
span in which its tasks ran (first task start -> last task end, stamped by the tasks themselves),
plus loading and cleaning up the DataFlowKernel (workflow.summary.parsl_overhead). Goal: < 5 % of the
total. Every figure is a ratio against the total measured in the same run, because the machines
these runs share are noisy.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workflow.config import load_config  # noqa: E402
from workflow.pipeline import run_pipeline  # noqa: E402

STAGES = ("plan", "parsl_start", "simulate", "train", "evaluate", "parsl_stop")
GOAL = 0.05


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "quickstart.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench-workflow", help="run directory (deleted first)")
    args = parser.parse_args(argv)

    cfg = load_config(args.config, args.set)
    shutil.rmtree(args.out, ignore_errors=True)
    started = time.time()
    summary = run_pipeline(cfg, args.out, progress=False)
    wall = time.time() - started
    timings = summary.timings
    total = timings["total"]

    print(f"config {args.config.name} (profile {cfg.execution.profile}), run dir {args.out}")
    print(f"{'stage':<12}{'seconds':>10}{'share':>9}")
    for stage in STAGES:
        if stage in timings:
            print(f"{stage:<12}{timings[stage]:>10.1f}{timings[stage] / total:>9.1%}")
    print(f"{'total':<12}{total:>10.1f}{1:>9.0%}   (process wall incl. imports: {wall:.1f} s)")
    for stage in dict.fromkeys(t.stage for t in summary.tasks):
        latencies = [t.started - t.submitted for t in summary.tasks if t.stage == stage and t.started]
        if latencies:
            print(f"  {stage}: {len(latencies)} task(s), submission -> start median {statistics.median(latencies):.3f} s")
    overhead = timings["parsl_overhead"]
    fraction = overhead / total
    verdict = "meets" if fraction < GOAL else "MISSES"
    print(f"Parsl overhead: {overhead:.2f} s = {fraction:.2%} of the total ({verdict} the < {GOAL:.0%} goal)")
    print(f"samples {summary.available}/{summary.planned}; headline: {summary.headline}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
