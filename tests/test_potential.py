"""Kirkland table, Fourier-space projected potentials, slicing, transmission functions, targets."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from namsa import UserError, kirkland
from namsa.constants import FE_TO_POTENTIAL_V_A2, interaction_constant
from namsa.library import get
from namsa.potential import (assign_slices, build_potential, make_grid, slice_edges_A,
                             transmission_functions)
from namsa.supercell import orient_supercell
from namsa.targets import density_coefficients, evaluate_fourier_series, projected_density_map, target_fwhm_A


def _single_atom(z: int, box: float = 12.0, sampling: float = 0.04, xy=(6.0, 6.0)):
    grid = make_grid((box, box, 2.0), sampling_A=sampling)
    pos = np.array([[xy[0], xy[1], 1.0]])
    return grid, build_potential(pos, np.array([z]), (box, box, 2.0), grid, 2.0)


def test_table_matches_independent_copy():
    """Every one of the 103 x 12 values agrees with abTEM's copy of Kirkland's table (read at test
    time only; abTEM rounds some values to 6 significant digits, hence 1e-4)."""
    spec = importlib.util.find_spec("abtem")   # locate the data file without importing abTEM (slow)
    if spec is None:
        pytest.skip("abTEM (dev extra) not installed")
    ref = json.loads((Path(spec.origin).parent / "parametrizations/data/kirkland.json").read_text())
    assert len(ref) == kirkland.MAX_Z
    for z in range(1, kirkland.MAX_Z + 1):
        np.testing.assert_allclose(kirkland.parameters(z), np.array(ref[kirkland.symbol(z)]), rtol=1e-4,
                                   err_msg=kirkland.symbol(z))


def test_unknown_element_is_a_user_error():
    with pytest.raises(UserError, match="Z must be 1..103"):
        kirkland.parameters(104)


def test_mott_bethe_gives_z_at_zero_and_decays():
    for z in (1, 8, 14, 38, 79):
        assert kirkland.xray_form_factor(z, 0.0) == pytest.approx(z)
        assert abs(kirkland.xray_form_factor(z, 2.0)) < 0.5 * z


def test_fourier_potential_matches_real_space_formula():
    """The Fourier-series potential of one atom equals Kirkland's closed form v_z(r) away from the core."""
    grid, pot = _single_atom(14)
    v = pot.projected_real()
    y = np.arange(grid.gpts[0]) * grid.sampling[0] - 6.0
    x = np.arange(grid.gpts[1]) * grid.sampling[1] - 6.0
    r = np.hypot(y[:, None], x[None, :])
    ring = (r > 0.5) & (r < 2.5)   # inside 0.5 A the Fourier series is truncated at Nyquist
    expected = kirkland.projected_potential_real(14, r[ring])
    np.testing.assert_allclose(v[ring], expected, rtol=3e-3, atol=0.05)


def test_integrated_potential_is_the_k0_scattering_factor():
    grid, pot = _single_atom(79)
    total = pot.projected_real().sum() * grid.sampling[0] * grid.sampling[1]
    assert total == pytest.approx(FE_TO_POTENTIAL_V_A2 * kirkland.electron_scattering_factor(79, 0.0), rel=1e-9)


def test_subpixel_positions_and_periodic_wrap():
    """A shift by a fraction of a pixel moves the potential continuously; x and x + Lx are the same atom."""
    grid, a = _single_atom(8, sampling=0.1, xy=(6.0, 6.0))
    _, b = _single_atom(8, sampling=0.1, xy=(6.03, 6.0))
    _, c = _single_atom(8, sampling=0.1, xy=(6.03 + 12.0, 6.0 - 12.0))
    va, vb, vc = a.projected_real(), b.projected_real(), c.projected_real()
    assert 0 < np.abs(vb - va).max() < 0.2 * va.max()
    np.testing.assert_allclose(vc, vb, atol=1e-9 * vb.max())
    # centre of mass moves by exactly the shift
    xs = np.arange(va.shape[1]) * grid.sampling[1]
    com = lambda v: (v.sum(0) * xs).sum() / v.sum()  # noqa: E731
    assert com(vb) - com(va) == pytest.approx(0.03, abs=1e-4)


