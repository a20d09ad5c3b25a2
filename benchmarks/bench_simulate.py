"""Patterns per second of namsa's simulator against abTEM on the same case, in the same run.

Case (issue 2): Si [110], 23.0 x 21.7 x 153.6 Angstrom supercell (3840 atoms), 200 kV, 20 mrad,
2 Angstrom slices (77), 32 x 32 probe positions over the whole cell, 256^2 and 512^2 grids.
Both codes keep the patterns out to the antialiasing cutoff (abTEM max_angle="cutoff"; namsa
crops to the same square), and both timings include building the potential.

namsa is timed twice: "auto" (for this perfect crystal the exact periodic S-matrix path of
namsa.periodic) and "multislice" (probe by probe, the path used for frozen phonons), so the
kernel speed and the algorithmic gain are reported separately.

Also measured: peak RSS of the paper-size case (512^2 grid, 1024 positions, patterns binned to
256^2) in a fresh process per method, against the configured memory budget.

GPU (``--device cuda``): measures the device copy bandwidth in the same run and reports
patterns/s as a fraction of the bandwidth bound of the multislice kernel (bytes per slice per
probe counted below).

    .venv/bin/python benchmarks/bench_simulate.py            # full run (~30 min on 2 busy cores)
    .venv/bin/python benchmarks/bench_simulate.py --quick    # 16 x 16 scan, 256^2 only
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import warnings

import numpy as np

CASE = dict(material="Si-diamond", zone_axis=(1, 1, 0), lateral_A=(22.0, 21.0), thickness_A=150.0,
            energy_kv=200.0, semiangle_mrad=20.0, slice_thickness_A=2.0)


def supercell():
    from namsa.library import get
    from namsa.structures import orient_supercell

    return orient_supercell(get(CASE["material"]), CASE["zone_axis"], CASE["lateral_A"], CASE["thickness_A"])


def positions(cell, scan: int) -> np.ndarray:
    from namsa.optics import scan_positions

    return scan_positions((0.0, 0.0, cell.cell_A[1], cell.cell_A[0]), (scan, scan))


def cutoff_crop(gpts, sampling, band_limit=2 / 3):
    """Reducer keeping the square of k-pixels inside the antialiasing cutoff (k = 0 at the centre)."""
    from namsa.optics import band_limit_frequency

    k_max = band_limit_frequency(sampling, band_limit)
    half = [int(np.floor(k_max * n * d)) for n, d in zip(gpts, sampling)]

    def reduce(intensity):
        shifted = np.fft.fftshift(intensity, axes=(-2, -1))
        cy, cx = gpts[0] // 2, gpts[1] // 2
        return shifted[:, cy - half[0]: cy + half[0] + 1, cx - half[1]: cx + half[1] + 1].copy()

    return reduce


def run_namsa(cell, pos, gpts: int, method: str, device: str = "cpu") -> tuple[float, dict]:
    from namsa.simulate import prepare_simulation

    start = time.perf_counter()
    sim = prepare_simulation(cell, energy_kv=CASE["energy_kv"], semiangle_mrad=CASE["semiangle_mrad"], gpts=gpts,
                             slice_thickness_A=CASE["slice_thickness_A"], n_positions=len(pos), method=method,
                             device=device)
    out = sim.run(pos, cutoff_crop(sim.grid.gpts, sim.grid.sampling))
    sim.backend.synchronize()
    elapsed = time.perf_counter() - start
    return len(pos) / elapsed, dict(sim.info, pattern_shape=list(out[0].shape[1:]))


def run_abtem(cell, pos, gpts: int, max_batch: int) -> float:
    import abtem
    from ase import Atoms

    abtem.config.set({"device": "cpu", "fft": "fftw"})
    atoms = Atoms(numbers=cell.numbers, positions=cell.positions_A, cell=np.diag(cell.cell_A), pbc=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        potential = abtem.Potential(atoms, gpts=gpts, slice_thickness=CASE["slice_thickness_A"],
                                    parametrization="kirkland", projection="infinite")
        probe = abtem.Probe(energy=CASE["energy_kv"] * 1e3, semiangle_cutoff=CASE["semiangle_mrad"])
        probe.grid.match(potential)
        measured = probe.scan(potential, scan=abtem.CustomScan(pos[:, ::-1]),
                              detectors=abtem.PixelatedDetector(max_angle="cutoff"), max_batch=max_batch)
        measured.compute(progress_bar=False, scheduler="threads", num_workers=2)
        return len(pos) / (time.perf_counter() - start)


def vm_hwm_bytes() -> int:
    """Peak resident set of this process image (VmHWM). Not ru_maxrss: that survives exec and
    would report the parent's peak for a freshly started child."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss_child(method: str, budget_gb: float) -> None:
    """Runs in a fresh process: the paper-size case, prints JSON with the peak RSS."""
    from namsa.simulate import pattern_rebinner, prepare_simulation

    cell = supercell()
    pos = positions(cell, 32)
    sim = prepare_simulation(cell, energy_kv=CASE["energy_kv"], semiangle_mrad=CASE["semiangle_mrad"], gpts=512,
                             slice_thickness_A=CASE["slice_thickness_A"], n_positions=len(pos), method=method,
                             memory_budget_gb=budget_gb)
    reduce, _ = pattern_rebinner(sim.grid, 2 / 3, 256)
    start = time.perf_counter()
    cbed = np.concatenate(sim.run(pos, reduce)).astype(np.float32)
    elapsed = time.perf_counter() - start
    peak_gb = vm_hwm_bytes() / 1e9
    print(json.dumps({"method": sim.method, "peak_rss_gb": peak_gb, "budget_gb": budget_gb,
                      "output_gb": cbed.nbytes / 1e9, "batch_size": sim.batch_size, "run_s": elapsed}))


