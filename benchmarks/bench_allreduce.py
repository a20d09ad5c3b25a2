"""Gradient-reduction engines, collectives and the performance model, measured on this machine.

    .venv/bin/python benchmarks/bench_allreduce.py [--quick] [--out benchmarks/results/distributed]

Prints markdown tables (paste into benchmarks/RESULTS.md):
1. engines on the FC-DenseNet `small` preset with 2 and 4 gloo ranks: step time as a ratio to
   `ddp` measured in the same run, collectives, coordination messages and cycles, bytes per step;
2. allreduce time vs message size and rank count -> alpha/beta (least squares);
3. You et al.'s linear model t = theta0 + theta1 x1 + theta2 x2 fitted on measured runs, its
   error (MAPE, max) on runs held out by rules fixed in code (perfmodel.split_runs);
4. predicted scaling efficiency of the paper's model at 1, 8, 64, 512, 4,600 nodes x 6 GPUs;
5. coordination cost from 1 to 27,600 ranks, master-worker vs bitvector (table + PNG);
6. a grid search over bucket size / group count (and Horovod fusion threshold / cycle time)
   writing the best settings to a JSON file `distributed.tuned_settings` can point at.
Ranks are bound to cores round-robin (``run_local(bind_cores=True)``; horovodrun places its own),
so ranks beyond the core count share cores in a fixed pattern: ratios within one rank count are
what to compare.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.distributed import perfmodel as pm  # noqa: E402
from models.distributed.measure import BenchProblem, PresetProblem, measure_allreduce, measure_engine  # noqa: E402
from models.distributed.tuning import grid_search, horovod_available, measure_horovod  # noqa: E402

ENGINES = [
    ("ddp", {"engine": "ddp"}),
    ("grouped", {"engine": "grouped"}),
    ("bitvector", {"engine": "bitvector"}),
    ("master_worker", {"engine": "master_worker"}),
    ("hierarchical (2 per node)", {"engine": "hierarchical", "node_size": 2}),
    ("grouped + fp16", {"engine": "grouped", "compression": "fp16"}),
    ("bitvector + int8_linear", {"engine": "bitvector", "compression": "int8_linear"}),
    ("bitvector + int8_tree", {"engine": "bitvector", "compression": "int8_tree"}),
    ("grouped + gradient lag", {"engine": "grouped", "gradient_lag": True}),
]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def bench_engines(problem, ranks: int, steps: int) -> str:
    """Each engine's step as a ratio to ddp; ranks bound to cores round-robin (``bind_cores``) so
    that every engine sees the same placement (horovodrun places its own ranks)."""
    def measure(raw: dict, n_steps: int, warmup: int) -> dict:
        return measure_engine({**raw, "timeout_s": 300}, ranks, problem.model, problem.make_batch, steps=n_steps,
                              warmup=warmup, bind_cores=True)

    # A discarded run first: the first ranks forked in a process were consistently slower.
    measure({"engine": "ddp"}, 2, 1)
    rows = [(label, measure(raw, steps, 2)) for label, raw in ENGINES
            if not (raw.get("node_size") and ranks % raw["node_size"])]
    if horovod_available():
        rows.append(("horovod", measure_horovod({"engine": "horovod", "timeout_s": 300}, ranks, problem, steps, 2)))
    # ddp again at the end: other jobs' load drifts during the run, so the reference is the
    # geometric mean of the first and last ddp runs (both shown).
    rows.append(("ddp (again, last)", measure({"engine": "ddp"}, steps, 2)))
    ref = float(np.sqrt(rows[0][1]["step_s"] * rows[-1][1]["step_s"]))
    lines = [f"{problem.describe()}, {ranks} gloo ranks, median of {steps} steps after 2 warm-up",
             "", "| engine | step (x ddp) | comm s/step | coord s/step | wait s/step | collectives/step | "
             "coord msgs/step | cycles/step | MB sent/step |", "|---|---|---|---|---|---|---|---|---|"]
    for label, r in rows:
        lines.append(f"| {label} | {r['step_s'] / ref:.2f} | {r.get('communication_s', 0):.3f} | "
                     f"{r.get('coordination_s', 0):.4f} | {r.get('wait_s', 0):.3f} | {r.get('collectives', 0):.1f} | "
                     f"{r.get('coordination_messages', 0):.1f} | {r.get('coordination_cycles', 0):.1f} | "
                     f"{r.get('bytes_sent', 0) / 1e6:.2f} |")
    lines.append(f"\nddp reference step: {ref * 1e3:.0f} ms (first {rows[0][1]['step_s'] * 1e3:.0f} ms, "
                 f"last {rows[-1][1]['step_s'] * 1e3:.0f} ms)")
    return "\n".join(lines)


def bench_alpha_beta(sizes, ranks, repeats) -> tuple[pm.AlphaBeta, str, list]:
    samples = measure_allreduce(sizes, ranks, repeats)
    fit, err = pm.fit_alpha_beta(samples)
    lines = ["| ranks | bytes | measured ms | alpha-beta ms |", "|---|---|---|---|"]
    for p, n, t in samples:
        lines.append(f"| {p} | {int(n):,} | {t * 1e3:.3f} | {fit.ring_allreduce(n, p) * 1e3:.3f} |")
    bw = 1 / fit.beta_s_per_B / 1e9 if fit.beta_s_per_B > 0 else float("inf")
    lines.append(f"\nalpha = {fit.alpha_s * 1e6:.1f} us, beta = {fit.beta_s_per_B * 1e9:.4f} ns/B "
                 f"({bw:.2f} GB/s), mean relative fit error {err:.1%}")
    return fit, "\n".join(lines), samples


YOU_RULES = {"width": "held out: runs at the 2nd and 4th of 5 widths, 2 <= P <= cores (dedicated cores)",
             "width-all": "held out: runs at the 2nd and 4th of 5 widths, every P >= 2 (ceil(P/cores) term)",
             "max-ranks": "held out: every run at the largest P (extrapolation in P; ceil(P/cores) term)"}


def measure_you_runs(widths, batches, ranks, px: int, steps: int, warmup: int, repeats: int) -> list[dict]:
    """Step time of ddp on BenchNet per (width, batch, P): each of ``repeats`` independent launches
    gives its fastest step after ``warmup`` (on shared cores interference only adds time); the
    figure is the median of those minima. Launches go round-robin over all configurations, so a
    burst of other jobs' load hits one repeat of many configurations, not every repeat of one."""
    configs = [(w, b, p) for w in widths for b in batches for p in ranks]
    minima: dict[tuple, list[float]] = {c: [] for c in configs}
    grad_bytes = {}
    for _ in range(repeats):
        for w, b, p in configs:
            problem = BenchProblem(width=w, depth=4, batch=b, px=px)
            r = measure_engine({"engine": "ddp", "timeout_s": 300}, p, problem.model, problem.make_batch, steps, warmup,
                               bind_cores=True)
            minima[(w, b, p)].append(r["step_min_s"])
            grad_bytes[w] = r["grad_bytes"]
    return [{"width": w, "batch": b, "ranks": p, "params": grad_bytes[w] // 4, "t": float(np.median(minima[(w, b, p)])),
             "launch_minima": minima[(w, b, p)],
             "spread": float(np.max(minima[(w, b, p)]) / np.min(minima[(w, b, p)]) - 1)} for w, b, p in configs]


