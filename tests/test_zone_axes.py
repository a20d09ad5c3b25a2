"""Automatic zone axes (namsa.zone_axes): the symmetry-distinct axes a structure is simulated along, and
a structure the planner cannot orient along any of them, recorded as a failure with what would orient it."""
from __future__ import annotations

import numpy as np
import pytest
from pymatgen.core import Lattice, Structure
from pymatgen.io.cif import CifWriter

from namsa import library
from namsa.supercell import orient_supercell
from namsa.zone_axes import auto_zone_axes


def test_auto_zone_axes_for_cubic_si_are_the_001_011_111_families():
    axes = auto_zone_axes(library.get("Si-diamond"))
    assert sorted(tuple(sorted(abs(i) for i in axis)) for axis in axes) == [(0, 0, 1), (0, 1, 1), (1, 1, 1)]
    assert axes == auto_zone_axes("Si-diamond")  # deterministic


def test_auto_zone_axes_are_symmetry_distinct_and_sorted():
    axes = auto_zone_axes("Si-diamond", max_axes=20, max_index=2)
    families = [tuple(sorted(abs(i) for i in axis)) for axis in axes]
    # cubic m-3m: the family is the sorted absolute indices, so no family may repeat
    assert len(families) == len(set(families))
    assert families[:3] == [(0, 1, 1), (0, 0, 1), (1, 1, 1)]  # index 1 first, by repeat a/sqrt2 < a < a sqrt3
    assert (1, 1, 2) in families


@pytest.mark.parametrize("structure_id", ["TiO2-rutile", "MgB2-AlB2", "LiCoO2-layered", "Bi2Se3-tetradymite",
                                          "Al2O3-corundum", "MgAl2O4-spinel"])
def test_auto_zone_axes_prefer_exact_cells_and_always_orient(structure_id):
    axes = auto_zone_axes(structure_id)
    assert len(axes) == 3
    for axis in axes:
        # a small lateral size searches no fewer in-plane vectors than auto_zone_axes did
        assert orient_supercell(structure_id, axis, lateral_A=6.0, thickness_A=3.0).strain == 0.0


def test_auto_zone_axes_for_wurtzite_include_0001():
    axes = auto_zone_axes("GaN-wurtzite")
    assert (0, 0, 1) in axes and len(axes) == 3
    for axis in axes:
        assert orient_supercell("GaN-wurtzite", axis, 12.0, 6.0).strain <= 0.02


def _monazite() -> Structure:
    """Monazite CePO4, P2_1/n (a = 6.788, b = 7.016, c = 6.465 A, beta = 103.38 deg; Ni, Hughes
    and Mariano, Am. Mineral. 80, 21 (1995)): the four general positions of each of 6 sites."""
    sites = [("Ce", (0.2820, 0.1590, 0.1004)), ("P", (0.3046, 0.1635, 0.6124)), ("O", (0.2487, 0.0056, 0.4449)),
             ("O", (0.3826, 0.3310, 0.4973)), ("O", (0.4747, 0.1071, 0.8037)), ("O", (0.1272, 0.2164, 0.7108))]
    species, coords = [], []
    for symbol, (x, y, z) in sites:
        for image in ((x, y, z), (-x, -y, -z), (0.5 - x, 0.5 + y, 0.5 - z), (0.5 + x, 0.5 - y, 0.5 + z)):
            species.append(symbol)
            coords.append(np.mod(image, 1.0))
    return Structure(Lattice.monoclinic(6.788, 7.0163, 6.465, 103.38), species, coords)


def test_a_structure_the_planner_cannot_orient_is_a_recorded_failure(tmp_path):
    from namsa.config import SimulationConfig
    from namsa.plan import plan_samples

    monazite = _monazite()
    assert abs(monazite.density - 5.21) < 0.05                     # the published 5.2 g/cm^3
    assert auto_zone_axes(monazite) == []                          # the path that used to drop it
    CifWriter(monazite).write_file(tmp_path / "monazite.cif")
    plan = plan_samples(SimulationConfig(materials=["Si-diamond"], cif_dir=str(tmp_path)))
    failed = dict(plan.failures)
    assert {s.material_id for s in plan.specs} == {"Si-diamond"} and list(failed) == ["monazite"]
    why = failed["monazite"]
    assert "\n" not in why and "found no usable zone axis" in why and "up to 20 A" in why
    assert "cell_lateral_A to at least 30" in why and "zone_axes, e.g. [[3, 0, 2]]" in why
    # both pieces of advice work: a 30 A cell plans it, and the named axis orients at 12 A
    wide = plan_samples(SimulationConfig(materials=[], cif_dir=str(tmp_path), cell_lateral_A=30.0))
    assert not wide.failures and {s.material_id for s in wide.specs} == {"monazite"}
    for spec in wide.specs:
        assert orient_supercell(monazite, spec.zone_axis, 30.0, 7.0).strain <= 0.02
    assert orient_supercell(monazite, (3, 0, 2), 12.0, 7.0).strain <= 0.02
