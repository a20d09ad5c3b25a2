"""The simulator's CUDA path, run on the CPU through the strict cupy stand-in (tests/strict_cupy.py).

The stand-in refuses host/device mixing as cupy does, so these tests find every place where the
device path would hand a numpy array to cupy (or a cupy array to numpy); they compare its numbers
with the CPU path's, which says the device code is the same physics. They claim nothing about GPU
speed or about cupy's own kernels: those are covered only on real hardware (``pytest -m gpu``).
"""
from __future__ import annotations

import numpy as np
import pytest

import strict_cupy
from namsa.config import SimulationConfig
from namsa.detector import pattern_rebinner
from namsa.library import get
from namsa.sample_memory import MULTISLICE_BYTES_PER_PROBE_PIXEL, bytes_per_probe
from namsa.scan_simulation import prepare_simulation
from namsa.supercell import orient_supercell

OPTICS = dict(energy_kv=200.0, semiangle_mrad=20.0)
POSITIONS = np.array([[0.5, 0.7], [2.0, 3.0], [3.3, 1.1], [4.0, 4.4], [1.2, 5.0]])


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def si110():
    """Si [110], about 11.5 x 10.9 x 8 Angstrom: a perfect tiling, so both paths apply."""
    return orient_supercell(get("Si-diamond"), (1, 1, 0), 8.0, 8.0)


def _patterns(structure, device: str, method: str, pattern_px: int = 24, **kw):
    """(full FFT-order intensities, rebinned patterns, kept sums, Simulation) on ``device``."""
    sim = prepare_simulation(structure, sampling_A=0.1, slice_thickness_A=2.0, device=device, method=method,
                             n_positions=len(POSITIONS), workers=1, **OPTICS, **kw)
    full = np.concatenate(sim.run(POSITIONS, lambda a: a.copy()), axis=0)
    reducer, _ = pattern_rebinner(sim.grid, 2 / 3, pattern_px, sim.backend)
    kept: list[np.ndarray] = []

    def reduce_and_count(intensity):
        kept.append(sim.backend.asnumpy(intensity.sum(axis=(-2, -1))))
        return reducer(intensity)

    rebinned = np.concatenate(sim.run(POSITIONS, reduce_and_count, device_reducer=True), axis=0)
    return full, rebinned, np.concatenate(kept), sim


@pytest.mark.parametrize("method", ["multislice", "periodic"])
def test_the_cuda_path_on_the_strict_stand_in_matches_the_cpu(monkeypatch, si110, method):
    cpu_full, cpu_rebinned, cpu_kept, cpu_sim = _patterns(si110, "cpu", method)
    strict_cupy.install(monkeypatch)
    # max_batch=2: several batches come home through the one reused pinned staging buffer
    dev_full, dev_rebinned, dev_kept, dev_sim = _patterns(si110, "cuda", method, max_batch=2)
    assert dev_sim.method == cpu_sim.method == method and dev_sim.backend.name == "cuda:0"
    assert isinstance(dev_rebinned, np.ndarray) and dev_rebinned.dtype == np.float32
    assert rel_l2(dev_full, cpu_full) < 1e-5
    assert rel_l2(dev_rebinned, cpu_rebinned) < 1e-5
    np.testing.assert_allclose(dev_kept, cpu_kept, rtol=1e-5)


def test_potential_and_transmissions_are_built_on_the_device(monkeypatch, si110):
    """On a GPU backend the potential slices and transmission functions are made there in complex64
    (namsa.potential.device_transmissions), equal to the host's complex128 ones to float32 round-off."""
    from namsa.constants import interaction_constant
    from namsa.optics import band_limit_mask
    from namsa.potential import build_potential, device_transmissions, make_grid, transmission_functions

    cpu_sim = prepare_simulation(si110, sampling_A=0.1, method="multislice", **OPTICS)
    strict_cupy.install(monkeypatch)
    dev_sim = prepare_simulation(si110, sampling_A=0.1, method="multislice", device="cuda", **OPTICS)
    assert cpu_sim.info["potential_built_on"] == "host" and dev_sim.info["potential_built_on"] == "device"
    assert dev_sim.transmissions.dtype == np.complex64 and isinstance(dev_sim.transmissions, strict_cupy.DeviceArray)
    t_dev = dev_sim.backend.asnumpy(dev_sim.transmissions)
    assert rel_l2(t_dev, cpu_sim.transmissions) < 1e-5
    assert abs(dev_sim.transmission_loss - cpu_sim.transmission_loss) < 1e-5
    np.testing.assert_allclose(dev_sim.potential.projected_real(), cpu_sim.potential.projected_real(),
                               rtol=1e-5, atol=1e-4 * np.abs(cpu_sim.potential.projected_real()).max())
    # and the builder itself on the numpy backend (xp = numpy), against the complex128 route
    from namsa.backend import get_backend

    grid, sigma = make_grid(si110.cell_A, 0.1), interaction_constant(200.0)
    built = device_transmissions(si110.positions_A, si110.numbers, si110.cell_A, grid, 2.0, sigma,
                                 band_limit_mask(grid.gpts, grid.sampling, 2 / 3), get_backend("cpu", "scipy"))
    host, _ = transmission_functions(build_potential(si110.positions_A, si110.numbers, si110.cell_A, grid, 2.0),
                                     sigma, 2 / 3)
    assert built.transmissions.dtype == np.complex64 and rel_l2(built.transmissions, host) < 1e-5


