"""workflow.memory: the memory a sample needs, estimated from the config before simulating."""
from __future__ import annotations

import pytest

from namsa.config import SimulationConfig
from namsa.multislice import MemoryBudgetError
from namsa.sampling import config_sampling
from workflow.memory import GB, cbed_problem, check_fits, largest_square_scan, machine_memory, sample_memory


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
