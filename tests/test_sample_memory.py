"""The memory a sample needs: namsa's one model of it (namsa.sample_memory), which the simulator plans its
batches with and workflow.memory holds against the machine before simulating."""
from __future__ import annotations

import pytest

from namsa.config import SimulationConfig
from namsa.multislice import MemoryBudgetError
from namsa.sample_memory import (GB, MIN_BYTES_PER_PROBE_PIXEL, MULTISLICE_BYTES_PER_PROBE_PIXEL,
                                 PERIODIC_BYTES_PER_PROBE_PIXEL, bytes_per_probe, largest_square_scan, sample_memory)
from namsa.sampling import config_sampling
from workflow.memory import cbed_problem, check_fits, machine_memory


def test_the_estimate_is_the_cbed_stack_and_one_wave_per_thread():
    cfg = SimulationConfig(scan_shape=(32, 32), pattern_px=64, target_px=64, cell_lateral_A=12.0, sampling_A=0.1)
    need = sample_memory(cfg, threads=2)
    assert config_sampling(cfg).grid_px[0] == 120  # the grid the estimate takes: namsa's smallest
    assert need.cbed == 2 * 1024 * 64 * 64 * 4  # float32 stack, held twice
    assert need.waves == 2 * 120 * 120 * 12
    assert need.total == need.cbed + need.waves


def test_largest_square_scan_fits_and_one_more_row_does_not():
    cfg = SimulationConfig(pattern_px=32, target_px=32)
    side = largest_square_scan(cfg, 1 * GB)
    fits = SimulationConfig(scan_shape=(side, side), pattern_px=32, target_px=32)
    over = SimulationConfig(scan_shape=(side + 1, side + 1), pattern_px=32, target_px=32)
    assert sample_memory(fits).cbed <= 1 * GB < sample_memory(over).cbed


def test_an_absurd_scan_is_refused_with_a_scan_that_fits():
    total, _ = machine_memory()
    problem = cbed_problem(SimulationConfig(scan_shape=(100000, 100000)), total)
    side = int(problem.split("use a scan of at most ")[1].split("x")[0])
    assert 32 <= side < 100000
    assert sample_memory(SimulationConfig(scan_shape=(side, side))).cbed <= total
    assert cbed_problem(SimulationConfig(), total) is None


def test_check_fits_names_how_many_samples_fit_at_once():
    check_fits(SimulationConfig())  # the quickstart's sample fits any machine that runs these tests
    cfg = SimulationConfig(memory_budget_gb=1e-6)  # a million budgets still fit: the samples do not
    with pytest.raises(MemoryBudgetError, match=r"1000000 sample\(s\) at once .* run at most \d+ at once"):
        check_fits(cfg, parallel=1_000_000)


def test_a_memory_budget_beyond_the_machine_is_refused_with_what_fits():
    total, _ = machine_memory()
    budget = 2 * total / GB
    with pytest.raises(MemoryBudgetError, match=r"more than this machine's .* set it to at most"):
        check_fits(SimulationConfig(memory_budget_gb=budget))
    check_fits(SimulationConfig(memory_budget_gb=0.4 * total / GB), parallel=2)


def test_the_simulator_plans_its_batches_with_the_model_the_estimate_uses():
    """One memory model: the multislice plan (namsa.multislice.plan_batch) and the periodic plan
    (namsa.scan_simulation._periodic_batch) take their bytes per probe from namsa.sample_memory, and the
    estimate before a run (which does not know the path yet) is the lesser of the two."""
    from namsa.backend import get_backend
    from namsa.multislice import plan_batch
    from namsa.potential import make_grid
    from namsa.scan_simulation import _periodic_batch

    gpts = (96, 96)
    per_multislice, per_periodic = bytes_per_probe(gpts), bytes_per_probe(gpts, "periodic")
    assert (per_multislice, per_periodic) == (96 * 96 * MULTISLICE_BYTES_PER_PROBE_PIXEL,
                                              96 * 96 * PERIODIC_BYTES_PER_PROBE_PIXEL)
    shared = 4 * 96 * 96 * 8   # no slices, the propagators only
    assert plan_batch(100, gpts, 0, shared + 5 * per_multislice) == 5
    assert plan_batch(100, gpts, 0, shared + 6 * per_multislice - 1) == 5
    grid = make_grid((12.0, 12.0, 4.0), gpts=96)
    assert grid.gpts == gpts
    assert _periodic_batch(get_backend("cpu"), grid, 100, 7 * per_periodic, threads=1) == 7
    cfg = SimulationConfig(gpts=96, cell_lateral_A=12.0)
    assert sample_memory(cfg, threads=3).waves == 3 * bytes_per_probe(gpts, "periodic")
    assert MIN_BYTES_PER_PROBE_PIXEL == min(MULTISLICE_BYTES_PER_PROBE_PIXEL, PERIODIC_BYTES_PER_PROBE_PIXEL)