def test_gpu_batches_follow_the_free_device_memory_not_a_fixed_cap(monkeypatch, si110):
    strict_cupy.install(monkeypatch)
    many = 1024
    roomy = prepare_simulation(si110, sampling_A=0.1, method="multislice", device="cuda", n_positions=many,
                               memory_budget_gb=64.0, **OPTICS)
    assert roomy.batch_size == many   # 12 GiB free: all 1024 probes in one batch, not 64
    monkeypatch.setattr(strict_cupy._Device, "free_bytes", 400 << 20)
    tight = prepare_simulation(si110, sampling_A=0.1, method="multislice", device="cuda", n_positions=many,
                               memory_budget_gb=64.0, **OPTICS)
    per_probe = bytes_per_probe(tight.grid.gpts)
    assert 64 < tight.batch_size < many and tight.batch_size * per_probe < 0.8 * (400 << 20)
    cpu = prepare_simulation(si110, sampling_A=0.1, method="multislice", n_positions=many, workers=1, **OPTICS)
    assert cpu.batch_size <= 64   # the CPU keeps its cache-sized cap


@pytest.mark.parametrize("phonons", [False, True])   # the periodic and the multislice path of a sample
def test_a_sample_simulated_on_the_stand_in_matches_the_cpu_sample(monkeypatch, phonons):
    """simulate_sample with device="cuda": potential, rebinning and kept-sum on the 'device', only the
    (S, P, P) float32 patterns come home; the sample equals the CPU one to float32 round-off."""
    from namsa.simulate import simulate_sample

    physics = dict(scan_shape=(8, 8), pattern_px=16, target_px=16, cell_lateral_A=12.0, thickness_A=12.0,
                   variations={"frozen_phonon": phonons})
    cpu = simulate_sample("Si-diamond", (1, 1, 0), SimulationConfig(**physics))
    strict_cupy.install(monkeypatch)
    dev = simulate_sample("Si-diamond", (1, 1, 0), SimulationConfig(**physics, device="cuda"))
    assert dev.meta.method == cpu.meta.method == ("multislice" if phonons else "periodic")
    assert dev.id == cpu.id and dev.cbed.dtype == np.float32 and dev.cbed.shape == cpu.cbed.shape
    assert rel_l2(dev.cbed, cpu.cbed) < 1e-5
    assert rel_l2(dev.potential, cpu.potential) < 1e-5 and rel_l2(dev.density, cpu.density) < 1e-5
    assert dev.meta.intensity_kept_min == pytest.approx(cpu.meta.intensity_kept_min, rel=1e-5)


def test_fft_friendly_grids_are_5_smooth_and_enter_the_physics_hash_only_when_on():
    from namsa.potential import make_grid, smooth_fft_length

    assert [smooth_fft_length(n) for n in (7, 13, 19, 97, 247, 1001)] == [8, 15, 20, 100, 250, 1024]
    # a 19 x 13 tiling (paper-sized cells have such factors): off, a multiple of the tiling with 2^a 3^b
    # per tile; on, every side 5-smooth
    cell, tiling = (19 * 5.431, 13 * 7.68, 20.0), (19, 13, 1)
    plain = make_grid(cell, 0.1, tiling=tiling)
    smooth = make_grid(cell, 0.1, tiling=tiling, fft_friendly=True)
    assert plain.gpts == (13 * 81, 19 * 64)
    assert all(smooth_fft_length(n) == n and n >= c / 0.1 for n, c in zip(smooth.gpts, (cell[1], cell[0])))
    assert make_grid((10.0, 10.0, 5.0), 0.1, tiling=(4, 4, 1), fft_friendly=True).gpts == (100, 100)
    assert make_grid(cell, gpts=(99, 77), fft_friendly=True).gpts == (99, 77)   # explicit gpts win
    from namsa.simulate import simulate_sample

    small = dict(scan_shape=(2, 2), pattern_px=8, target_px=8, cell_lateral_A=6.0, thickness_A=4.0, sampling_A=0.1)
    plain_sample = simulate_sample("Si-diamond", (1, 1, 0), SimulationConfig(**small))
    smooth_sample = simulate_sample("Si-diamond", (1, 1, 0), SimulationConfig(**small, fft_friendly_grid=True))
    assert all(smooth_fft_length(n) == n for n in smooth_sample.meta.gpts)
    assert smooth_sample.meta.gpts != plain_sample.meta.gpts and smooth_sample.id != plain_sample.id
    base = SimulationConfig()
    assert SimulationConfig(fft_friendly_grid=False).physics_hash() == base.physics_hash()
    assert SimulationConfig(fft_friendly_grid=True).physics_hash() != base.physics_hash()