def bench_you(widths, batches, ranks, px, steps, repeats, cores) -> tuple[str, dict]:
    """You et al.'s predictor on measured runs; x2 uses alpha/beta fitted at 2 ranks (<= cores).
    Every rank is pinned to a core, round-robin (``run_local(bind_cores=True)``), so ranks share
    cores in the fixed ceil(P/cores) pattern that x1 assumes."""
    sizes = [4e3, 64e3, 256e3, 1e6, 2e6]
    samples = measure_allreduce(sizes, [2], repeats=15, bind_cores=True)
    link, link_err = pm.fit_alpha_beta(samples)
    load_before = os.getloadavg()[0]
    runs = measure_you_runs(widths, batches, ranks, px, steps, 3, repeats)
    load_after = os.getloadavg()[0]
    single = {(r["width"], r["batch"]): r["t"] for r in runs if r["ranks"] == 1}
    for r in runs:
        r["x1"], r["x2"] = pm.step_features(single[(r["width"], r["batch"])], r["ranks"], r["params"] * 4, link, cores)
    lines = [f"x2 link: gloo all_reduce at 2 ranks, {', '.join(f'{int(n):,}' for n in sizes)} B, fastest of 15: "
             f"alpha = {link.alpha_s * 1e6:.1f} us, beta = {link.beta_s_per_B * 1e9:.3f} ns/B (fit error {link_err:.1%})",
             f"1-minute load average before / after the runs: {load_before:.1f} / {load_after:.1f}; launch-to-launch "
             f"spread of a configuration's minimum (max/min - 1): median {np.median([r['spread'] for r in runs]):.0%}, "
             f"max {np.max([r['spread'] for r in runs]):.0%} (a floor under any predictor's error here)",
             "", "| width | params | batch | ranks | measured ms (median of minima) | spread max/min-1 | x1 ms | x2 ms |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['width']} | {r['params']:,} | {r['batch']} | {r['ranks']} | {r['t'] * 1e3:.2f} | {r['spread']:.0%} | "
              f"{r['x1'] * 1e3:.2f} | {r['x2'] * 1e3:.3f} |" for r in runs]
    summary = {"alpha_s": link.alpha_s, "beta_s_per_B": link.beta_s_per_B, "load_average": [load_before, load_after],
               "runs": runs, "results": {}}
    for rule, label in YOU_RULES.items():
        res = pm.fit_and_judge(runs, rule, cores)
        summary["results"][rule] = {k: v for k, v in res.items() if k != "rows"}
        lines += ["", f"**{label}**", "", "| width | batch | ranks | measured ms | predicted ms | error | in fit |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['width']} | {r['batch']} | {r['ranks']} | {r['t'] * 1e3:.2f} | {r['predicted'] * 1e3:.2f} | "
                  f"{abs(r['predicted'] - r['t']) / r['t']:.1%} | {'yes' if r['in_fit'] else 'no'} |" for r in res["rows"]]
        theta = ", ".join(f"{v:.4g}" for v in res["theta"])
        lines.append(f"\ntheta = ({theta}) from {res['fit_runs']} runs; held-out error over {res['n']} runs: "
                     f"MAPE {res['mape']:.1%}, max {res['max']:.1%} (goal: within 10%)")
    return "\n".join(lines), summary


