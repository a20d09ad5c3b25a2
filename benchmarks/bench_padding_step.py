"""Training step time of the scan preset with zeros against circular padding (`model.padding_mode`),
one variant per fresh process (no plan or cache leaks between them), each printed with its ratio.

    python benchmarks/bench_padding_step.py [--batch 8] [--steps 10] [--repeats 2]
"""
from __future__ import annotations

import argparse
import subprocess
import sys

CHILD = """
import sys, time, torch
from models.config import ModelConfig
from models.fcdensenet import build_model
torch.manual_seed(0); torch.set_num_threads(2)
mode, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = build_model(ModelConfig(preset="scan", padding_mode=mode, targets=["potential"]))
x = torch.randn(batch, 1024, 32, 32)
opt = torch.optim.Adam(model.parameters())
def step():
    model(x).square().mean().backward(); opt.step(); opt.zero_grad()
for _ in range(3):
    step()
t = time.perf_counter()
for _ in range(steps):
    step()
print((time.perf_counter() - t) / steps)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.repeats):
        seconds = {mode: float(subprocess.run([sys.executable, "-c", CHILD, mode, str(args.batch), str(args.steps)],
                                              check=True, capture_output=True, text=True).stdout)
                   for mode in ("zeros", "circular")}
        print(f"step s: zeros {seconds['zeros']:.3f}, circular {seconds['circular']:.3f}, "
              f"circular / zeros {seconds['circular'] / seconds['zeros']:.2f}")


if __name__ == "__main__":
    main()
