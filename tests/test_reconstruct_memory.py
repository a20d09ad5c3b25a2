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
    from models.scan_fit import tile_grid
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


def test_tiles_overlap_cover_the_scan_and_blend_a_constant_exactly():
    from models.scan_fit import Stitcher, blocks, tile_grid

    grid = tile_grid((80, 75), (32, 32), 32)
    assert grid.origins_y == (0, 16, 32, 48) and grid.origins_x == (0, 16, 32, 43)  # stride 16 < 32, last flush
    assert grid.covered == (80, 75) and grid.map_shape == (80, 75)
    stitcher = Stitcher(1, grid)
    for oy in grid.origins_y:
        for ox in grid.origins_x:
            stitcher.add(np.full((1, 32, 32), 3.5), (oy, ox))
    np.testing.assert_allclose(stitcher.result(), 3.5, rtol=1e-6)
    # a budget of one tile gives blocks of one tile; a large one whole tile rows
    assert all(len(b.origins) == 1 for b in blocks(grid, 1000, 32 * 32 * 1000))
    assert [len(b.origins) for b in blocks(grid, 1000, 10**12)] == [4, 4, 4, 4]


def test_pattern_transform_sees_every_raw_block_at_its_scan_position(tmp_path):
    """The hook the data checks plug into: called with each raw block and its (y0, x0) in the
    file's scan, before the detector fit; its output is what the model reads."""
    from workflow.reconstruct import reconstruct

    path = bench.write_scan(tmp_path / "scan.hspy", (48, 40))
    seen = []

    def double(block: np.ndarray, y0: int, x0: int) -> np.ndarray:
        seen.append((y0, x0, block.shape))
        return block * 2.0

    plain = reconstruct(path, "pretrained:study-scan", tmp_path / "plain", memory_gb=0.05)
    doubled = reconstruct(path, "pretrained:study-scan", tmp_path / "doubled", memory_gb=0.05,
                          pattern_transform=double)
    assert {(y0, x0) for y0, x0, _ in seen} == {(0, 0), (0, 8), (16, 0), (16, 8)}
    assert all(shape == (32, 32, 64, 64) for *_, shape in seen)
    # twice the counts: the per-tile normalisation after the crop gives the same maps
    np.testing.assert_allclose(np.load(doubled["files"]["potential.npy"]), np.load(plain["files"]["potential.npy"]),
                               rtol=1e-5, atol=1e-5)
    assert any("divided by their mean total intensity" in note for note in doubled["notes"])


def test_intensity_is_normalised_after_the_crop_to_the_model_s_detector(tmp_path):
    """Counts outside the model's 32 px crop (here a bright band at |k| > 5 1/Angstrom) change
    nothing: the crop is taken first and carries the probe's 1, as the training patterns did (the
    code before issue 21 divided by the whole detector's total first)."""
    from workflow.reconstruct import reconstruct

    path = bench.write_scan(tmp_path / "scan.hspy", (32, 32))

    def band(block: np.ndarray, y0: int, x0: int) -> np.ndarray:
        block = block.copy()
        block[..., :8, :] += 0.5  # detector rows 0-7: k_y < -5 1/Angstrom, outside the crop (rows 16-47)
        return block

    plain = reconstruct(path, "pretrained:study-scan", tmp_path / "plain")
    banded = reconstruct(path, "pretrained:study-scan", tmp_path / "banded", pattern_transform=band)
    np.testing.assert_array_equal(np.load(banded["files"]["potential.npy"]), np.load(plain["files"]["potential.npy"]))
    assert not any("divided" in note for note in banded["notes"]), banded["notes"]
