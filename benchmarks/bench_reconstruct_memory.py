"""Peak memory and throughput of `namsa reconstruct` on a large synthetic scan vs a plain chunked read.

Writes a synthetic 4D-STEM scan as HyperSpy HDF5 (.hspy, float32, 64 x 64 px patterns of a 20 mrad
bright-field disc at 200 kV, calibrated for ``pretrained:study-scan``: 0.5 Angstrom steps, 0.2
1/Angstrom detector pixels) of ``--size-gb`` GB, chunk by chunk (the writer never holds the scan),
then in fresh processes, one after the other:

1. a plain chunked read of the same file (h5py, one scan row at a time, the data summed so that
   every byte is touched): the reference rate and RSS;
2. ``namsa reconstruct FILE --model pretrained:study-scan --memory-gb GB`` (``--single-pass`` with this
   script's ``--single-pass``: every figure before 2026-11-27 was one network pass per tile).

Each child's peak RSS is its ``ru_maxrss`` (resource.getrusage(RUSAGE_CHILDREN) read by a wrapper
process that runs only that child); throughput is patterns (probe positions) per second of wall
time. Prints one JSON line; benchmarks/RESULTS.md records the figures.

Usage:  python benchmarks/bench_reconstruct_memory.py [--size-gb 20] [--memory-gb 2] [--dir /tmp]
        [--keep] [--single-pass]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: the physics of pretrained:study-scan (its card's expects_input)
ENERGY_KV, SEMIANGLE_MRAD, STEP_A, DK_INV_A, DETECTOR_PX = 200.0, 20.0, 0.5, 0.2, 64
ROOT = Path(__file__).resolve().parents[1]


def pattern(y: np.ndarray, x: np.ndarray, constant: bool = False) -> np.ndarray:
    """(len(y), len(x), 64, 64) float32 patterns at scan rows ``y`` and columns ``x``: a bright-field
    disc of the convergence semi-angle, its intensity and a dark-field spot modulated by a smooth
    periodic 'specimen' (identical everywhere when ``constant``), each pattern summing to ~1."""
    from namsa.constants import wavelength_A

    k = (np.arange(DETECTOR_PX) - DETECTOR_PX // 2) * DK_INV_A
    kk = np.hypot(k[:, None], k[None, :])
    disc = (kk <= SEMIANGLE_MRAD * 1e-3 / wavelength_A(ENERGY_KV)).astype(np.float32)
    spot = np.exp(-((k[:, None] - 1.6) ** 2 + k[None, :] ** 2) / 0.1).astype(np.float32)
    if constant:
        y, x = np.zeros_like(y), np.zeros_like(x)
    yy, xx = np.meshgrid(y * STEP_A, x * STEP_A, indexing="ij")
    field = (np.sin(2 * np.pi * yy / 5.43) * np.cos(2 * np.pi * xx / 5.43)).astype(np.float32)
    out = disc * (1 + 0.05 * field)[..., None, None] + spot * (0.2 + 0.1 * field)[..., None, None]
    return out / out.sum(axis=(-2, -1), keepdims=True)


def write_scan(path: Path, scan: tuple[int, int], constant: bool = False, rows_per_write: int = 8) -> Path:
    """An .hspy file (rsciio's layout: HyperSpy 'Experiments' group, axes with Angstrom units, TEM
    metadata) with the data written a few scan rows at a time through h5py."""
    import h5py
    from rsciio.hspy import file_writer

    sy, sx = scan
    empty = np.zeros((1, 1, DETECTOR_PX, DETECTOR_PX), dtype=np.float32)
    axes = [{"name": n, "size": 1, "scale": s, "offset": 0.0, "units": u, "navigate": i < 2, "index_in_array": i}
            for i, (n, s, u) in enumerate((("y", STEP_A, "Å"), ("x", STEP_A, "Å"), ("ky", DK_INV_A, "1/Å"),
                                           ("kx", DK_INV_A, "1/Å")))]
    signal = {"data": empty, "axes": axes, "original_metadata": {}, "tmp_parameters": {},
              "metadata": {"General": {"title": "synthetic"}, "Signal": {"signal_type": ""},
                           "Acquisition_instrument": {"TEM": {"beam_energy": ENERGY_KV,
                                                              "convergence_angle": SEMIANGLE_MRAD}}},
              "attributes": {"_lazy": False}, "learning_results": {}, "models": {},
              "package_info": {"name": "namsa-bench", "version": "0"}}
    file_writer(str(path), signal, compression=None)
    with h5py.File(path, "r+") as f:
        group = next(g for g in f["Experiments"].values())
        del group["data"]
        data = group.create_dataset("data", shape=(sy, sx, DETECTOR_PX, DETECTOR_PX), dtype="float32",
                                    chunks=(1, min(sx, 16), DETECTOR_PX, DETECTOR_PX))
        for axis, n in zip(("axis-0", "axis-1"), (sy, sx)):
            group[axis].attrs["size"] = n
        for y0 in range(0, sy, rows_per_write):
            rows = np.arange(y0, min(sy, y0 + rows_per_write))
            data[y0: y0 + len(rows)] = pattern(rows, np.arange(sx), constant)
    return path


def scan_for(size_gb: float) -> tuple[int, int]:
    """A square scan of about ``size_gb`` GB of float32 64 x 64 patterns."""
    n = int(math.sqrt(size_gb * 1e9 / (DETECTOR_PX ** 2 * 4)))
    return n, n


def measure(argv: list[str]) -> dict[str, float]:
    """Run ``argv`` as the only child of a fresh wrapper process: its exit status, wall seconds and
    peak RSS (bytes; ru_maxrss of the wrapper's children, in KiB on Linux)."""
    wrapper = ("import json, resource, subprocess, sys, time; t = time.perf_counter(); "
               "rc = subprocess.run(sys.argv[1:]).returncode; dt = time.perf_counter() - t; "
               "print(json.dumps({'rc': rc, 'seconds': dt, "
               "'peak_rss_bytes': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))")
    out = subprocess.run([sys.executable, "-c", wrapper, *argv], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def plain_read_argv(path: Path) -> list[str]:
    """A child that reads the dataset one scan row at a time with h5py and touches every value."""
    code = ("import h5py, sys; f = h5py.File(sys.argv[1], 'r'); d = next(iter(f['Experiments'].values()))['data']; "
            "s = 0.0\nfor y in range(d.shape[0]): s += float(d[y].sum(dtype='float64'))\nprint(s)")
    return [sys.executable, "-c", code, str(path)]


def reconstruct_argv(path: Path, out: Path, memory_gb: float, model: str = "pretrained:study-scan",
                     single_pass: bool = False) -> list[str]:
    """A child running `namsa reconstruct` (this checkout's code) on ``path``."""
    return [sys.executable, "-c", "import sys; from workflow.cli import main; sys.exit(main(sys.argv[1:]))",
            "reconstruct", str(path), "--model", model, "--out", str(out), "--memory-gb", str(memory_gb),
            *(["--single-pass"] if single_pass else [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=20.0, help="size of the synthetic scan (default 20)")
    parser.add_argument("--memory-gb", type=float, default=2.0, help="namsa reconstruct --memory-gb (default 2)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp"), help="where the file is written")
    parser.add_argument("--keep", action="store_true", help="keep the synthetic file")
    parser.add_argument("--single-pass", action="store_true",
                        help="namsa reconstruct --single-pass (one network pass per tile, as every run before "
                             "2026-11-27; the default averages 8 turns of each tile)")
    args = parser.parse_args(argv)
    scan = scan_for(args.size_gb)
    path = args.dir / f"namsa-bench-{scan[0]}x{scan[1]}.hspy"
    t0 = time.perf_counter()
    write_scan(path, scan)
    written = time.perf_counter() - t0
    try:
        plain = measure(plain_read_argv(path))
        recon = measure(reconstruct_argv(path, args.dir / "namsa-bench-out", args.memory_gb, single_pass=args.single_pass))
    finally:
        if not args.keep:
            os.unlink(path)
    patterns = scan[0] * scan[1]
    print(json.dumps({"file_gb": patterns * DETECTOR_PX ** 2 * 4 / 1e9, "scan": list(scan), "write_s": written,
                      "memory_gb": args.memory_gb, "single_pass": args.single_pass,
                      "plain_read": {**plain, "patterns_per_s": patterns / plain["seconds"]},
                      "reconstruct": {**recon, "patterns_per_s": patterns / recon["seconds"]}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
