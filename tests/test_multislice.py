"""Multislice correctness: conservation, vacuum disc, thin-specimen limit, symmetry, convergence,
batching invariance, memory budget, and CPU/GPU agreement (gpu-marked)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from ase.lattice.cubic import Diamond

from namsa import UserError, simulate_cbed
from namsa.constants import interaction_constant, wavelength_A
from namsa.library import get
from namsa.multislice import fresnel_propagator
from namsa.optics import band_limit_mask, probe_fourier, shift_phases
from namsa.potential import build_potential, make_grid
from namsa.supercell import orient_supercell

OPTICS = dict(energy_kv=200.0, semiangle_mrad=20.0)
POSITIONS = np.array([[0.5, 0.7], [2.0, 3.0], [3.3, 1.1]])


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def si110():
    """Si [110], about 11.5 x 10.9 x 23 Angstrom."""
    return orient_supercell(get("Si-diamond"), (1, 1, 0), 8.0, 20.0)


def vacuum(lateral=12.0, thickness=20.0):
    return SimpleNamespace(positions_A=np.zeros((0, 3)), numbers=np.zeros(0, int),
                           cell_A=(lateral, lateral, thickness))


def test_propagator_is_unitary_inside_band_and_composes():
    gpts, sampling = (64, 64), (0.1, 0.1)
    mask = band_limit_mask(gpts, sampling, 2 / 3)
    lam = wavelength_A(200.0)
    p1 = fresnel_propagator(gpts, sampling, 1.0, lam, mask)
    p2 = fresnel_propagator(gpts, sampling, 2.0, lam, mask)
    inside = mask > 0
    np.testing.assert_allclose(np.abs(p1[inside]), 1.0, rtol=1e-6)
    assert np.abs(p1[~inside]).max() == 0
    np.testing.assert_allclose(p1 * p1, p2, atol=1e-5)


def test_vacuum_conserves_intensity_and_gives_the_aperture_disc():
    patterns = simulate_cbed(vacuum(), POSITIONS, sampling_A=0.05, slice_thickness_A=2.0, **OPTICS)
    np.testing.assert_allclose(patterns.sum(axis=(1, 2)), 1.0, rtol=1e-5)
    # every position gives the same disc, centred on k = 0 at index N // 2
    np.testing.assert_allclose(patterns[0], patterns[2], atol=1e-7)
    ny, nx = patterns.shape[1:]
    ky = (np.arange(ny) - ny // 2) / 12.0
    kx = (np.arange(nx) - nx // 2) / 12.0
    k = np.hypot(ky[:, None], kx[None, :])
    lam = wavelength_A(200.0)
    inside = k * lam < 20e-3 - lam / 12.0
    outside = k * lam > 20e-3 + lam / 12.0
    assert patterns[0][outside].max() < 1e-12
    flat = patterns[0][inside]
    np.testing.assert_allclose(flat, flat.mean(), rtol=1e-4)
    centroid = (patterns[0].sum(1) * np.arange(ny)).sum() / patterns[0].sum()
    assert centroid == pytest.approx(ny // 2, abs=1e-4)


def test_intensity_kept_at_adequate_sampling(si110):
    """Through 23 Angstrom of Si at 0.05 Angstrom sampling, >= 99% of the probe stays inside the band limit."""
    patterns, info = simulate_cbed(si110, POSITIONS, sampling_A=0.05, slice_thickness_A=1.92, return_info=True,
                                   **OPTICS)
    assert info["intensity_kept_min"] >= 0.99
    assert info["intensity_kept_min"] == pytest.approx(patterns.sum(axis=(1, 2)).min())
    assert info["transmission_bandlimit_loss"] < 1e-3


def _phase_object_patterns(cell, grid, positions):
    """Phase-object approximation: the whole projected potential in one transmission, no propagation."""
    pot = build_potential(cell.positions_A, cell.numbers, cell.cell_A, grid, 1e6)
    mask = band_limit_mask(grid.gpts, grid.sampling, 2 / 3)
    t = np.fft.ifft2(np.fft.fft2(np.exp(1j * interaction_constant(200.0) * pot.projected_real())) * mask)
    py, px = shift_phases(positions, grid.gpts, grid.sampling)
    psi = np.fft.ifft2(probe_fourier(grid.gpts, grid.sampling, 200.0, 20.0)[None] * py[:, :, None] * px[:, None, :])
    far = np.abs(np.fft.fft2(psi * t) * mask) ** 2 / np.prod(grid.gpts)
    return np.fft.fftshift(far, axes=(-2, -1))


def test_thin_specimen_limit_is_the_phase_object_approximation():
    """One 3.84 A repeat of Si [110] in 8 slices matches the phase-object approximation to 0.5%; four
    repeats do not (the difference grows with thickness, as propagation starts to matter)."""
    errors = []
    for repeats in (1, 4):
        cell = orient_supercell(get("Si-diamond"), (1, 1, 0), 8.0, 3.84 * repeats - 0.1)
        grid = make_grid(cell.cell_A, sampling_A=0.06)
        multislice = simulate_cbed(cell, POSITIONS, gpts=grid.gpts, slice_thickness_A=0.48, **OPTICS)
        errors.append(rel_l2(multislice, _phase_object_patterns(cell, grid, POSITIONS)))
    assert errors[0] < 5e-3
    assert errors[1] > 5 * errors[0]


def test_mirror_plane_of_si110_gives_a_mirror_symmetric_pattern():
    """x runs along [1-10]; the (1-10) plane through an atom column is a mirror of Si [110], so a probe
    on it gives I(ky, kx) = I(ky, -kx). A probe off the plane breaks the symmetry."""
    si = Diamond(directions=[[1, -1, 0], [0, 0, -1], [1, 1, 0]], symbol="Si", latticeconstant=5.431,
                 size=(3, 2, 4))
    x0 = si.positions[0, 0]
    patterns = simulate_cbed(si, [[1.3, x0], [1.3, x0 + 0.7]], sampling_A=0.08, slice_thickness_A=1.92, **OPTICS)
    nx = patterns.shape[2]
    mirrored = patterns[:, :, (2 * (nx // 2) - np.arange(nx)) % nx]   # column of -kx; k = 0 at nx // 2
    on_plane, off_plane = rel_l2(mirrored[0], patterns[0]), rel_l2(mirrored[1], patterns[1])
    assert on_plane < 1e-4
    assert off_plane > 100 * on_plane


def test_convergence_in_slice_thickness_and_sampling(si110):
    """Halving the slice thickness changes patterns by < 1e-4 (relative L2) and halving the pixel size
    by < 2e-3 within the coarse grid's band limit (measured: 2e-6 and 4e-4)."""
    coarse = simulate_cbed(si110, POSITIONS, sampling_A=0.08, slice_thickness_A=1.92, **OPTICS)
    thin = simulate_cbed(si110, POSITIONS, sampling_A=0.08, slice_thickness_A=0.96, **OPTICS)
    assert rel_l2(thin, coarse) < 1e-4
    grid = make_grid(si110.cell_A, sampling_A=0.08)
    ny, nx = grid.gpts
    fine = simulate_cbed(si110, POSITIONS, gpts=(2 * ny, 2 * nx), slice_thickness_A=1.92, **OPTICS)
    # same cell, same k-pixel: the coarse grid is the central ny x nx window of the fine one
    window = fine[:, ny - ny // 2: 2 * ny - ny // 2, nx - nx // 2: 2 * nx - nx // 2]
    inside = np.fft.fftshift(band_limit_mask(grid.gpts, grid.sampling, 2 / 3)) > 0
    assert rel_l2(window * inside, coarse * inside) < 2e-3


def test_batching_and_threads_do_not_change_results(si110):
    pos = np.random.default_rng(0).uniform(0, 8, size=(7, 2))
    one, info_one = simulate_cbed(si110, pos, gpts=64, slice_thickness_A=1.92, workers=1, return_info=True,
                                  **OPTICS)
    many, info_many = simulate_cbed(si110, pos, gpts=64, slice_thickness_A=1.92, workers=2, max_batch=2,
                                    return_info=True, **OPTICS)
    assert (info_one["batch_size"], info_many["batch_size"]) == (7, 2)
    np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-9)


