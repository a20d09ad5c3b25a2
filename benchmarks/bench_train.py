"""Training throughput of the FC-DenseNet presets, as samples/s and sustained TFLOP/s (paper eq. 3),
each printed as a ratio against a dense matmul peak measured in the same run.

GPU (default when CUDA is available): the ``paper`` preset at 256^2 and 512^2 inputs and ``small``,
bf16 autocast, channels_last, eager (``--compile`` adds the torch.compile cases: their first
step compiles for minutes); reference = a large dense bf16 matmul measured first in the same run
(the device's achievable peak). Also reports peak memory and (``--max-batch``) the largest
batch that fits, with and without activation checkpointing.
CPU: the ``tiny`` and ``small`` presets in fp32; reference = a dense fp32 matmul.

One step = the trainer's step: forward under autocast, Huber + L2 loss, backward, LARC on the
gradients, Adam. Inputs are random tensors already on the device (this measures the model and
optimiser, not the input pipeline; bench_io.py covers data). Ops per step = 3 x forward conv ops
(eq. 2), counted analytically (models.flops).

    python benchmarks/bench_train.py                       # picks cuda if available, else cpu
    python benchmarks/bench_train.py --device cpu --threads 1
    python benchmarks/bench_train.py --device cuda --max-batch
    python -u benchmarks/bench_train.py --device cuda --presets paper   # scripts/gpu_checks.sh

``--resident``: the study's training step as the trainer runs it (configs/gpu-study.yaml: the scan preset
widened to 3.4 M parameters, 1024 x 32 x 32 fp16 stacks, two targets, dose noise and symmetry on, bf16,
batch 64), with the batches streamed from the store (the reference, measured in the same run) and held in
the device's memory (``data.resident``), each variant in a fresh process on one store of synthetic samples
of that shape. From the trainer's metrics (after ``--warmup`` steps): the mean step time, split into
compute (forward, backward and optimiser, synchronised: the trainer's compute_s) and the rest (the batch,
its transfer and augmentation, the host); the goal is compute >= 80% of the step. On the CPU: bf16 autocast
where the CPU has bf16 instructions (else fp32) and a batch of 4 (a step of batch 64 takes minutes).

    python -u benchmarks/bench_train.py --resident --device cuda          # the GPU figure (batch 64)
    python -u benchmarks/bench_train.py --resident --device cpu           # the CPU rehearsal (batch 4)
    python -u benchmarks/bench_train.py --resident --device cuda --compile   # and training.compile on it
"""
from __future__ import annotations

import argparse
import csv
import json
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from models import ModelConfig, TrainConfig, build_model, count_parameters
from models.amp import autocast
from models.flops import TRAIN_STEP_FACTOR, fcdensenet_conv_ops
from models.losses import huber_loss, l2_penalty
from models.optim import BlockOptimizer


@dataclass
class Case:
    preset: str
    in_channels: int
    px: int
    batch: int
    precision: str
    channels_last: bool
    compile: bool
    checkpointing: bool = False