def test_the_paper_and_gpu_node_configs_use_fft_friendly_grids():
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    for name in ("paper.yaml", "gpu-node.yaml"):
        simulation = yaml.safe_load((root / "configs" / name).read_text())["simulation"]
        assert simulation["fft_friendly_grid"] is True, name


def test_probe_and_phase_ramps_are_made_on_the_device(monkeypatch):
    """probe_fourier(backend=GPU) and the probes' phase ramps stay on the device and equal the host's."""
    from namsa.backend import get_backend
    from namsa.multislice import shift_phases_on
    from namsa.optics import probe_fourier, shift_phases

    gpts, sampling = (96, 80), (0.11, 0.13)
    positions = np.array([[0.0, 0.0], [3.3, 7.9], [10.5, 10.3]])
    host_probe = probe_fourier(gpts, sampling, 200.0, 20.0, C1_A=-40.0, C3_mm=1.0)
    host_y, host_x = shift_phases(positions, gpts, sampling)
    strict_cupy.install(monkeypatch)
    backend = get_backend("cuda")
    probe = probe_fourier(gpts, sampling, 200.0, 20.0, C1_A=-40.0, C3_mm=1.0, backend=backend)
    dev_y, dev_x = shift_phases_on(backend, positions, gpts, sampling)
    assert all(isinstance(a, strict_cupy.DeviceArray) for a in (probe, dev_y, dev_x))
    np.testing.assert_allclose(backend.asnumpy(probe), host_probe, rtol=0, atol=1e-12)
    np.testing.assert_allclose(backend.asnumpy(dev_y), host_y, rtol=0, atol=2e-6)
    np.testing.assert_allclose(backend.asnumpy(dev_x), host_x, rtol=0, atol=2e-6)


def test_the_targets_are_computed_on_the_device_and_equal_the_hosts(monkeypatch, si110):
    """targets.smoothed_map(backend=GPU): the Gaussian and the Fourier-series GEMMs run there (complex128,
    the host's formulas), only the (T, T) float32 maps come home; without a backend the host path."""
    from namsa.backend import get_backend
    from namsa.potential import build_potential, make_grid
    from namsa.targets import projected_density_map, projected_potential_map

    potential = build_potential(si110.positions_A, si110.numbers, si110.cell_A, make_grid(si110.cell_A, 0.1),
                                float(si110.cell_A[2]))
    fov = (1.0, 0.5, 6.0, 7.0)
    host = [f(potential, fov, 24, 0.9) for f in (projected_potential_map, projected_density_map)]
    strict_cupy.install(monkeypatch)
    backend = get_backend("cuda")
    strict_cupy.DeviceClock.reset()
    device = [f(potential, fov, 24, 0.9, backend) for f in (projected_potential_map, projected_density_map)]
    assert strict_cupy.DeviceClock.calls > 0   # the stand-in's device ran the work
    for d, h in zip(device, host):
        assert type(d) is np.ndarray and d.dtype == np.float32 and d.shape == (24, 24)
        np.testing.assert_allclose(d, h, rtol=0, atol=1e-6 * np.abs(h).max())