def test_memory_budget_shrinks_the_batch(si110):
    pos = np.zeros((32, 2))
    _, roomy = simulate_cbed(si110, pos, gpts=64, slice_thickness_A=1.92, workers=1, return_info=True, **OPTICS)
    # 12 slices x 64^2: ~1.3 MB shared (potential, transmissions, propagators) + 82 kB per probe
    _, tight = simulate_cbed(si110, pos, gpts=64, slice_thickness_A=1.92, workers=1, return_info=True,
                             memory_budget_gb=0.0016, **OPTICS)
    assert roomy["batch_size"] == 32
    assert 1 <= tight["batch_size"] < 8


def test_cell_too_large_for_memory_budget_is_a_user_error(si110):
    with pytest.raises(UserError, match=r"cell too large for memory.*memory_budget_gb"):
        simulate_cbed(si110, POSITIONS, sampling_A=0.05, slice_thickness_A=1.0, memory_budget_gb=0.001, **OPTICS)


def test_positions_outside_the_cell_are_a_user_error(si110):
    with pytest.raises(UserError, match="inside the cell"):
        simulate_cbed(si110, [[-1.0, 2.0]], gpts=64, slice_thickness_A=2.0, **OPTICS)


@pytest.mark.gpu
def test_cpu_and_gpu_agree_to_float32_precision(si110):
    cpu = simulate_cbed(si110, POSITIONS, sampling_A=0.06, slice_thickness_A=1.92, device="cpu", **OPTICS)
    gpu = simulate_cbed(si110, POSITIONS, sampling_A=0.06, slice_thickness_A=1.92, device="cuda", **OPTICS)
    assert rel_l2(gpu, cpu) < 1e-5
    np.testing.assert_allclose(gpu.sum(axis=(1, 2)), cpu.sum(axis=(1, 2)), rtol=1e-5)
    fast_gpu = simulate_cbed(si110, POSITIONS, sampling_A=0.06, slice_thickness_A=1.92, device="cuda",
                             method="periodic", **OPTICS)
    assert rel_l2(fast_gpu, cpu) < 1e-5


