"""Patterns per second of namsa's simulator against abTEM on the same case, in the same run.

Case (issue 2): Si [110], 23.0 x 21.7 x 153.6 Angstrom supercell (3840 atoms), 200 kV, 20 mrad,
2 Angstrom slices (77), 32 x 32 probe positions over the whole cell for namsa's default (auto)
path, 16 x 16 for the probe-by-probe runs of both codes (``--probe-scan``), 256^2 and 512^2 grids.
Both codes keep the patterns out to the antialiasing cutoff (abTEM max_angle="cutoff"; namsa
crops to the same square), and both timings include building the potential.

namsa is timed as "auto" (for this perfect crystal the exact periodic S-matrix path of
namsa.periodic) and as "multislice" (probe by probe, the path of frozen phonons and every
non-periodic specimen) once per CPU FFT variant (pyFFTW with PATIENT / MEASURE wisdom, ESTIMATE
plans, scipy.fft), so the kernel speed, the FFT choice and the algorithmic gain are reported
separately. Every timing runs in a fresh process of its own (``--case-child``): FFTW keeps the
wisdom of every plan made in a process, so a second variant timed in the same process would reuse
the first one's plans (the earlier --fft-plans compared ESTIMATE with MEASURE that way and saw no
difference where there is 5-10x). Each FFTW variant with wisdom gets its own cache directory,
measured once by a planning process before the timed one (that one-time cost is printed apart).

Also measured: peak RSS of the paper-size case (512^2 grid, 1024 positions, patterns binned to
256^2) in a fresh process per method, against the configured memory budget.

GPU (``--device cuda``): measures the device copy bandwidth in the same run and reports
patterns/s as a fraction of the bandwidth bound of the multislice kernel (bytes per slice per
probe counted in `simulate_device_model.bytes_per_slice_per_probe`, with one and with two passes
over memory per FFT), and each run's host preparation time apart from its device (FFT/multiply) time. Every GPU
case runs twice in its fresh process and the second (warm: kernels compiled, cuFFT plans made) is
the figure; the first is reported beside it as ``cold_patterns_per_s``.

Host against device (``--host-vs-device``, runs on a CPU): the per-sample host work of the device
path at the sizes of configs/gpu-node.yaml and configs/paper.yaml, against the modelled HBM-bound
device time of the same sample. The device path runs on the strict cupy stand-in
(tests/strict_cupy.py); the wall time spent inside its array operations is what a GPU would do
and is left out, the rest (atoms, slicing, probe, propagators, rebinning matrices, targets, phase
ramps, copying the patterns out of the pinned buffer) is host time, plus a modelled 5 us per
kernel launch. Each variant runs in its own fresh process. The host phase of a sample
(namsa.simulate.prepare_sample: supercell, prepare, rebinner, targets, stack) runs ahead on
``simulation.host_threads`` pool threads (namsa.pipelined); the device waits for the driving thread's
own work plus whatever the pool cannot deliver within one sample's cycle, modelled for k = 1, 2, 3, 4
host threads with at most 3 of them running at once (a 16-core node with 4 GPUs, one worker per
GPU: 4 cores per worker, one of which drives the device).

    .venv/bin/python benchmarks/bench_simulate.py --repeats 2   # full run (~40 min on 2 busy cores)
    .venv/bin/python benchmarks/bench_simulate.py --quick        # 16 x 16 scan, 256^2 only
    .venv/bin/python benchmarks/bench_simulate.py --fft-plans    # FFT variants alone, fresh processes
    .venv/bin/python benchmarks/bench_simulate.py --host-vs-device   # host time vs modelled HBM time
    .venv/bin/python benchmarks/bench_simulate.py --study-host   # gpu-study's planned samples, store write
                                                                  # included (benchmarks/study_host_model.py)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its sibling module, also under PYTHONSAFEPATH
from simulate_device_model import FFT_PASSES, gpu_bound, host_child, host_vs_device  # noqa: E402
from study_host_model import study_child, study_host  # noqa: E402

CASE = dict(material="Si-diamond", zone_axis=(1, 1, 0), lateral_A=(22.0, 21.0), thickness_A=150.0,
            energy_kv=200.0, semiangle_mrad=20.0, slice_thickness_A=2.0)


def supercell():
    from namsa.library import get
    from namsa.supercell import orient_supercell

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


def run_namsa(cell, pos, gpts: int, method: str, device: str = "cpu", fft: str = "auto") -> tuple[float, dict]:
    from namsa.scan_simulation import prepare_simulation

    start = time.perf_counter()
    sim = prepare_simulation(cell, energy_kv=CASE["energy_kv"], semiangle_mrad=CASE["semiangle_mrad"], gpts=gpts,
                             slice_thickness_A=CASE["slice_thickness_A"], n_positions=len(pos), method=method,
                             device=device, fft=fft)
    sim.backend.synchronize()
    prepared = time.perf_counter()
    out = sim.run(pos, cutoff_crop(sim.grid.gpts, sim.grid.sampling))
    sim.backend.synchronize()
    end = time.perf_counter()
    return len(pos) / (end - start), dict(sim.info, pattern_shape=list(out[0].shape[1:]), prepare_s=prepared - start,
                                          run_s=end - prepared)


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


def case_child(code: str, method: str, fft: str, gpts: int, scan: int, device: str) -> None:
    """Runs in a fresh process: one timed simulation of the case, prints JSON (patterns/s)."""
    cell = supercell()
    pos = positions(cell, scan)
    if code == "abtem":
        rate, info = run_abtem(cell, pos, gpts, max_batch=max(8, len(pos) // 8)), {}
    elif device == "cpu":
        rate, info = run_namsa(cell, pos, gpts, method, device, fft)
    else:
        # a GPU's first run compiles kernels and makes cuFFT plans: run twice, time the second (warm),
        # and keep the first (cold) beside it
        cold, _ = run_namsa(cell, pos, gpts, method, device, fft)
        rate, info = run_namsa(cell, pos, gpts, method, device, fft)
        info["cold_patterns_per_s"] = cold
    print(json.dumps({"patterns_per_s": rate, "positions": len(pos), "info": info}, default=str))


def in_fresh_process(args: list[str], cache: str | None = None) -> dict:
    """Run this script with ``args`` in a new interpreter (own FFT plans, own wisdom import: nothing
    measured in one variant can leak into another) and return its JSON line. ``cache`` is the
    NAMSA_CACHE_DIR the child sees (its FFTW wisdom)."""
    env = dict(os.environ, **({"NAMSA_CACHE_DIR": cache} if cache else {}))
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"{args} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def fft_cache(fft: str, root: str) -> str | None:
    """A wisdom directory of its own per FFTW effort (PATIENT wisdom would otherwise serve MEASURE
    plans too); None for variants that need no wisdom. "auto" is fftw-patient (namsa.backend)."""
    fft = "fftw-patient" if fft == "auto" else fft
    if fft.startswith("fftw-") and fft != "fftw-estimate":
        path = os.path.join(root, fft)
        os.makedirs(path, exist_ok=True)
        return path
    return None


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
    from namsa.detector import pattern_rebinner
    from namsa.scan_simulation import prepare_simulation

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


def peak_rss(method: str, budget_gb: float, cache: str | None) -> dict:
    return in_fresh_process(["--rss-child", method, "--budget-gb", str(budget_gb)], cache)


FFT_SHAPES = ((16, 128, 128), (4, 256, 256), (1, 512, 512))


def fft_child(fft: str, shape: tuple[int, int, int], runs: int = 40) -> None:
    """Runs in a fresh process: plans the in-place batched complex64 2-D FFT pair the way namsa's
    backend does (wisdom imported, or measured and saved when absent), then times forward +
    backward; prints JSON with the planning time and the best of 5 x ``runs`` per transform."""
    from namsa.backend import get_backend

    backend = get_backend("cpu", fft)
    if fft.startswith("fftw"):
        import pyfftw  # noqa: F401  (an import is not planning: keep it out of the planning time)
    start = time.perf_counter()
    ws = backend.workspace(shape)
    plan_s = time.perf_counter() - start
    ws.buffer[...] = np.random.default_rng(0).random(shape)
    best = np.inf
    for _ in range(5):
        psi, start = ws.buffer, time.perf_counter()
        for _ in range(runs):
            psi = ws.backward(ws.forward(psi))
        best = min(best, (time.perf_counter() - start) / (2 * runs))
    print(json.dumps({"fft": fft, "shape": list(shape), "plan_s": plan_s, "ms_per_transform": best * 1e3}))


def fft_plans(variants: list[str], cache_root: str) -> dict:
    """Per shape and variant, each in a fresh process: first-plan time (wisdom measured and saved)
    and execution time of a second process that imports that wisdom, as a ratio to fftw-patient."""
    table = {}
    for shape in FFT_SHAPES:
        key, row = "x".join(map(str, shape)), {}
        for fft in variants:
            cache = fft_cache(fft, cache_root)
            first = in_fresh_process(["--fft-child", fft, "--shape", *map(str, shape)], cache)
            timed = in_fresh_process(["--fft-child", fft, "--shape", *map(str, shape)], cache)
            row[fft] = {"first_plan_s": first["plan_s"], "plan_s": timed["plan_s"],
                        "ms_per_transform": timed["ms_per_transform"]}
        ref = row.get("fftw-patient", next(iter(row.values())))["ms_per_transform"]
        for fft, r in row.items():
            r["ratio_to_patient"] = r["ms_per_transform"] / ref
            print(f"FFT {key} complex64 in place, {fft:13s}: {r['ms_per_transform']:.3f} ms/transform "
                  f"(x{r['ratio_to_patient']:.2f} of fftw-patient), planned in {r['first_plan_s']:.2f} s first, "
                  f"{r['plan_s']:.3f} s from wisdom", flush=True)
        table[key] = row
    return table


def plan_child(method: str, fft: str, gpts: int, scan: int) -> None:
    """Runs in a fresh process: what the first simulation on a machine pays once, planning (and
    saving the wisdom of) the FFTs of the case; prints JSON with the time."""
    from namsa.scan_simulation import prepare_simulation

    cell = supercell()
    start = time.perf_counter()
    sim = prepare_simulation(cell, energy_kv=CASE["energy_kv"], semiangle_mrad=CASE["semiangle_mrad"], gpts=gpts,
                             slice_thickness_A=CASE["slice_thickness_A"], n_positions=scan * scan, method=method,
                             fft=fft)
    if sim.method == "multislice":
        sim.backend.workspace((sim.batch_size, *sim.grid.gpts))
    print(json.dumps({"prepare_and_plan_s": time.perf_counter() - start}))


def _split(info: dict) -> str:
    """The host preparation and the device (FFT/multiply) run of one timing, apart."""
    return f"preparation {info['prepare_s']:.2f} s, run {info['run_s']:.2f} s"


def case_row(gpts: int, scan: int, probe_scan: int, ffts: list[str], args, cache_root: str, planned: set) -> dict:
    """One repeat at one grid: abTEM, namsa auto and namsa multislice per FFT variant, each in a fresh
    process; namsa's one-time planning runs first in a process of its own and is reported apart."""
    def case(code: str, method: str, fft: str, n: int) -> dict:
        cache = fft_cache(fft, cache_root)
        if code == "namsa" and (method, fft, gpts, n) not in planned and cache:
            first = in_fresh_process(["--plan-child", method, fft, str(gpts), str(n)], cache)
            print(f"[{gpts}^2] namsa {method} {fft}: first run on this machine plans its FFTs "
                  f"({first['prepare_and_plan_s']:.1f} s incl. preparing the simulation)", flush=True)
            planned.add((method, fft, gpts, n))
        return in_fresh_process(["--case-child", code, method, fft, str(gpts), str(n), args.device], cache)

    row: dict = {"probe_by_probe_positions": probe_scan ** 2}
    if not args.skip_abtem and not args.device.startswith("cuda"):
        row["abtem"] = case("abtem", "-", "-", probe_scan)["patterns_per_s"]
        print(f"[{gpts}^2] abTEM 1.0.11: {row['abtem']:.1f} patterns/s over {probe_scan ** 2} positions", flush=True)
    auto = case("namsa", "auto", "auto" if args.device == "cpu" else "-", scan)
    row["namsa_auto"], row["auto_info"] = auto["patterns_per_s"], auto["info"]
    print(f"[{gpts}^2] namsa auto ({auto['info']['method']}): {row['namsa_auto']:.1f} patterns/s over {scan ** 2} "
          f"positions ({_split(auto['info'])})", flush=True)
    for fft in ffts:
        done = case("namsa", "multislice", fft, probe_scan)
        rate = row[f"namsa_multislice[{fft}]"] = done["patterns_per_s"]
        row[f"namsa_multislice_info[{fft}]"] = done["info"]
        print(f"[{gpts}^2] namsa multislice, {fft}: {rate:.1f} patterns/s over {probe_scan ** 2} positions "
              f"({_split(done['info'])})"
              + (f" = {rate / row['abtem']:.2f} x abTEM" if "abtem" in row else ""), flush=True)
    if "abtem" in row:
        print(f"[{gpts}^2] ratio namsa auto / abTEM = {row['namsa_auto'] / row['abtem']:.2f}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="16 x 16 scan, 256^2 only, no RSS runs")
    parser.add_argument("--grids", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--probe-scan", type=int, default=16,
                        help="scan size for the probe-by-probe runs (namsa multislice, abTEM); their rate per "
                             "pattern barely depends on the count, and 32 x 32 at 512^2 takes ~1 h on 2 busy cores")
    parser.add_argument("--repeats", type=int, default=1, help="repeat every timing (fresh processes each time)")
    parser.add_argument("--ffts", nargs="+", default=None,
                        help="CPU FFT variants for the probe-by-probe runs (default: all of namsa.backend.CPU_FFTS)")
    parser.add_argument("--no-rss", action="store_true")
    parser.add_argument("--rss-only", action="store_true", help="only the peak-RSS runs")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    parser.add_argument("--skip-abtem", action="store_true")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--budget-gb", type=float, default=2.0, help="memory budget for the RSS runs (GB)")
    parser.add_argument("--fft-plans", action="store_true",
                        help="only the FFT variants: planning and execution time, each in fresh processes")
    parser.add_argument("--host-vs-device", action="store_true",
                        help="only the host time of the device path vs the modelled HBM-bound device time")
    parser.add_argument("--configs", nargs="+", default=["gpu-node", "paper"], help="configs for --host-vs-device")
    parser.add_argument("--host-repeats", type=int, default=3, help="warm samples per --host-vs-device variant")
    parser.add_argument("--study-host", nargs="?", const="gpu-study", metavar="CONFIG",
                        help="only the host work per sample over CONFIG's planned samples (default gpu-study), "
                             "the store write included, and the samples/s it allows per host thread count")
    parser.add_argument("--study-samples", type=int, default=16, help="samples of the plan for --study-host")
    parser.add_argument("--plan-dir", default=os.path.join(tempfile.gettempdir(), "bench_simulate_plans"),
                        help="where --study-host keeps the config's plan (workflow.plan_cache; planned on a first run)")
    parser.add_argument("--host-child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--study-child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    parser.add_argument("--fft-child", help=argparse.SUPPRESS)
    parser.add_argument("--shape", type=int, nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--case-child", nargs=6, help=argparse.SUPPRESS)
    parser.add_argument("--plan-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fft_child:
        return fft_child(args.fft_child, tuple(args.shape))
    if args.case_child:
        code, method, fft, gpts, scan, device = args.case_child
        return case_child(code, method, fft, int(gpts), int(scan), device)
    if args.plan_child:
        method, fft, gpts, scan = args.plan_child
        return plan_child(method, fft, int(gpts), int(scan))
    if args.rss_child:
        return peak_rss_child(args.rss_child, args.budget_gb)
    if args.study_child:
        config, count, plan_dir = args.study_child
        return study_child(config, int(count), plan_dir)
    if args.host_child:
        config, fft_friendly, repeats = args.host_child
        return host_child(config, bool(int(fft_friendly)), "Si-diamond", (1, 1, 0), int(repeats))
    from namsa.backend import CPU_FFTS

    ffts = args.ffts or list(CPU_FFTS)
    cache_root = tempfile.mkdtemp(prefix="bench_simulate_fftw_")   # every variant measures its own wisdom
    if args.study_host:
        results = {"study_host": study_host(args.study_host, args.study_samples, args.plan_dir, in_fresh_process)}
    elif args.host_vs_device:
        results = {"host_vs_device": host_vs_device(args.configs, args.host_repeats, in_fresh_process)}
    elif args.fft_plans:
        results = {"fft_plans": fft_plans(ffts, cache_root)}
    else:
        results = run_cases(args, ffts, cache_root)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2, default=str)


def run_cases(args, ffts: list[str], cache_root: str) -> dict:
    cell = supercell()
    scan = 16 if args.quick else 32
    print(f"case: Si [110] {cell.cell_A[0]:.2f} x {cell.cell_A[1]:.2f} x {cell.cell_A[2]:.1f} A, {len(cell.numbers)} "
          f"atoms, {scan}x{scan} positions, 200 kV, 20 mrad, 2 A slices; every timing in a fresh process", flush=True)
    results: dict = {"case": CASE, "scan": scan, "grids": {}}
    planned: set = set()
    for gpts in () if args.rss_only else ((256,) if args.quick else args.grids):
        probe_scan = min(args.probe_scan, scan)
        rows = [case_row(gpts, scan, probe_scan, ffts if args.device == "cpu" else ["-"], args, cache_root, planned)
                for _ in range(args.repeats)]
        results["grids"][gpts] = rows
        if "abtem" in rows[0]:
            for key in [k for k in rows[0] if k.startswith("namsa_") and "info" not in k]:
                ratios = [r[key] / r["abtem"] for r in rows]
                print(f"[{gpts}^2] {key} / abTEM over {len(rows)} repeats: {min(ratios):.2f}-{max(ratios):.2f}")
    if args.device.startswith("cuda") and results["grids"]:
        for gpts, rows in results["grids"].items():
            bound = gpu_bound(gpts, rows[0]["auto_info"]["n_slices"], args.device)
            for p in FFT_PASSES:
                key = f"bound_patterns_per_s[{p}_pass_fft]"
                bound[f"fraction_of_bound[{p}_pass_fft]"] = rows[-1]["namsa_multislice[-]"] / bound[key]
            print(f"[{gpts}^2] GPU: {bound}")
    if not args.quick and not args.no_rss:
        for method in ("auto", "multislice"):
            rss = peak_rss(method, args.budget_gb, fft_cache("fftw-patient", cache_root))
            results.setdefault("peak_rss", []).append(rss)
            print(f"[512^2, 1024 positions, patterns binned to 256^2] {rss}", flush=True)
    return results


if __name__ == "__main__":
    main()