def test_the_bloch_classes_run_as_one_batch_per_slice_on_the_device(monkeypatch):
    """On a GPU the periodic path's Bloch classes propagate together: the device calls of a probe batch
    do not depend on the number of classes, and those of building the exit waves grow by a few per
    class, not by 4 per class and slice (before: at the study's size 2,000-12,000 calls a sample,
    bounded by launches; benchmarks/bench_device_calls.py)."""
    from namsa.scan_simulation import _prepare

    strict_cupy.install(monkeypatch)
    counts = {}
    for lateral in (8.0, 16.0):   # the same slices, 4x the tiles and so 4x the Bloch classes
        cell = orient_supercell(get("Si-diamond"), (1, 1, 0), lateral, 8.0)
        kw = dict(sampling_A=0.1, slice_thickness_A=2.0, device="cuda", method="periodic", n_positions=1,
                  workers=1, **OPTICS)
        strict_cupy.DeviceClock.reset()
        sim = _prepare(cell, **kw)
        built = strict_cupy.DeviceClock.calls
        sim.run(POSITIONS[:1], lambda a: a.copy(), device_reducer=True)   # makes the stacked classes
        strict_cupy.DeviceClock.reset()
        sim.run(POSITIONS[:1], lambda a: a.copy(), device_reducer=True)
        counts[lateral] = (len(sim.periodic.classes), sim.info["n_slices"], built, strict_cupy.DeviceClock.calls)
    (c1, slices, built1, batch1), (c2, slices2, built2, batch2) = counts[8.0], counts[16.0]
    assert c2 >= 2 * c1 and slices2 == slices >= 3
    assert batch2 == batch1
    assert built2 - built1 < 2 * slices * (c2 - c1)   # per class and slice it was 4


def test_the_periodic_probe_phases_are_made_on_the_device(monkeypatch, si110):
    """A probe batch's beam phases (classes x probes x beams) are made on the device: the host only sends
    the positions. The intensities equal those of the former host phases (an einsum and a complex128 exp on
    the host, sent as complex64) to float32 round-off."""
    strict_cupy.install(monkeypatch)
    sim = prepare_simulation(si110, sampling_A=0.1, slice_thickness_A=2.0, device="cuda", method="periodic",
                             n_positions=len(POSITIONS), workers=1, **OPTICS)
    stack, backend = sim.periodic._stacked(), sim.backend
    calls = strict_cupy.DeviceClock.calls
    host_to_device = []
    monkeypatch.setattr(backend, "asarray", lambda a, dtype=None: host_to_device.append(np.shape(a))
                        or backend.xp.asarray(a, dtype=dtype))
    made = backend.asnumpy(stack.intensities(POSITIONS, backend))
    assert host_to_device == [POSITIONS.shape] and strict_cupy.DeviceClock.calls > calls
    beam_k, beam_amp = backend.asnumpy(stack.beam_k).transpose(0, 2, 1), backend.asnumpy(stack.beam_amp)
    phase = np.exp(-2j * np.pi * np.einsum("pd,cbd->cpb", POSITIONS, beam_k)) * beam_amp   # the former host route
    waves = backend.asnumpy(backend.xp.asarray(phase.astype(np.complex64)) @ stack.exit)
    power = ((waves.real ** 2 + waves.imag ** 2) / np.float32(stack.n_pixels)).transpose(1, 0, 2).reshape(len(POSITIONS), -1)
    former = np.zeros((len(POSITIONS), stack.n_pixels + 1), np.float32)
    former[:, backend.asnumpy(stack.target)] = power
    np.testing.assert_allclose(made, former[:, :-1], rtol=0, atol=1e-6 * former.max())


def _batch_peak_bytes(structure, batch: int) -> tuple[float, int]:
    """(peak device bytes a run of one ``batch`` of probes adds, grid pixels) on the stand-in."""
    sim = prepare_simulation(structure, sampling_A=0.1, slice_thickness_A=2.0, device="cuda", method="multislice",
                             n_positions=batch, max_batch=batch, workers=1, **OPTICS)
    positions = np.random.default_rng(0).uniform(0.0, 8.0, (batch, 2))
    strict_cupy.DeviceMemory.reset()
    before = strict_cupy.DeviceMemory.live
    sim.run(positions, lambda a: a.sum(axis=0, keepdims=True), device_reducer=True)
    return strict_cupy.DeviceMemory.peak - before, sim.grid.gpts[0] * sim.grid.gpts[1]


def test_the_batch_plan_holds_what_a_batch_really_keeps_alive(monkeypatch, si110):
    """The multislice batch plan's bytes per probe and pixel (namsa.sample_memory's
    MULTISLICE_BYTES_PER_PROBE_PIXEL) is at least what one more probe in a batch really keeps alive at
    the peak, measured on the stand-in's arrays (each cupy operation's result is an allocation there
    too); it used to count 20 against ~32."""
    strict_cupy.install(monkeypatch)
    (small, n), (large, _) = _batch_peak_bytes(si110, 2), _batch_peak_bytes(si110, 10)
    marginal = (large - small) / (8 * n)   # bytes per probe and pixel
    assert 20 < marginal <= MULTISLICE_BYTES_PER_PROBE_PIXEL, marginal
