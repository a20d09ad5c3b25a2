"""Compute time and accuracy of the classical baselines (iCoM, single-slice ptychography at a fixed
4 iterations and iterated to convergence, multislice ptychography, all through py4DSTEM) against the
network's inference, per sample.

Case: the study's physics (200 kV, 20 mrad, 0.12 A sampling, 32 x 32 scan of 32 x 32 patterns over
a ~12 A cell, 32 x 32 target) for a few library materials along [001] at one thickness. Each method
is timed in its own fresh process on the same stored sample (imports excluded; network and iCoM:
one warm-up call, then the median of ``--repeats`` calls; the iterative ptychographies: one call,
as each costs seconds to minutes); the reference is the network's inference (the quickstart's
``tiny`` FC-DenseNet with 1024 input channels, one sample per forward, untrained weights: the cost
does not depend on them), so times are also given as ratios to it. Accuracy: Pearson r and relative
L2 of each baseline after the least-squares fit the evaluation applies (scale >= 0, with the signed
scale). Converged runs stop on py4DSTEM's data error (`namsa.ptychography.convergence`), never on
the truth; the table gives the iterations used and the final data error.

    .venv/bin/python benchmarks/bench_baselines.py                                   # 3 materials, 80 A
    .venv/bin/python benchmarks/bench_baselines.py --thickness 60 --materials Si-diamond --methods icom ptycho
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


METHODS = ("network", "icom", "ptycho4", "ptycho", "multislice")
LABELS = {"network": "network", "icom": "iCoM", "ptycho4": "single-slice, 4 it. (old)",
          "ptycho": "single-slice, converged", "multislice": "multislice, converged"}
ITERATIVE = ("ptycho4", "ptycho", "multislice")


def simulate(material: str, thickness_A: float, path: Path) -> None:
    """One study-physics sample of ``material`` along [001], pickled to ``path``."""
    from namsa.config import SimulationConfig
    from namsa.simulate import simulate_sample

    cfg = SimulationConfig(thickness_A=thickness_A, scan_shape=(32, 32), pattern_px=32, target_px=32, workers=2)
    path.write_bytes(pickle.dumps(simulate_sample(material, (0, 0, 1), cfg)))


def worker(method: str, sample_path: Path, repeats: int) -> dict:
    """Time ``method`` on the pickled sample in this (fresh) process; returns seconds and accuracy."""
    from evaluation.baselines import fit_to_truth
    from evaluation.metrics import pearson_r, relative_l2

    sample = pickle.loads(sample_path.read_bytes())
    truth = sample.potential.astype(np.float64)
    run = _method(method, sample)
    out = None if method in ITERATIVE else run()      # warm-up of the cheap ones: FFT plans, allocator
    times = []
    for _ in range(1 if method in ITERATIVE else repeats):
        t0 = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - t0)
    result = {"method": method, "seconds": float(np.median(times)), "all_seconds": times}
    if method == "network":
        return result
    if method in ITERATIVE:
        result.update(iterations=out.iterations, error=out.error, converged=out.converged,
                      n_slices=getattr(out, "n_slices", 1))
        out = out.potential
    fitted, fit = fit_to_truth(out, truth)
    result.update(pearson_r=pearson_r(out, truth), rel_l2=relative_l2(fitted, truth), signed_scale=fit["signed_scale"])
    return result


def _method(method: str, sample):
    if method == "icom":
        from evaluation.baselines import icom_from_sample

        return lambda: icom_from_sample(sample)
    if method in ITERATIVE:
        from namsa.ptychography.multislice import multislice_from_sample
        from namsa.ptychography.single_slice import ptycho_from_sample, require_py4dstem

        require_py4dstem()                    # the one-off import stays out of the timing
        if method == "multislice":
            return lambda: multislice_from_sample(sample)
        return lambda: ptycho_from_sample(sample, iterations=4 if method == "ptycho4" else None)
    import torch

    from models import ModelConfig
    from models.fcdensenet import FCDenseNet

    model = FCDenseNet(ModelConfig(preset="tiny", in_channels=sample.cbed.shape[0]).architecture()).eval()
    x = torch.from_numpy(np.log1p(sample.cbed.astype(np.float32)).reshape(1, sample.cbed.shape[0], 32, 32))

    def forward():
        with torch.no_grad():
            return model(x).numpy()
    return forward


def _spawn(method: str, path: Path, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", method, "--sample", str(path), "--repeats", str(repeats)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _row(material: str, thickness: float, name: str, r: dict, net_seconds: float) -> str:
    acc = (f"{r['pearson_r']:.3f} | {r['rel_l2']:.3f} | {r['signed_scale']:+.2f}" if "pearson_r" in r
           else "- | - | -")
    its = (f"{r['iterations']}{'' if r['converged'] or name == 'ptycho4' else ' (cap)'} | {r['error']:.4f}"
           if "iterations" in r else "- | -")
    return (f"| {material} | {thickness:.1f} | {LABELS[name]} | {r['seconds']:.2f} | "
            f"{r['seconds'] / net_seconds:.1f} | {its} | {acc} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--materials", nargs="+", default=["Si-diamond", "GaAs-zincblende", "SrTiO3-perovskite"])
    ap.add_argument("--thickness", type=float, default=80.0, help="specimen thickness (Angstrom)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--sample", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.sample), args.repeats)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        print("| material | thickness (A) | method | s / sample | / network | iterations | data error | "
              "Pearson r | rel. L2 (fitted) | signed scale |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for material in args.materials:
            path = Path(tmp) / f"{material}.pkl"
            simulate(material, args.thickness, path)
            thickness = pickle.loads(path.read_bytes()).meta.thickness_A
            net = _spawn("network", path, args.repeats)
            for name in args.methods:
                r = net if name == "network" else _spawn(name, path, args.repeats)
                print(_row(material, thickness, name, r, net["seconds"]), flush=True)


if __name__ == "__main__":
    main()