def peak_rss(method: str, budget_gb: float) -> dict:
    out = subprocess.run([sys.executable, __file__, "--rss-child", method, "--budget-gb", str(budget_gb)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def gpu_bound(gpts: int, n_slices: int, device: str) -> dict:
    """Copy bandwidth of the device (GB/s) and the multislice kernel's bandwidth bound (patterns/s).

    Bytes per slice per probe (complex64 wave of N pixels, 8 N bytes): transmission multiply
    (read + write 16 N), forward FFT (>= one read + one write, 16 N), propagator multiply (16 N),
    inverse FFT (16 N): 64 N bytes; the shared transmission function and propagator reads are
    amortised over the batch and left out, so the bound is optimistic.
    """
    import cupy

    n_bytes = 1 << 30
    a = cupy.empty(n_bytes // 4, dtype=cupy.float32)
    b = cupy.empty_like(a)
    cupy.copyto(b, a)
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(10):
        cupy.copyto(b, a)
    cupy.cuda.Device().synchronize()
    bandwidth = 2 * n_bytes * 10 / (time.perf_counter() - start)   # read + write
    per_pattern = 64 * gpts * gpts * n_slices
    return {"copy_bandwidth_GBps": bandwidth / 1e9, "bytes_per_slice_per_probe": 64 * gpts * gpts,
            "bound_patterns_per_s": bandwidth / per_pattern}


def fft_plan_ratio(shapes=((16, 128, 128), (8, 256, 256), (4, 512, 512)), runs: int = 30) -> dict:
    """Execution time of an FFTW_ESTIMATE plan (what namsa uses: the same plan in every process,
    reproducible samples) over an FFTW_MEASURE plan (timed per process, fastest but not
    reproducible) of the in-place batched complex64 2-D FFT, best of two plans of each."""
    import pyfftw

    ratios = {}
    for shape in shapes:
        best = {}
        for flag in ("FFTW_ESTIMATE", "FFTW_MEASURE") * 2:
            buf = pyfftw.empty_aligned(shape, dtype=np.complex64)
            plan = pyfftw.FFTW(buf, buf, axes=(-2, -1), flags=(flag, "FFTW_DESTROY_INPUT"), threads=1)
            buf[...] = np.random.default_rng(0).random(shape)
            start = time.perf_counter()
            for _ in range(runs):
                plan.execute()
            best[flag] = min(best.get(flag, np.inf), (time.perf_counter() - start) / runs)
        ratios["x".join(map(str, shape))] = best["FFTW_ESTIMATE"] / best["FFTW_MEASURE"]
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="16 x 16 scan, 256^2 only, no RSS runs")
    parser.add_argument("--grids", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--probe-scan-512", type=int, default=16,
                        help="scan size for the probe-by-probe runs (namsa multislice, abTEM) at 512^2; their "
                             "rate per pattern barely depends on the count, and 32 x 32 takes ~1 h on 2 busy cores")
    parser.add_argument("--no-rss", action="store_true")
    parser.add_argument("--rss-only", action="store_true", help="only the peak-RSS runs")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    parser.add_argument("--skip-abtem", action="store_true")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    parser.add_argument("--budget-gb", type=float, default=2.0, help="memory budget for the RSS runs (GB)")
    parser.add_argument("--fft-plans", action="store_true", help="only the FFTW estimate/measure plan ratio")
    args = parser.parse_args()
    if args.fft_plans:
        for shape, ratio in fft_plan_ratio().items():
            print(f"FFT {shape} complex64, in place: FFTW_ESTIMATE / FFTW_MEASURE execution time = {ratio:.2f}")
        return
    if args.rss_child:
        peak_rss_child(args.rss_child, args.budget_gb)
        return
    cell = supercell()
    scan = 16 if args.quick else 32
    pos = positions(cell, scan)
    print(f"case: Si [110] {cell.cell_A[0]:.2f} x {cell.cell_A[1]:.2f} x {cell.cell_A[2]:.1f} A, {len(cell.numbers)} atoms, "
          f"{scan}x{scan} positions, 200 kV, 20 mrad, 2 A slices")
    results: dict = {"case": CASE, "scan": scan, "grids": {}}
    for gpts in () if args.rss_only else ((256,) if args.quick else args.grids):
        row = {}
        row["namsa_auto"], info = run_namsa(cell, pos, gpts, "auto", args.device)
        print(f"[{gpts}^2] namsa auto ({info['method']}): {row['namsa_auto']:.1f} patterns/s over {len(pos)} "
              f"positions  {info}", flush=True)
        probe_pos = positions(cell, args.probe_scan_512) if gpts >= 512 and not args.quick else pos
        row["probe_by_probe_positions"] = len(probe_pos)
        row["namsa_multislice"], info = run_namsa(cell, probe_pos, gpts, "multislice", args.device)
        print(f"[{gpts}^2] namsa multislice: {row['namsa_multislice']:.1f} patterns/s over {len(probe_pos)} positions",
              flush=True)
        if args.device.startswith("cuda"):
            row["gpu"] = gpu_bound(gpts, info["n_slices"], args.device)
            row["gpu"]["fraction_of_bound"] = row["namsa_multislice"] / row["gpu"]["bound_patterns_per_s"]
            print(f"[{gpts}^2] GPU: {row['gpu']}")
        if not args.skip_abtem and not args.device.startswith("cuda"):
            row["abtem"] = run_abtem(cell, probe_pos, gpts, max_batch=max(8, len(probe_pos) // 8))
            print(f"[{gpts}^2] abTEM 1.0.11: {row['abtem']:.1f} patterns/s over {len(probe_pos)} positions", flush=True)
            print(f"[{gpts}^2] ratio namsa auto / abTEM = {row['namsa_auto'] / row['abtem']:.2f}; "
                  f"namsa multislice / abTEM = {row['namsa_multislice'] / row['abtem']:.2f}")
        results["grids"][gpts] = row
    if not args.quick and not args.no_rss:
        for method in ("auto", "multislice"):
            rss = peak_rss(method, args.budget_gb)
            results.setdefault("peak_rss", []).append(rss)
            print(f"[512^2, 1024 positions, patterns binned to 256^2] {rss}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2, default=str)


if __name__ == "__main__":
    main()
