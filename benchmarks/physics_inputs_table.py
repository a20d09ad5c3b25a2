"""Table of the dev-split study (benchmarks/physics_inputs_study.sh): potential relative L2 of the
network, the fitted iCoM and the mean image, overall and on light materials (every element Z <= 14),
per variant and seed, read from each run's eval-dev/metrics.json.
    python benchmarks/physics_inputs_table.py OUT"""
from __future__ import annotations

import json
import sys
from pathlib import Path

LIGHT = "light (every element Z <= 14)"


def row(metrics: dict) -> list[float]:
    head = metrics["headline"]["potential"]
    light = metrics["class_aggregates"]["potential"][LIGHT]
    return [head[m]["rel_l2"] for m in ("network", "icom", "mean")] + \
           [light[m]["physical"]["rel_l2"]["value"] for m in ("network", "icom", "mean")]


def main(out: Path) -> None:
    print("| variant | seed | net all | iCoM all | mean all | net light | iCoM light | mean light |")
    print("|---|---|---|---|---|---|---|---|")
    for path in sorted(out.glob("*-s*/eval-dev/metrics.json")):
        name, seed = path.parent.parent.name.rsplit("-s", 1)
        values = row(json.loads(path.read_text()))
        print(f"| {name} | {seed} | " + " | ".join(f"{v:.3f}" for v in values) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