def test_slicing_assigns_atoms_by_centre_and_sums_to_projection():
    edges = slice_edges_A(10.0, 2.1)
    assert len(edges) - 1 == 5 and np.diff(edges) == pytest.approx(2.0)
    np.testing.assert_array_equal(assign_slices(np.array([0.0, 1.99, 2.0, 9.99, 10.0]), edges), [0, 0, 1, 4, 0])
    cell = orient_supercell(get("SrTiO3-perovskite"), (0, 0, 1), 8.0, 8.0)
    grid = make_grid(cell.cell_A, sampling_A=0.2)
    pot = build_potential(cell.positions_A, cell.numbers, cell.cell_A, grid, 1.0)
    summed = sum(pot.slice_real(s) for s in range(pot.n_slices))
    np.testing.assert_allclose(summed, pot.projected_real(), atol=1e-9 * summed.max())


def test_density_integrates_to_the_electron_count():
    """The projected electron density over one full cell holds sum(Z) electrons, on the simulation
    grid and on a coarse T x T target grid over the whole cell."""
    cell = orient_supercell(get("SrTiO3-perovskite"), (0, 0, 1), 8.0, 4.0)
    grid = make_grid(cell.cell_A, sampling_A=0.1)
    pot = build_potential(cell.positions_A, cell.numbers, cell.cell_A, grid, 2.0)
    electrons = cell.numbers.sum()
    assert density_coefficients(pot)[0, 0].real * grid.area == pytest.approx(electrons, rel=1e-9)
    fov = (0.0, 0.0, grid.extent[0], grid.extent[1])
    dens = projected_density_map(pot, fov, 24, target_fwhm_A(grid, fov, 24, 200.0, 20.0))   # 2 pixels, 0.98 A
    assert dens.mean() * grid.area == pytest.approx(electrons, rel=1e-5)
    assert dens.max() > 4 * dens.mean()   # peaked on the atom columns, at 0.98 A resolution


def test_fourier_series_evaluation_is_exact_at_grid_points():
    cell = orient_supercell(get("Si-diamond"), (1, 1, 0), 6.0, 4.0)
    grid = make_grid(cell.cell_A, gpts=48)
    pot = build_potential(cell.positions_A, cell.numbers, cell.cell_A, grid, 2.0)
    fov = (0.0, 0.0, grid.extent[0], grid.extent[1])
    on_grid = evaluate_fourier_series(pot.projected_k(), grid, fov, 48)
    np.testing.assert_allclose(on_grid, pot.projected_real(), rtol=1e-4, atol=1e-3)


def test_transmission_band_limited_and_loss_reported():
    cell = orient_supercell(get("SrTiO3-perovskite"), (0, 0, 1), 8.0, 4.0)
    sigma = interaction_constant(200.0)
    losses = []
    for sampling in (0.05, 0.3):
        grid = make_grid(cell.cell_A, sampling_A=sampling)
        pot = build_potential(cell.positions_A, cell.numbers, cell.cell_A, grid, 2.0)
        t, loss = transmission_functions(pot, sigma, 2 / 3)
        t_k = np.fft.fft2(t[0])
        k = np.hypot(*np.meshgrid(np.fft.fftfreq(grid.gpts[0], grid.sampling[0]),
                                  np.fft.fftfreq(grid.gpts[1], grid.sampling[1]), indexing="ij"))
        outside = k >= 2 / 3 / (2 * max(grid.sampling))
        assert np.abs(t_k[outside]).max() < 1e-3 * np.abs(t_k).max()
        losses.append(loss)
    assert 0 <= losses[0] < 1e-4
    assert losses[1] > 10 * losses[0]   # the coarse grid loses visibly more


def test_grid_from_sampling_covers_the_cell_exactly():
    grid = make_grid((10.0, 7.0, 3.0), sampling_A=0.1)
    assert grid.extent == pytest.approx((7.0, 10.0))
    assert max(grid.sampling) <= 0.1
    with pytest.raises(UserError, match="at least 8"):
        make_grid((1.0, 1.0, 1.0), gpts=4)
