"""The scan-space network's error on the outer ring of map pixels against the interior's, with zeros
and with circular padding (issue 30, part 4).

The scan of every simulated sample covers exactly one period of the specimen, so a conv at the
map's edge should see the opposite edge (circular padding), not zeros. This trains the quickstart
recipe (configs/quickstart.yaml) twice, each in its own fresh `namsa train` process on the same
store, with ``--set model.padding_mode=zeros`` and ``=circular``, then scores both on the dev split:
the potential's relative L2 error (`evaluation.metrics.relative_l2`, the map's mean taken from the
truth, the field's rule) on the outer ring of ``--ring`` pixels (default 2) and on the interior,
each averaged over the dev samples, printed with their ratio outer / interior. The reference of
each variant is its own interior, measured in the same run.

    nice .venv/bin/python benchmarks/bench_edge_ring.py                       # simulates first
    nice .venv/bin/python benchmarks/bench_edge_ring.py --data runs/quickstart/data
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODES = ("zeros", "circular")
NAMSA = [sys.executable, "-c", "import sys; from workflow.cli import main; sys.exit(main(sys.argv[1:]))"]


def namsa(*args: str) -> None:
    """One `namsa` command in a fresh process (this checkout's code); its output goes to the log."""
    subprocess.run([*NAMSA, *args], cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def ring_errors(model_dir: Path, data: Path, ring: int) -> tuple[float, float, int]:
    """(mean outer-ring rel. L2, mean interior rel. L2, dev samples) of the potential."""
    from evaluation.metrics import relative_l2
    from evaluation.views import field_map
    from models import load_reconstructor
    from stage import open_stores

    rec = load_reconstructor(model_dir)
    channel = list(rec.targets).index("potential")
    outer, inner = [], []
    with open_stores(data) as stores:
        for i in stores.indices("dev"):
            sample = stores[i]
            truth = sample.potential.astype(np.float64)
            # the field's rule: only the map's mean is taken from the truth
            pred = field_map(rec.predict(sample.cbed.astype(np.float32))[channel], truth)
            edge = np.ones(truth.shape, dtype=bool)
            edge[ring:-ring, ring:-ring] = False
            outer.append(relative_l2(pred[edge], truth[edge]))
            inner.append(relative_l2(pred[~edge], truth[~edge]))
    return float(np.mean(outer)), float(np.mean(inner)), len(outer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "quickstart.yaml")
    parser.add_argument("--data", type=Path, help="an existing store of this config (default: simulate one)")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "bench-edge-ring")
    parser.add_argument("--ring", type=int, default=2, help="width of the outer ring, map pixels")
    args = parser.parse_args(argv)

    data = args.data or args.work / "data"
    if args.data is None and not data.exists():
        namsa("simulate", str(args.config), "--out", str(data), "--no-progress")
    print(f"config {args.config.name}, data {data}, outer ring {args.ring} px")
    print(f"{'padding':<10}{'train s':>9}{'outer':>9}{'interior':>10}{'outer/interior':>16}{'dev':>5}")
    for mode in MODES:
        out = args.work / mode
        shutil.rmtree(out, ignore_errors=True)  # a fresh training run each time
        t0 = time.perf_counter()
        namsa("train", str(args.config), "--data", str(data), "--out", str(out), "--no-progress",
              "--set", f"model.padding_mode={mode}")
        seconds = time.perf_counter() - t0
        outer, inner, n = ring_errors(out / "model", data, args.ring)
        print(f"{mode:<10}{seconds:>9.0f}{outer:>9.4f}{inner:>10.4f}{outer / inner:>16.3f}{n:>5}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