@dataclass
class Result:
    case: Case
    params: int
    step_s: float
    samples_per_s: float
    tflops: float
    ratio_to_peak: float
    peak_mem_gib: float | None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_tflops(device: torch.device, dtype: torch.dtype, n: int, repeats: int) -> float:
    """Achievable dense matmul rate: 2 n^3 ops per product, best of ``repeats``."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.mm(a, b)
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e12


def bench_case(case: Case, device: torch.device, steps: int, warmup: int) -> Result:
    cfg = ModelConfig(preset=case.preset, in_channels=case.in_channels)
    torch.manual_seed(0)
    model = build_model(cfg).to(device)
    if case.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.set_activation_checkpointing(case.checkpointing)
    forward = torch.compile(model) if case.compile else model
    train_cfg = TrainConfig(precision=case.precision)
    opt = BlockOptimizer(model.blocks(), train_cfg)
    params = list(model.parameters())
    x = torch.randn(case.batch, case.in_channels, case.px, case.px, device=device)
    if case.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randn(case.batch, len(cfg.targets), case.px, case.px, device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def step() -> None:
        with autocast(case.precision, device):
            pred = forward(x)
        loss = huber_loss(pred, y, 10.0) + l2_penalty(params, train_cfg.weight_decay)
        opt.zero_grad()
        loss.backward()
        opt.step(1e-4)

    for _ in range(warmup):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    step_s = (time.perf_counter() - t0) / steps
    ops = TRAIN_STEP_FACTOR * fcdensenet_conv_ops(model, (case.in_channels, case.px, case.px)) * case.batch
    mem = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    return Result(case, count_parameters(model), step_s, case.batch / step_s, ops / step_s / 1e12, 0.0, mem)


def largest_batch(case: Case, device: torch.device, limit: int = 4096) -> int:
    """Largest batch whose training step fits in GPU memory (doubling, then bisection)."""
    def fits(batch: int) -> bool:
        try:
            bench_case(Case(**{**asdict(case), "batch": batch}), device, steps=1, warmup=0)
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            torch.cuda.empty_cache()

    lo, hi = 0, 1
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def gpu_cases(batch: int, compile_too: bool = False, presets: tuple[str, ...] = ("paper", "small")) -> list[Case]:
    """bf16 channels_last cases of ``presets``: eager, and compiled as well with ``compile_too``."""
    cases = []
    for compile_ in (False, True) if compile_too else (False,):
        cases += [Case("paper", 1024, 256, batch, "bf16", True, compile_),
                  Case("paper", 1024, 512, max(1, batch // 4), "bf16", True, compile_),
                  Case("small", 1024, 256, batch * 4, "bf16", True, compile_)]
    return [c for c in cases if c.preset in presets]


def cpu_cases() -> list[Case]:
    return [Case("tiny", 64, 16, 8, "fp32", False, False), Case("tiny", 64, 64, 4, "fp32", False, False),
            Case("small", 1024, 32, 2, "fp32", False, False)]


# ------------------------------------------------------------------ the study's step: streamed or resident

STUDY_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "gpu-study.yaml"
VARIANTS = ("streaming", "resident")   # the first is the reference
COMPILED = "resident-compiled"         # --compile: also the resident run with training.compile (torch.compile)


def write_study_store(path: Path, samples: int) -> None:
    """A store of ``samples`` synthetic samples at the study's shape (32 x 32 scan, 32 px patterns and
    targets, fp16; `bench_io.make_sample`), 90% of the materials in the training split, 10% in dev."""
    import stage
    from bench_io import CONFIG_HASH, make_sample

    cfg = stage.DataConfig(split_fractions=(0.9, 0.1, 0.0), map_size_mb=4096)
    with stage.StoreWriter(path, config_hash=CONFIG_HASH, data_cfg=cfg) as writer:
        for k in range(samples):
            writer.put(make_sample(k, 32, scan=32))


def cpu_precision() -> str:
    """bf16 where this CPU has bf16 instructions (oneDNN says so), else fp32."""
    return "bf16" if torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"


def run_variant(variant: str, data: Path, out: Path, device: str, batch: int, steps: int, warmup: int,
                loader_threads: int) -> dict:
    """Train the study's config on ``data`` for ``warmup + steps`` steps (``variant``: resident or not)
    and return the mean step, compute and rest seconds of the steps after the warmup."""
    import models
    from workflow.config import load_config

    precision = "bf16" if device == "cuda" else cpu_precision()
    sets = [f"data.resident={'false' if variant == 'streaming' else 'true'}", f"data.num_workers={loader_threads}",
            f"training.compile={'true' if variant == COMPILED else 'false'}",
            f"training.device={device}", f"training.precision={precision}", f"training.batch_size={batch}",
            f"training.max_steps={warmup + steps}", "training.max_wall_s=null", "training.eval_every=1000000",
            "training.checkpoint_every=1000000", "training.log_every=1", "training.progress=false"]
    cfg = load_config(STUDY_CONFIG, sets)
    models.train(cfg.model, cfg.training, None, cfg.data, [data], out)
    with open(out / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))[warmup:]
    step = sum(float(r["step_s"]) for r in rows) / len(rows)
    compute = sum(float(r["compute_s"]) for r in rows) / len(rows)
    return {"variant": variant, "device": device, "precision": precision, "batch": batch, "steps": len(rows),
            "step_s": step, "compute_s": compute, "rest_s": step - compute, "compute_fraction": compute / step}


def bench_study_step(args: argparse.Namespace, device: str) -> list[dict]:
    """Both variants, each in a fresh process, on one store written first; prints and returns their figures."""
    batch = args.batch_study or (64 if device == "cuda" else 4)
    samples = args.samples or (640 if device == "cuda" else 48)
    threads = args.loader_threads if args.loader_threads is not None else (12 if device == "cuda" else 1)
    root = Path(tempfile.mkdtemp(prefix="bench_train-resident-", dir=args.dir))
    t0 = time.perf_counter()
    write_study_store(root / "data" / "store-0", samples)
    print(f"study store: {samples} synthetic samples (1024 x 32 x 32 fp16) written in "
          f"{time.perf_counter() - t0:.1f} s under {root}", flush=True)
    results = []
    for variant in VARIANTS + ((COMPILED,) if args.compile else ()):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--variant", variant, "--data", str(root / "data"), "--out",
               str(root / variant), "--device", device, "--batch-study", str(batch),
               "--steps", str(args.steps or (20 if device == "cuda" else 8)),
               "--warmup", str(args.warmup), "--loader-threads", str(threads), "--json", str(root / f"{variant}.json")]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parents[1])
        res = json.loads((root / f"{variant}.json").read_text())
        results.append(res)
        print(f"{variant:9s} {res['precision']} batch {batch}: {res['step_s']:.4f} s per step = compute "
              f"{res['compute_s']:.4f} s ({100 * res['compute_fraction']:.1f}%) + rest {res['rest_s']:.4f} s, "
              f"mean of {res['steps']} steps", flush=True)
    ref = results[0]
    for held in results[1:]:
        print(f"{held['variant']} / streaming step time: {held['step_s'] / ref['step_s']:.3f} "
              f"({ref['step_s'] / held['step_s']:.2f}x the streaming rate); rest {held['rest_s'] / ref['rest_s']:.3f}")
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per case (default: 10 GPU, 5 CPU)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4, help="GPU: paper batch at 256^2 (512^2 uses batch/4)")
    ap.add_argument("--max-batch", action="store_true", help="GPU: also search the largest batch that fits")
    ap.add_argument("--compile", action="store_true", help="GPU: also the torch.compile cases (minutes to compile); "
                    "--resident: also the resident run compiled")
    ap.add_argument("--presets", nargs="+", choices=("paper", "small"), default=["paper", "small"],
                    help="GPU: the presets to measure")
    ap.add_argument("--threads", type=int, default=None, help="CPU: intra-op threads (default: torch's)")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    ap.add_argument("--resident", action="store_true",
                    help="the study's training step, streamed vs held in device memory (data.resident)")
    ap.add_argument("--batch-study", type=int, default=None, help="--resident: batch (default 64 cuda, 4 cpu)")
    ap.add_argument("--samples", type=int, default=None, help="--resident: samples in the store (640 cuda, 48 cpu)")
    ap.add_argument("--loader-threads", type=int, default=None,
                    help="--resident: data.num_workers (default 12 cuda as configs/gpu-study.yaml, 1 cpu)")
    ap.add_argument("--dir", default=None, help="--resident: where the store and the runs go (default: the temp dir)")
    ap.add_argument("--variant", choices=VARIANTS + (COMPILED,), default=None, help=argparse.SUPPRESS)   # one variant's process
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    want = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if want == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda, but this torch sees no CUDA GPU; use --device cpu or auto")
    if args.variant:
        res = run_variant(args.variant, Path(args.data), Path(args.out), want, args.batch_study, args.steps,
                          args.warmup, args.loader_threads)
        Path(args.json).write_text(json.dumps(res))
        return 0
    if args.resident:
        results = bench_study_step(args, want)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"device": want, "reference": "streaming", "results": results}, fh, indent=1)
        return 0
    device = torch.device(want)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        peak = matmul_peak_tflops(device, torch.bfloat16, 8192, 10)
        peak_name = "dense bf16 matmul 8192^3"
        cases = gpu_cases(args.batch, args.compile, tuple(args.presets))
        steps = args.steps or 10
        name = torch.cuda.get_device_name(device)
    else:
        peak = matmul_peak_tflops(device, torch.float32, 2048, 5)
        peak_name = "dense fp32 matmul 2048^3"
        cases = cpu_cases()
        steps = args.steps or 5
        name = f"{platform.processor() or platform.machine()} x{torch.get_num_threads()} threads"
    print(f"device: {name}; reference peak ({peak_name}): {peak:.3f} TFLOP/s", flush=True)
    results = []
    for case in cases:
        res = bench_case(case, device, steps, args.warmup)
        res.ratio_to_peak = res.tflops / peak
        results.append(res)
        mem = f", peak memory {res.peak_mem_gib:.1f} GiB" if res.peak_mem_gib is not None else ""
        print(f"{case.preset:5s} S={case.in_channels} {case.px}^2 batch {case.batch} {case.precision}"
              f"{' channels_last' if case.channels_last else ''}{' compiled' if case.compile else ''}: "
              f"{res.samples_per_s:.3g} samples/s, {res.tflops:.4g} TFLOP/s sustained = "
              f"{100 * res.ratio_to_peak:.1f}% of the measured peak ({res.params:,} params{mem})", flush=True)
    if device.type == "cuda" and args.max_batch:
        for case in [c for c in cases if not c.compile]:
            for ckpt in (False, True):
                probe = Case(**{**asdict(case), "checkpointing": ckpt})
                print(f"largest batch that fits, {case.preset} {case.px}^2 bf16"
                      f"{' with activation checkpointing' if ckpt else ''}: {largest_batch(probe, device)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": name, "peak_tflops": peak, "peak_reference": peak_name,
                       "results": [{**asdict(r), "case": asdict(r.case)} for r in results]}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
