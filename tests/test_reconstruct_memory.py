"""`namsa reconstruct` in bounded memory: a 100 MB scan under a forced 0.05 GB budget.

The scan is synthetic (benchmarks/bench_reconstruct_memory.py: a bright-field disc modulated by a
smooth specimen, calibrated for ``pretrained:study-scan``) and written as .hspy. The CLI runs in a
fresh child process per file, and its peak RSS (ru_maxrss) on the 105 MB scan is compared with its
peak RSS on a 26 MB scan of the same kind: the difference must stay far below the ~75 MB between
the files (the code before issue 21 read the whole scan into RAM, ~1.4x the file, so its peak grew
by ~110 MB). The fixed part (interpreter, torch, the model, dask's copies of one tile: ~0.5 GB)
does not grow with the file. The maps must equal those of a run with an
unbounded budget (blocks of whole tile rows), and a scan of one constant pattern must give a map
without steps at the tile borders.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rsciio")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_reconstruct_memory as bench  # noqa: E402

#: 80 x 80 positions of 64 x 64 float32: 105 MB; the small scan: 40 x 40, 26 MB
SCAN, SMALL_SCAN = (80, 80), (40, 40)


@pytest.fixture(scope="module")
def big_scan(tmp_path_factory) -> Path:
    return bench.write_scan(tmp_path_factory.mktemp("scan") / "scan.hspy", SCAN)


def test_peak_memory_stays_bounded_and_maps_equal_an_unbounded_run(big_scan, tmp_path):
    small_scan = bench.write_scan(tmp_path / "small.hspy", SMALL_SCAN)
    more_bytes = big_scan.stat().st_size - small_scan.stat().st_size
    assert more_bytes > 70e6
    small = bench.measure(bench.reconstruct_argv(small_scan, tmp_path / "small", 0.05))
    bounded = bench.measure(bench.reconstruct_argv(big_scan, tmp_path / "bounded", 0.05))
    assert small["rc"] == 0 and bounded["rc"] == 0
    grown = bounded["peak_rss_bytes"] - small["peak_rss_bytes"]
    assert grown < 0.25 * more_bytes, (grown / 1e6, small["peak_rss_bytes"] / 1e6)
    unbounded = bench.measure(bench.reconstruct_argv(big_scan, tmp_path / "unbounded", 64))
    assert unbounded["rc"] == 0
    for name in ("potential", "icom_potential"):
        a, b = (np.load(tmp_path / run / f"{name}.npy") for run in ("bounded", "unbounded"))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()))


def test_constant_specimen_has_no_seams_at_tile_borders(tmp_path):
    """One pattern everywhere: the stitched map has no step where tiles begin or end; a plain
    side-by-side tiling of the same tile prediction would (its edge columns differ)."""
    from stage.microscope import tile_grid
    from workflow.reconstruct import reconstruct

    scan = (64, 64)
    path = bench.write_scan(tmp_path / "constant.hspy", scan, constant=True)
    summary = reconstruct(path, "pretrained:study-scan", tmp_path / "out", memory_gb=0.05)
    image = np.load(summary["files"]["potential.npy"]).astype(np.float64)
    grid = tile_grid(scan, (32, 32), 32)
    assert len(grid.origins_x) > 2  # overlapping tiles (stride < tile)
    borders = sorted({o for o in grid.origins_x[1:]} | {o + 32 for o in grid.origins_x[:-1]})
    steps = np.abs(np.diff(image, axis=1))  # steps[:, j] between columns j and j + 1
    at_borders = steps[:, [b - 1 for b in borders]].max()
    from models import load_reconstructor

    tile = load_reconstructor("pretrained:study-scan").predict(
        np.ascontiguousarray(bench.pattern(np.arange(32), np.arange(32), constant=True)[..., 16:48, 16:48]
                             .reshape(1024, 32, 32)))[0]
    hard_seam = np.abs(tile[:, 0] - tile[:, -1]).max()  # the step a side-by-side tiling makes
    typical = np.percentile(steps, 99)
    assert at_borders <= max(typical, 0.25 * hard_seam), (at_borders, typical, hard_seam)
