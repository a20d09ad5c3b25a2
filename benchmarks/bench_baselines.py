"""Compute time and accuracy of the classical baselines (iCoM, single-slice ptychography through
py4DSTEM) against the network's inference, per sample of the quickstart's geometry.

Case: the quickstart's sample shape (32 x 32 scan of 32 x 32 patterns over a ~12 A cell, 200 kV,
20 mrad, 32 x 32 target) for a few library materials along [001] at one thickness. Each method is
timed in its own fresh process on the same stored sample (imports and one warm-up call excluded;
the median of ``--repeats`` calls reported); the reference is the network's inference (the
quickstart's ``tiny`` FC-DenseNet with 1024 input channels, one sample per forward, untrained
weights: the cost does not depend on them), so figures are ratios ptycho / network and
iCoM / network measured in the same run. Accuracy: Pearson r and relative L2 of each baseline
after the least-squares scale and offset the evaluation applies.

    .venv/bin/python benchmarks/bench_baselines.py                          # 3 materials, 10 A
    .venv/bin/python benchmarks/bench_baselines.py --thickness 40 --iterations 4 8
"""
from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def simulate(material: str, thickness_A: float, path: Path) -> None:
    """One quickstart-geometry sample of ``material`` along [001], pickled to ``path``."""
    from namsa.config import SimulationConfig
    from namsa.simulate import simulate_sample

    cfg = SimulationConfig(thickness_A=thickness_A, scan_shape=(32, 32), pattern_px=32, target_px=32, workers=2)
    path.write_bytes(pickle.dumps(simulate_sample(material, (0, 0, 1), cfg)))


def worker(method: str, sample_path: Path, iterations: int, repeats: int) -> dict:
    """Time ``method`` on the pickled sample in this (fresh) process; returns seconds and accuracy."""
    from evaluation.metrics import fit_affine, pearson_r, relative_l2

    sample = pickle.loads(sample_path.read_bytes())
    truth = sample.potential.astype(np.float64)
    run = _method(method, sample, iterations)
    out = run()                               # warm-up: imports, FFT plans, allocator
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - t0)
    result = {"method": method, "seconds": float(np.median(times)), "all_seconds": times}
    if method != "network":
        scale, offset = fit_affine(out, truth)
        result.update(pearson_r=pearson_r(out, truth), rel_l2=relative_l2(scale * out + offset, truth))
    return result


def _method(method: str, sample, iterations: int):
    if method == "icom":
        from evaluation.baselines import icom_from_sample

        return lambda: icom_from_sample(sample)
    if method == "ptycho":
        from evaluation.baselines.ptycho import ptycho_from_sample

        return lambda: ptycho_from_sample(sample, iterations=iterations).potential
    import torch

    from models import ModelConfig
    from models.fcdensenet import FCDenseNet

    model = FCDenseNet(ModelConfig(preset="tiny", in_channels=sample.cbed.shape[0]).architecture()).eval()
    x = torch.from_numpy(np.log1p(sample.cbed.astype(np.float32)).reshape(1, sample.cbed.shape[0], 32, 32))

    def forward():
        with torch.no_grad():
            return model(x).numpy()
    return forward


def _spawn(method: str, path: Path, iterations: int, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", method, "--sample", str(path), "--iterations", str(iterations),
           "--repeats", str(repeats)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--materials", nargs="+", default=["C-graphite", "Si-diamond", "Au-fcc"])
    ap.add_argument("--thickness", type=float, default=10.0, help="specimen thickness (Angstrom)")
    ap.add_argument("--iterations", type=int, nargs="+", default=[4], help="ptychography iterations")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--sample", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.sample), args.iterations[0], args.repeats)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        print(f"| material | thickness (A) | method | s / sample | / network | Pearson r | rel. L2 (LS-scaled) |")
        print("|---|---|---|---|---|---|---|")
        for material in args.materials:
            path = Path(tmp) / f"{material}.pkl"
            simulate(material, args.thickness, path)
            thickness = pickle.loads(path.read_bytes()).meta["thickness_A"]
            net = _spawn("network", path, 1, args.repeats)
            rows = [("network", net)] + [("icom", _spawn("icom", path, 1, args.repeats))]
            rows += [(f"ptycho ({n} it.)", _spawn("ptycho", path, n, args.repeats)) for n in args.iterations]
            for name, r in rows:
                acc = (f"{r['pearson_r']:.3f} | {r['rel_l2']:.3f}" if "pearson_r" in r else "- | -")
                print(f"| {material} | {thickness:.1f} | {name} | {r['seconds']:.3f} | "
                      f"{r['seconds'] / net['seconds']:.2f} | {acc} |", flush=True)


if __name__ == "__main__":
    main()
