"""`namsa` with the strict cupy stand-in (tests/strict_cupy.py) in place of cupy: the rehearsal of a
GPU script on a CPU runs the simulator's CUDA code path without a GPU (it claims no GPU figure).

    python scripts/with_stand_in.py simulate CONFIG --out DIR ...      (the arguments of `namsa`)
"""
from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import strict_cupy

    sys.modules.update(strict_cupy.modules())
    from workflow.cli import main

    raise SystemExit(main(sys.argv[1:]))