@pytest.mark.gpu
def test_the_batch_plan_holds_what_a_gpu_batch_really_uses(si110):
    """On a real GPU: the bytes one more probe in a batch adds to cupy's memory pool at the peak of its run
    (read in the reducer, when the wave, the exit wave, the intensity and cuFFT's plans with their work
    areas are all alive) stay within namsa.sample_memory.MULTISLICE_BYTES_PER_PROBE_PIXEL."""
    import cupy

    from namsa.sample_memory import MULTISLICE_BYTES_PER_PROBE_PIXEL
    from namsa.scan_simulation import prepare_simulation

    pool = cupy.get_default_memory_pool()
    used = {}
    for batch in (2, 10):
        sim = prepare_simulation(si110, sampling_A=0.06, slice_thickness_A=1.92, device="cuda", method="multislice",
                                 n_positions=batch, max_batch=batch, **OPTICS)
        positions = np.random.default_rng(0).uniform(0.0, 8.0, (batch, 2))
        cupy.fft.config.get_plan_cache().clear()
        pool.free_all_blocks()
        before = pool.used_bytes()
        peak = []
        sim.run(positions, lambda a: peak.append(pool.used_bytes()) or a.sum(axis=0, keepdims=True), device_reducer=True)
        used[batch] = (max(peak) - before, sim.grid.gpts[0] * sim.grid.gpts[1])
    (small, n), (large, _) = used[2], used[10]
    marginal = (large - small) / (8 * n)
    print(f"measured {marginal:.1f} bytes per probe and pixel (plan: {MULTISLICE_BYTES_PER_PROBE_PIXEL})")
    assert marginal <= MULTISLICE_BYTES_PER_PROBE_PIXEL, marginal