def _gpu_engine_times(rank: int, preset: str, px: int, steps: int) -> dict:
    """One GPU, a one-rank NCCL group: each engine's median step vs no communication."""
    import torch
    import torch.distributed as dist

    from models.distributed import DistributedConfig
    from models.distributed.engines import NoopEngine, _engine_class
    from models.distributed.launch import DistContext

    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    ctx = DistContext(backend="nccl", device=torch.device("cuda", 0))
    problem = PresetProblem(preset, batch=1, px=px)
    times = {}
    for name, raw in [("none", {})] + ENGINES:
        cfg = DistributedConfig(**{"engine": "none", **raw, "node_size": None})
        model = problem.model().cuda()
        engine = NoopEngine(cfg, model, ctx) if name == "none" else _engine_class(cfg.engine)(cfg, model, ctx)
        per_step = []
        for step in range(steps + 2):
            x, y = (t.cuda() for t in problem.make_batch(step, 0))
            torch.cuda.synchronize()
            start = time.perf_counter()
            torch.nn.functional.mse_loss(engine.module(x), y).backward()
            engine.synchronize()
            torch.cuda.synchronize()
            per_step.append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
        engine.close()
        times[name] = float(np.median(per_step[2:]))
    return times


def bench_gpu(preset: str, px: int, steps: int) -> str:
    from models.distributed.spawn import run_local

    times = run_local(_gpu_engine_times, 1, preset, px, steps, timeout_s=600)[0][1]
    lines = [f"One GPU, one-rank NCCL group, FC-DenseNet '{preset}' at {px}^2, median of {steps} steps",
             "", "| engine | step (x no communication) |", "|---|---|"]
    lines += [f"| {name} | {t / times['none']:.3f} |" for name, t in times.items()]
    return "\n".join(lines)


