"""I/O benchmark of the stage store: write rate vs the simulator, torch read pipeline vs a raw read.

For each pattern size P (paper shapes: 1024 x P x P float16 per sample) it
1. writes a store of synthetic CBED-like samples, without and with zstd compression, and reports
   samples/s and GB/s of the write path (validation, statistics, checksums, commit) against the
   namsa simulator's marginal rate for the same pattern size measured in the same run;
2. reads the uncompressed store's data.mdb sequentially with a Python buffered read (the raw
   reference) and through the torch pipeline (SampleDataset + make_loader, 1..N workers), each
   "cold" (after fdatasync + posix_fadvise(DONTNEED) drops the file's clean pages; fincore
   reports how much stayed cached) and "warm" (the file in the page cache), and prints
   pipeline/raw as the ratio (goal >= 0.8);
3. reads the compressed store through the pipeline (warm) to show what decompression costs;
4. with ``--cuda``: feeds the GPU (thread loader over pinned buffers, non-blocking copy, log1p
   + standardisation on the device) and reports GB/s of fp16 delivered against a bare pinned
   host-to-device copy and the raw warm read of the same run (goal: ~5 GB/s per GPU).

The pipeline is measured delivering fp16 stacks (``raw_cbed=True``: the transform runs on the
GPU after an fp16 copy, the recommended GPU path) and, for reference, float32 stacks normalised
in the workers (log1p + standardisation on the CPU).

Each pipeline figure is the loader's second epoch (the first starts workers/threads and
allocates the thread loader's ring once, as in training); "cold" unmaps the store and drops
data.mdb from the page cache before that epoch. The pipeline is read with both loaders (``--loaders processes threads``): DataLoader worker
processes (every item in fresh shared memory) and reader threads over a ring of reused buffers
(``DataConfig.loader = "threads"``, what ``auto`` picks for paper-sized samples).

Usage:  python benchmarks/bench_io.py [--px 256 512] [--samples 6 3] [--workers 1 2] [--dir /tmp]
        [--write-only] [--loaders processes threads] [--no-compare] [--cuda]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import stage
from namsa.material_id import sample_id
from namsa.sample import Sample, SampleMeta

GB = 1e9
CONFIG_HASH = "bench" + "0" * 59


def soft_disc(r: np.ndarray, radius: float) -> np.ndarray:
    """1 inside ``radius``, 0 outside, with a 1-pixel logistic edge (tanh form: no overflow)."""
    return 0.5 * (1.0 - np.tanh((r - radius) / 1.6))


def synthetic_cbed(n_patterns: int, px: int, seed: int) -> np.ndarray:
    """CBED-like stacks: a bright-field disc, a lattice of weaker Bragg discs whose intensities
    change with the probe position, and a diffuse background; each pattern sums to 1."""
    rng = np.random.default_rng(seed)
    yy, xx = (np.mgrid[:px, :px] - px // 2).astype(np.float32)
    radius = px / 10
    spacing = px / 4.5
    base = []
    for k in range(16):
        disc = soft_disc(np.hypot(yy, xx), radius)
        bragg = np.zeros((px, px), np.float32)
        for i in range(-2, 3):
            for j in range(-2, 3):
                if i or j:
                    r = np.hypot(yy - i * spacing, xx - j * spacing)
                    bragg += rng.uniform(0.02, 0.3) * soft_disc(r, radius)
        diffuse = 1e-3 * np.exp(-np.hypot(yy, xx) / (px / 6))
        pattern = disc * rng.uniform(0.6, 1.0) + bragg + diffuse
        base.append(pattern / pattern.sum())
    base = np.stack(base).astype(np.float32)
    scale = rng.uniform(0.97, 1.03, (n_patterns, 1, 1)).astype(np.float32)
    return base[np.arange(n_patterns) % 16] * scale


def make_sample(k: int, px: int, scan: int = 32) -> Sample:
    s = scan * scan
    material = f"bench-{k}"
    meta = SampleMeta.from_json({"sample_id": sample_id(material, (0, 0, 1), 0, CONFIG_HASH), "material_id": material,
            "formula": "Si", "elements": ["Si"], "zone_axis": [0, 0, 1], "variant": 0, "thickness_A": 200.0,
            "energy_kv": 200.0, "semiangle_mrad": 20.0, "aberrations": {"C1_A": 0.0, "C3_mm": 0.0},
            "sampling_A": [0.1, 0.1], "scan_shape": [scan, scan],
            "scan_positions_A": [[0.3 * y, 0.3 * x] for y in range(scan) for x in range(scan)],
            "fov_A": [0.0, 0.0, 0.3 * scan, 0.3 * scan], "seed": k, "code_version": "bench",
            "config_hash": CONFIG_HASH})   # the JSON form a store holds
    rng = np.random.default_rng(k)
    return Sample(cbed=synthetic_cbed(s, px, k), potential=rng.normal(size=(px, px)).astype(np.float32),
                  density=rng.gamma(2.0, size=(px, px)).astype(np.float32), meta=meta)


def drop_cache(path: Path) -> str:
    """Evict the file's pages from the page cache without root; returns fincore's cached size."""
    with open(path, "rb") as fh:
        os.fdatasync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return cached(path)


def cached(path: Path) -> str:
    if not shutil.which("fincore"):
        return "?"
    out = subprocess.run(["fincore", "-b", "-n", "-o", "RES", str(path)], capture_output=True, text=True)
    return f"{int(out.stdout.split()[0]) / 2**20:.0f} MiB" if out.returncode == 0 and out.stdout.strip() else "?"


def raw_read(path: Path) -> float:
    """Seconds to read the whole file sequentially with a buffered Python read (8 MiB chunks)."""
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while fh.readinto(view):
            pass
    return time.perf_counter() - t


def raw_read_fresh(path: Path, record_bytes: int) -> float:
    """Seconds to read the file in record-sized pieces, each into a freshly allocated shared-memory
    buffer: the destination every DataLoader worker must fill, so this adds the cost of first-
    touching new memory (page faults + zeroing) to the raw read."""
    import torch

    t = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while True:
            buf = torch.UntypedStorage._new_shared(record_bytes)
            view = memoryview(torch.empty(0, dtype=torch.uint8).set_(buf, 0, (record_bytes,)).numpy())
            if not fh.readinto(view):
                break
    return time.perf_counter() - t


def pipeline_read(store: Path, workers: int, raw_cbed: bool, normalizer: stage.Normalizer | None,
                  loader: str = "auto", cold: bool = False) -> tuple[float, float, str]:
    """(seconds for the second epoch, seconds after its first batch, fincore's cached size before it).

    The first epoch is a warm-up that starts the workers/threads and allocates the thread
    loader's ring once, as in a training run; ``cold`` drops data.mdb from the page cache before
    the timed epoch. ``loader``: DataConfig.loader (processes = DataLoader workers, threads =
    reader threads over a ring of reused buffers, auto = what the trainer gets).
    """
    ds = stage.SampleDataset(store, None, normalizer, raw_cbed=raw_cbed)
    cfg = stage.DataConfig(num_workers=workers, prefetch_factor=2, pin_memory=False, loader=loader)
    loader = stage.make_loader(ds, cfg, batch_size=1, shuffle=False, drop_last=False)
    for _ in loader:
        pass
    if cold:
        # a mapped page cannot be evicted: unmap the store everywhere first (the thread
        # loader reopens it on the next epoch; DataLoader workers restart, start-up included)
        ds.stores.close()
        if getattr(loader, "_iterator", None) is not None:
            loader._iterator._shutdown_workers()
            loader._iterator = None
    data_file = store / "data.mdb"
    left = drop_cache(data_file) if cold else cached(data_file)
    t = time.perf_counter()
    first = None
    n = 0
    for batch in loader:
        n += batch["cbed"].shape[0]
        first = first or time.perf_counter()
    end = time.perf_counter()
    assert n == len(ds)
    if hasattr(loader, "close"):
        loader.close()  # stop the reader threads
    del loader  # shut the workers down before the next measurement
    return end - t, end - first, left


def pinned_copy_rate(nbytes: int, repeats: int = 10) -> float:
    """GB/s of a bare pinned host-to-device copy of ``nbytes`` (the PCIe/NVLink-C2C ceiling)."""
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeats):
        device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return nbytes * repeats / (time.perf_counter() - t) / GB


def gpu_feed(store: Path, workers: int, normalizer: stage.Normalizer | None, device: str = "cuda"
             ) -> tuple[float, int]:
    """(seconds, fp16 bytes) of the loader's second epoch delivered onto the GPU: reader threads
    fill a pinned ring, each batch is copied non-blocking and (with ``normalizer``) transformed
    on the device, as the trainer does on a GPU; synchronised per batch."""
    import torch

    from stage.dataset import batch_to_device

    ds = stage.SampleDataset(store, None, normalizer, raw_cbed=True)
    cfg = stage.DataConfig(num_workers=workers, prefetch_factor=2, pin_memory=True, loader="threads")
    loader = stage.make_loader(ds, cfg, batch_size=1, shuffle=False, drop_last=False)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for epoch in range(2):
        sync()
        t, nbytes = time.perf_counter(), 0
        for batch in loader:
            out = batch_to_device(batch, device, normalizer)
            sync()
            nbytes += batch["cbed"].numel() * batch["cbed"].element_size()
            del out
    seconds = time.perf_counter() - t
    loader.close()
    return seconds, nbytes


def bench_gpu_feed(store: Path, workers: list[int], normalizer: stage.Normalizer | None, raw_bytes: int) -> None:
    data_file = store / "data.mdb"
    raw = data_file.stat().st_size / raw_read(data_file) / GB
    copy = pinned_copy_rate(raw_bytes)
    print(f"GPU: bare pinned host-to-device copy {copy:5.2f} GB/s; raw warm read {raw:5.2f} GB/s (same run)")
    for w in workers:
        seconds, nbytes = gpu_feed(store, w, normalizer)
        rate = nbytes / seconds / GB
        print(f"  pipeline to the GPU, threads loader, {w} thread(s), warm, "
              f"{'normalised on the device' if normalizer else 'fp16 copy only'}: {rate:5.2f} GB/s of fp16 "
              f"delivered; /copy = {rate / copy:.2f}, /raw read = {rate / raw:.2f}")


def write_store(path: Path, samples: list[Sample], compression: str) -> tuple[float, int]:
    cfg = stage.DataConfig(compression=compression, map_size_mb=1024)
    t = time.perf_counter()
    with stage.StoreWriter(path, config_hash=CONFIG_HASH, data_cfg=cfg) as w:
        for s in samples:
            w.put(s)
    elapsed = time.perf_counter() - t
    with stage.open_store(path) as reader:  # closed: an open map would pin the file's pages
        return elapsed, reader.manifest["bytes"]


def simulator_seconds_per_sample(px: int) -> float | None:
    """Marginal seconds per 1024-pattern sample of namsa.simulate_sample at P x P (same run)."""
    try:
        import namsa
    except ImportError:
        return None
    times: dict[int, float] = {}
    # the first call warms caches (structure library, FFT plans); the best of two runs per scan
    # size, because other jobs on a shared machine only ever make a run slower
    for scan in (2, 4, 8, 4, 8):
        cfg = namsa.SimulationConfig(scan_shape=(scan, scan), pattern_px=px, target_px=px,
                                     cell_lateral_A=px * 0.1, thickness_A=20.0, sampling_A=0.1,
                                     materials=["Si-diamond"], zone_axes=[[1, 1, 0]])
        t = time.perf_counter()
        namsa.simulate_sample("Si-diamond", (1, 1, 0), cfg)
        times[scan] = min(times.get(scan, float("inf")), time.perf_counter() - t)
    per_pattern = (times[8] - times[4]) / (64 - 16)
    return per_pattern * 1024 if per_pattern > 0 else None


def bench_size(px: int, n_samples: int, workers: list[int], root: Path, read: bool = True,
               loaders: tuple[str, ...] = ("processes", "threads"), compare: bool = True, cuda: bool = False) -> None:
    raw_bytes = 1024 * px * px * 2
    print(f"\n=== 1024 x {px} x {px} float16 = {raw_bytes / 2**20:.0f} MiB per sample, {n_samples} samples ===")
    samples = [make_sample(k, px) for k in range(n_samples)]
    stores, write_per_sample = {}, {}
    for compression in ("none", "zstd") if compare else ("none",):
        path = root / f"px{px}-{compression}"
        seconds, stored = write_store(path, samples, compression)
        stores[compression] = path
        print(f"write  compression={compression:<4}: {n_samples / seconds:6.2f} samples/s, "
              f"{n_samples * raw_bytes / seconds / GB:5.2f} GB/s of fp16 input, stored/raw = "
              f"{stored / (n_samples * raw_bytes):.3f}")
        write_per_sample[compression] = seconds / n_samples
    del samples
    sim = simulator_seconds_per_sample(px) if compare else None
    if sim:
        print(f"simulator (namsa, marginal, same run): {sim:.1f} s per 1024-pattern sample; store write / "
              f"simulation time = {write_per_sample['none'] / sim:.3f} (none), "
              f"{write_per_sample['zstd'] / sim:.3f} (zstd)")
    if not read:
        return
    data_file = stores["none"] / "data.mdb"
    file_bytes = data_file.stat().st_size
    with stage.open_store(stores["none"]) as reader:  # closed: an open map would pin the file's pages
        has_train = reader.manifest["counts"]["train"] > 0
    norm = stage.Normalizer.fit(stores["none"], "log1p", split="train") if has_train and compare else None
    if cuda:
        gpu_norm = stage.Normalizer.fit(stores["none"], "log1p", split="train") if has_train else None
        bench_gpu_feed(stores["none"], workers, gpu_norm, raw_bytes)
    for state in ("cold", "warm"):
        left = drop_cache(data_file) if state == "cold" else cached(data_file)
        raw = file_bytes / raw_read(data_file) / GB
        print(f"raw sequential read, {state} (cached before: {left}): {raw:5.2f} GB/s")
        left = drop_cache(data_file) if state == "cold" else cached(data_file)
        fresh = file_bytes / raw_read_fresh(data_file, raw_bytes) / GB
        print(f"raw read into fresh shared-memory buffers, {state} (cached before: {left}): {fresh:5.2f} GB/s")
        for kind, w in [(kind, w) for kind in loaders for w in workers]:
            total, steady, left = pipeline_read(stores["none"], w, True, None, kind, cold=state == "cold")
            rate = file_bytes / total / GB
            steady_rate = file_bytes * (n_samples - 1) / n_samples / steady / GB
            print(f"  pipeline fp16, loader={kind}, {w} worker(s), {state} (cached before: {left}): {rate:5.2f} GB/s "
                  f"({n_samples / total:5.2f} samples/s) second epoch, pipeline/raw = {rate / raw:.2f}; "
                  f"after the first batch {steady_rate:5.2f} GB/s, pipeline/raw = {steady_rate / raw:.2f}, "
                  f"pipeline/raw-into-fresh-buffers = {steady_rate / fresh:.2f}")
    if norm is not None:
        for kind, w in [(kind, w) for kind in loaders for w in workers]:
            total, steady, _ = pipeline_read(stores["none"], w, False, norm, kind)
            print(f"  pipeline float32 log1p-normalised in workers, loader={kind}, {w} worker(s), warm: "
                  f"{n_samples * raw_bytes / total / GB:5.2f} GB/s of fp16 data, {n_samples / total:6.2f} samples/s "
                  f"(after the first batch {(n_samples - 1) / steady:6.2f} samples/s)")
    if not compare:
        return
    raw_warm = file_bytes / raw_read(data_file) / GB
    zfile = stores["zstd"] / "data.mdb"
    raw_read(zfile)  # warm it
    for w in workers:
        seconds, _, _ = pipeline_read(stores["zstd"], w, True, None)
        print(f"  pipeline fp16 from the zstd store, {w} worker(s), warm: {n_samples * raw_bytes / seconds / GB:5.2f} "
              f"GB/s of decoded fp16 ({n_samples / seconds:6.2f} samples/s) vs {raw_warm:5.2f} GB/s raw warm read "
              f"of the uncompressed file: {n_samples * raw_bytes / seconds / GB / raw_warm:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--px", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--samples", type=int, nargs="+", default=[6, 3], help="samples per --px entry")
    parser.add_argument("--workers", type=int, nargs="+", default=list(range(1, (os.cpu_count() or 2) + 1)))
    parser.add_argument("--dir", default=os.environ.get("TMPDIR", tempfile.gettempdir()),
                        help="where the temporary stores go (node-local disk)")
    parser.add_argument("--write-only", action="store_true", help="measure the write path only")
    parser.add_argument("--loaders", nargs="+", default=["processes", "threads"],
                        choices=["processes", "threads", "auto"], help="DataConfig.loader values to read with")
    parser.add_argument("--no-compare", action="store_true",
                        help="skip the zstd store, the simulator timing and the CPU-normalised float32 reads "
                             "(fp16 read-pipeline figures only)")
    parser.add_argument("--cuda", action="store_true", help="also feed the GPU (needs CUDA)")
    args = parser.parse_args(argv)
    if args.cuda:
        import torch

        if not torch.cuda.is_available():
            parser.error("--cuda, but this torch sees no CUDA GPU")
    counts = args.samples + [args.samples[-1]] * (len(args.px) - len(args.samples))
    print(f"bench_io: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, stores under {args.dir}")
    root = Path(tempfile.mkdtemp(prefix="bench_io-", dir=args.dir))
    try:
        for px, n in zip(args.px, counts):
            bench_size(px, n, args.workers, root, read=not args.write_only, loaders=tuple(args.loaders),
                       compare=not args.no_compare, cuda=args.cuda)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