def test_periodic_path_reproduces_probe_by_probe_multislice():
    """The plane-wave S-matrix on one tile (namsa.periodic) equals probe-by-probe multislice: to float32
    round-off when the grid divides into tiles, and to ~1e-3 otherwise (the transmission function is then
    sampled on a different grid), with defocus, Cs and tilt."""
    cell = orient_supercell(get("SrTiO3-perovskite"), (0, 0, 1), 8.0, 12.0)
    pos = np.random.default_rng(2).uniform(0, 10, size=(9, 2))
    optics = dict(OPTICS, slice_thickness_A=2.0, aberrations={"C1_A": -40.0, "C3_mm": 1.2}, tilt_mrad=(1.0, -2.0))
    for gpts, tol in (((3 * 48, 3 * 48), 2e-5), ((130, 130), 3e-3)):
        direct = simulate_cbed(cell, pos, gpts=gpts, method="multislice", **optics)
        fast, info = simulate_cbed(cell, pos, gpts=gpts, method="periodic", return_info=True, **optics)
        assert info["method"] == "periodic" and info["n_beams"] > 100
        assert rel_l2(fast, direct) < tol, gpts


def test_auto_picks_the_periodic_path_for_many_probes(si110):
    many = np.random.default_rng(3).uniform(0, 10, size=(400, 2))
    _, info = simulate_cbed(si110, many, gpts=64, slice_thickness_A=2.0, return_info=True, **OPTICS)
    assert info["method"] == "periodic"
    _, info = simulate_cbed(si110, many[:3], gpts=64, slice_thickness_A=2.0, return_info=True, **OPTICS)
    assert info["method"] == "multislice"


def test_periodic_path_only_for_exact_tilings():
    from namsa.periodic import tile_atoms
    from namsa.thermal import thermal_displace

    cell = orient_supercell(get("Si-diamond"), (1, 1, 0), 8.0, 8.0)
    tile = tile_atoms(cell.positions_A, cell.numbers, cell.cell_A, cell.tiling)
    assert tile is not None and len(tile[1]) * cell.tiling[0] * cell.tiling[1] == len(cell.numbers)
    shaken = thermal_displace(cell, np.random.default_rng(0))
    assert tile_atoms(shaken.positions_A, shaken.numbers, shaken.cell_A, shaken.tiling) is None
    _, info = simulate_cbed(shaken, POSITIONS, gpts=64, slice_thickness_A=2.0, return_info=True, **OPTICS)
    assert info["method"] == "multislice"
    with pytest.raises(UserError, match="method='periodic' needs a perfect crystal"):
        simulate_cbed(shaken, POSITIONS, gpts=64, slice_thickness_A=2.0, method="periodic", **OPTICS)


@pytest.mark.slow
def test_periodic_path_matches_multislice_across_the_library():
    """Every library structure, two automatic zone axes each: wherever the supercell is a tiling,
    the periodic path equals probe-by-probe multislice to float32 round-off (measured worst 1e-6)."""
    from namsa.library import list_ids
    from namsa.periodic import tile_atoms
    from namsa.zone_axes import auto_zone_axes

    checked = 0
    for material in list_ids():
        structure = get(material)
        for axis in auto_zone_axes(structure, max_axes=2):
            cell = orient_supercell(structure, axis, 7.0, 5.0)
            if tile_atoms(cell.positions_A, cell.numbers, cell.cell_A, cell.tiling) is None:
                assert cell.tiling[0] * cell.tiling[1] == 1, (material, axis, cell.tiling)
                continue
            kw = dict(OPTICS, sampling_A=0.15, slice_thickness_A=2.0)
            direct = simulate_cbed(cell, POSITIONS, method="multislice", **kw)
            fast = simulate_cbed(cell, POSITIONS, method="periodic", **kw)
            assert rel_l2(fast, direct) < 1e-5, (material, axis)
            checked += 1
    assert checked >= 40