SECTIONS = ("engines", "alphabeta", "you", "model", "tune")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and sizes (a smoke run)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "distributed")
    parser.add_argument("--preset", default="small", choices=["tiny", "small"])
    parser.add_argument("--gpu", action="store_true", help="only the one-GPU NCCL engine overheads (needs CUDA)")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS),
                        help="which parts to run (default: all)")
    args = parser.parse_args()
    if args.gpu:
        print(bench_gpu(args.preset, 128, 10))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    steps = 3 if args.quick else 6
    started = time.time()
    sections = []
    problem = PresetProblem(args.preset, batch=1, px=16 if args.quick else 32)
    want = set(args.sections)
    if "engines" in want:
        for ranks in (2, 4):
            sections.append(f"### Engines, {ranks} ranks\n\n" + bench_engines(problem, ranks, steps))
            print(sections[-1], "\n", flush=True)
    fit_path = args.out / "alpha_beta.json"
    if "alphabeta" in want:
        sizes = [4e3, 64e3, 1e6, 4e6] if args.quick else [4e3, 64e3, 512e3, 2e6, 8e6, 16e6]
        link, text, samples = bench_alpha_beta(sizes, [2, 3, 4], 3 if args.quick else 7)
        fit_path.write_text(json.dumps({"alpha_s": link.alpha_s, "beta_s_per_B": link.beta_s_per_B,
                                        "samples": samples}, indent=1))
        sections.append("### Allreduce vs size and ranks (gloo, 127.0.0.1) -> alpha-beta\n\n" + text)
        print(sections[-1], "\n", flush=True)
    if "you" in want:
        widths = [16, 32, 48, 64, 96]
        # 32^2 inputs keep the smallest single-worker step above ~5 ms: below that a launch's
        # fastest step varied by 40-65% between identical launches here (16^2 runs, RESULTS.md).
        batches, px, steps_you, repeats = ([2, 6], 16, 6, 1) if args.quick else ([2, 6], 32, 15, 5)
        text, summary = bench_you(widths, batches, [1, 2, 3, 4], px, steps_you, repeats, cores)
        (args.out / "you_runs.json").write_text(json.dumps(summary, indent=1))
        sections.append(f"### You et al. linear model (ddp, BenchNet depth 4, 2 x {px}^2 inputs, widths {widths}, batch "
                        f"{batches}, P = 1-4 on {cores} cores; per configuration the median over {repeats} launches of "
                        f"the fastest of {steps_you} steps after 3 warm-up)\n\n" + text)
        print(sections[-1], "\n", flush=True)
    if "model" in want:
        for overlap in (0.0, 1.0):
            rows = pm.paper_scaling(overlap=overlap)
            sections.append(f"### Paper model ({pm.PAPER_PARAMS:,} params, fp16 gradients, {pm.PAPER_OPS_PER_SAMPLE:.4e} "
                            f"ops/sample/step at {pm.PAPER_SUSTAINED_FLOPS / 1e12:.2f} TFLOP/s per GPU), predicted "
                            f"weak-scaling efficiency, overlap={overlap:g}\n\n"
                            + pm.markdown_table(rows, pm.SCALING_COLUMNS, pm.SCALING_FORMATS))
            print(sections[-1], "\n", flush=True)
        coord = pm.coordination_table(27_600)
        figure = pm.plot_coordination(coord, args.out / "coordination.png", 5e-3)
        sections.append("### Coordination per cycle, 1 to 27,600 ranks (alpha = 2 us, 23 GB/s, 7 groups)\n\n"
                        + pm.markdown_table(coord, pm.COORDINATION_COLUMNS, pm.COORDINATION_FORMATS)
                        + f"\n\nmaster-worker exceeds a 5 ms cycle at {pm.breakdown_rank(coord, 5e-3):,} ranks and a "
                          f"1 ms cycle at {pm.breakdown_rank(coord, 1e-3):,}; bitvector stays under "
                          f"{max(r['bitvector_s'] for r in coord) * 1e6:.0f} us. Figure: {_rel(figure)}")
        print(sections[-1], "\n", flush=True)
    if "tune" in want:
        tuned = grid_search(problem, ranks=2, steps=steps, horovod=True)
        tuned_path = args.out / "tuned_settings.json"
        tuned_path.write_text(json.dumps(tuned, indent=1))
        lines = ["| engine | setting | ms/step |", "|---|---|---|"]
        for t in tuned["trials"]:
            knobs = {k: v for k, v in t.items() if k not in ("engine", "step_s", "collectives")}
            lines.append(f"| {t['engine']} | {json.dumps(knobs)} | {t['step_s'] * 1e3:.0f} |")
        sections.append(f"### Grid search (2 ranks, {problem.describe()})\n\n" + "\n".join(lines)
                        + f"\n\nbest: {json.dumps(tuned['best'])} (fastest engine: {tuned['fastest_engine']}) -> "
                          f"{_rel(tuned_path)}")
        print(sections[-1], "\n", flush=True)
    report = args.out / ("report.md" if want == set(SECTIONS) else f"report-{'-'.join(args.sections)}.md")
    report.write_text("\n\n".join(sections) + "\n")
    print(f"total {time.time() - started:.0f} s; report: {_rel(report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
