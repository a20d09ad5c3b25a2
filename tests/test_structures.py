"""Structure loading, zone-axis orientation, commensurate supercells and thermal displacements (the
automatic choice of zone axes: test_zone_axes.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from pymatgen.analysis.structure_matcher import StructureMatcher
from pymatgen.core import Lattice, Structure
from pymatgen.io.cif import CifWriter
from scipy.spatial import cKDTree

from namsa import library
from namsa.errors import UserError
from namsa.structure_io import load_cif_dir, load_structure
from namsa.supercell import Supercell, normalize_zone_axis, orient_supercell
from namsa.thermal import debye_waller_sigma_A, thermal_displace

A_SI = 5.4310  # library lattice parameter of Si (Angstrom)

NACL_CIF = """data_NaCl
_symmetry_space_group_name_H-M 'F m -3 m'
_symmetry_Int_Tables_number 225
_cell_length_a 5.6402
_cell_length_b 5.6402
_cell_length_c 5.6402
_cell_angle_alpha 90
_cell_angle_beta 90
_cell_angle_gamma 90
loop_
_atom_site_label
_atom_site_type_symbol
_atom_site_fract_x
_atom_site_fract_y
_atom_site_fract_z
_atom_site_occupancy
Na1 Na 0 0 0 1
Cl1 Cl 0.5 0.5 0.5 1
"""


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def bulk_number_density(structure_id: str) -> float:
    structure = library.get(structure_id)
    return len(structure) / structure.volume


def neighbour_counts(cell: Supercell, cutoff: float) -> tuple[np.ndarray, np.ndarray]:
    """Neighbours within ``cutoff`` with x, y periodic and z open; (counts, nearest distances)."""
    lx, ly, lz = cell.cell_A
    tree = cKDTree(cell.positions_A, boxsize=[lx, ly, lz + 10 * cutoff])  # z: padded, so open
    distances, _ = tree.query(cell.positions_A, k=17, distance_upper_bound=cutoff)
    found = np.isfinite(distances[:, 1:])
    return found.sum(axis=1), distances[:, 1]


def assert_box_invariants(cell: Supercell) -> None:
    lx, ly, lz = cell.cell_A
    assert cell.positions_A.dtype == np.float64 and cell.positions_A.shape == (cell.n_atoms, 3)
    assert cell.numbers.shape == (cell.n_atoms,)
    assert np.all(cell.positions_A >= 0.0)
    assert np.all(cell.positions_A < np.array([lx, ly, lz]))
    nx, ny, nz = cell.tiling
    assert (lx, ly, lz) == pytest.approx((nx * cell.unit_A[0], ny * cell.unit_A[1], nz * cell.unit_A[2]))


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------

def test_library_id_cif_structure_and_ase_inputs_agree(tmp_path):
    from_id = load_structure("NaCl-rocksalt")
    cif = tmp_path / "nacl.cif"
    cif.write_text(NACL_CIF)
    from_cif = load_structure(cif)
    from_str_path = load_structure(str(cif))
    from_ase = load_structure(bulk("NaCl", "rocksalt", a=5.6402))
    passthrough = load_structure(from_id)
    for structure in (from_cif, from_str_path, from_ase, passthrough):
        assert structure.composition.reduced_formula == "NaCl"
        assert structure.density == pytest.approx(from_id.density, rel=1e-6)
    assert from_id.properties["material_id"] == "NaCl-rocksalt"
    assert from_cif.properties["material_id"] == "nacl"
    # passthrough is a copy: changing it leaves the caller's structure alone
    passthrough.translate_sites([0], [0.25, 0.0, 0.0])
    assert from_id.frac_coords[0] == pytest.approx([0.0, 0.0, 0.0])


def test_oxidation_states_are_stripped():
    structure = library.get("MgO-rocksalt")
    structure.add_oxidation_state_by_element({"Mg": 2, "O": -2})
    loaded = load_structure(structure)
    assert {str(s) for s in loaded.composition} == {"Mg", "O"}


def test_malformed_cif_is_a_user_error(tmp_path):
    bad = tmp_path / "broken.cif"
    bad.write_text("data_x\n_cell_length_a five\nloop_\n_atom_site_label\n")
    with pytest.raises(UserError, match="broken.cif"):
        load_structure(bad)
    truncated = tmp_path / "truncated.cif"
    truncated.write_text(NACL_CIF[:300])
    with pytest.raises(UserError, match="truncated.cif"):
        load_structure(truncated)


def test_unknown_element_is_a_user_error(tmp_path):
    cif = tmp_path / "xx.cif"
    cif.write_text(NACL_CIF.replace("Cl1 Cl", "Xx1 Xx"))
    with pytest.raises(UserError, match="unknown element.*Xx"):
        load_structure(cif)


def test_partial_occupancy_is_refused_with_the_fix(tmp_path):
    cif = tmp_path / "alloy.cif"
    cif.write_text(NACL_CIF.replace("Cl1 Cl 0.5 0.5 0.5 1", "Cl1 Cl 0.5 0.5 0.5 0.5\nBr1 Br 0.5 0.5 0.5 0.5"))
    with pytest.raises(UserError, match="partial occupanc.*OrderDisorderedStructureTransformation"):
        load_structure(cif)
    disordered = Structure(Lattice.cubic(3.6), [{"Cu": 0.5, "Au": 0.5}], [[0, 0, 0]])
    with pytest.raises(UserError, match="partial occupanc"):
        load_structure(disordered)


@pytest.mark.parametrize("source, pattern", [
    ("Si-diamnd", "did you mean Si-diamond"),
    ("no/such/file.cif", "not found"),
    (42, "cannot load a structure from a int"),
])
def test_bad_sources_are_user_errors(source, pattern):
    with pytest.raises(UserError, match=pattern):
        load_structure(source)


def test_directory_and_non_periodic_atoms_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="load_cif_dir"):
        load_structure(tmp_path)
    with pytest.raises(UserError, match="not a periodic 3-D crystal"):
        load_structure(Atoms("H2", positions=[[0, 0, 0], [0, 0, 0.74]]))


def test_load_cif_dir_skips_bad_files_and_loads_the_rest(tmp_path):
    (tmp_path / "mp-22862.cif").write_text(NACL_CIF)
    CifWriter(library.get("GaN-wurtzite")).write_file(tmp_path / "mp-804.cif")
    (tmp_path / "mp-bad.cif").write_text("not a cif at all\n")
    (tmp_path / "mp-alloy.cif").write_text(
        NACL_CIF.replace("Cl1 Cl 0.5 0.5 0.5 1", "Cl1 Cl 0.5 0.5 0.5 0.5\nBr1 Br 0.5 0.5 0.5 0.5"))
    (tmp_path / "README.txt").write_text("ignored: not a CIF")
    structures, failures = load_cif_dir(tmp_path)
    assert list(structures) == ["mp-22862", "mp-804"]
    assert structures["mp-804"].composition.reduced_formula == "GaN"
    assert structures["mp-804"].properties["material_id"] == "mp-804"
    assert [name for name, _ in failures] == ["mp-alloy.cif", "mp-bad.cif"]
    assert all(reason and "\n" not in reason for _, reason in failures)
    with pytest.raises(UserError, match="does not exist"):
        load_cif_dir(tmp_path / "missing")


# ---------------------------------------------------------------------------------------------
# orientation and commensurate cells
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis, unit, atoms_per_unit", [
    ((0, 0, 1), (A_SI / math.sqrt(2), A_SI / math.sqrt(2), A_SI), 4),
    ((1, 1, 0), (A_SI / math.sqrt(2), A_SI, A_SI / math.sqrt(2)), 4),
    ((1, 1, 1), (A_SI / math.sqrt(2), A_SI * math.sqrt(6) / 2, A_SI * math.sqrt(3)), 12),
])
def test_si_low_index_axes_give_exact_periodic_cells(axis, unit, atoms_per_unit):
    cell = orient_supercell("Si-diamond", axis, lateral_A=15.0, thickness_A=12.0)
    assert_box_invariants(cell)
    assert cell.strain == 0.0
    assert sorted(cell.unit_A[:2]) == pytest.approx(sorted(unit[:2]), rel=1e-12)
    assert cell.repeat_A == pytest.approx(unit[2], rel=1e-12)
    assert cell.zone_axis == axis and cell.material_id == "Si-diamond"
    assert cell.n_atoms == atoms_per_unit * math.prod(cell.tiling)
    assert all(n * u >= target for n, u, target in zip(cell.tiling, cell.unit_A, (15.0, 15.0, 12.0)))
    # Same number density as bulk Si, so also the same projected (in-plane) density.
    volume = math.prod(cell.cell_A)
    assert cell.n_atoms / volume == pytest.approx(bulk_number_density("Si-diamond"), rel=1e-12)
    # Periodic in x and y: every atom away from the entrance/exit surfaces has exactly four
    # neighbours at the bulk bond length, including across the box edges.
    counts, nearest = neighbour_counts(cell, cutoff=2.6)
    inside = (cell.positions_A[:, 2] > 2.6) & (cell.positions_A[:, 2] < cell.cell_A[2] - 2.6)
    assert inside.sum() > 0
    assert np.all(counts[inside] == 4)
    assert np.allclose(nearest[inside], A_SI * math.sqrt(3) / 4, atol=1e-9)  # never snapped to a grid


@pytest.mark.parametrize("structure_id, atoms_per_unit", [("Mg-hcp", 4), ("GaN-wurtzite", 8), ("MoS2-2H", 12)])
def test_hexagonal_0001_gives_exact_a_by_a_sqrt3_rectangle(structure_id, atoms_per_unit):
    meta = library.info(structure_id)
    a, c = meta["lattice"]["a"], meta["lattice"]["c"]
    cell = orient_supercell(structure_id, (0, 0, 1), lateral_A=12.0, thickness_A=c)
    assert_box_invariants(cell)
    assert cell.strain == 0.0
    assert sorted(cell.unit_A[:2]) == pytest.approx([a, a * math.sqrt(3)], rel=1e-12)
    assert cell.repeat_A == pytest.approx(c, rel=1e-12) and cell.tiling[2] == 1
    assert cell.n_atoms == atoms_per_unit * cell.tiling[0] * cell.tiling[1]
    projected = cell.n_atoms / (cell.cell_A[0] * cell.cell_A[1])
    assert projected == pytest.approx(bulk_number_density(structure_id) * cell.cell_A[2], rel=1e-12)


def as_periodic_structure(cell: Supercell) -> Structure:
    return Structure(Lattice.orthorhombic(*cell.cell_A), cell.numbers, cell.positions_A, coords_are_cartesian=True)


def beam_layer_heights(structure: Structure, axis: tuple[int, int, int], repeat: float) -> dict[int, np.ndarray]:
    """Distinct heights (mod the repeat) of every element's atoms along the zone axis, from a block
    of bulk cells: an independent picture of the layering the beam should see."""
    beam = np.asarray(axis, float) @ structure.lattice.matrix
    beam /= np.linalg.norm(beam)
    shifts = np.stack(np.meshgrid(*[np.arange(-2, 3)] * 3, indexing="ij"), -1).reshape(-1, 3)
    heights = {}
    for z in {site.specie.Z for site in structure}:
        frac = np.array([site.frac_coords for site in structure if site.specie.Z == z])
        cart = ((frac[None] + shifts[:, None]).reshape(-1, 3)) @ structure.lattice.matrix
        heights[z] = np.unique(np.round((cart @ beam) % repeat, 6) % round(repeat, 6))
    return heights


def same_layers_up_to_shift(expected: dict[int, np.ndarray], found: dict[int, np.ndarray], repeat: float) -> bool:
    anchor_z = min(expected)
    for shift in found[anchor_z] - expected[anchor_z][0]:
        if all(len(expected[z]) == len(found[z]) and np.allclose(
                np.sort((expected[z] + shift) % repeat), np.sort(found[z] % repeat), atol=1e-5) for z in expected):
            return True
    return False


@pytest.mark.parametrize("structure_id, axis", [
    ("Si-diamond", (1, 1, 1)), ("GaN-wurtzite", (1, -1, 0)), ("MgAl2O4-spinel", (0, 1, 1)),
    ("Al2O3-corundum", (1, 0, 0)), ("Bi2Se3-tetradymite", (0, 0, 1)), ("TiO2-rutile", (1, 1, 0)),
    ("SrTiO3-perovskite", (1, 1, 1)), ("C-graphite", (0, 1, 0)),
])
def test_oriented_cell_is_the_crystal_viewed_along_the_axis(structure_id, axis):
    bulk_structure = library.get(structure_id)
    cell = orient_supercell(structure_id, axis, lateral_A=1.0, thickness_A=0.1)  # one commensurate cell
    assert cell.strain == 0.0 and cell.tiling == (1, 1, 1)
    # a strain-free oriented cell is a true supercell of the crystal (pymatgen's matcher, no scaling) ...
    matcher = StructureMatcher(ltol=1e-3, stol=1e-3, angle_tol=0.1, primitive_cell=True, scale=False)
    assert matcher.fit(as_periodic_structure(cell), bulk_structure)
    # ... and its z axis is the zone axis: the atomic layers along z are the bulk's along [uvw]
    expected = beam_layer_heights(bulk_structure, axis, cell.repeat_A)
    found = {int(z): np.unique(np.round(cell.positions_A[cell.numbers == z, 2], 6)) for z in np.unique(cell.numbers)}
    assert same_layers_up_to_shift(expected, found, cell.repeat_A)


def test_centred_lattices_use_their_true_repeat():
    # fcc: [110] repeats every a/sqrt(2), not a*sqrt(2); corundum (R-centred) [001] every c.
    assert orient_supercell("Cu-fcc", (1, 1, 0), 8.0, 5.0).repeat_A == pytest.approx(3.6149 / math.sqrt(2))
    assert orient_supercell("Al2O3-corundum", (0, 0, 1), 10.0, 5.0).repeat_A == pytest.approx(12.991)


def test_equivalent_axis_spellings_give_the_same_cell():
    reduced = orient_supercell("SrTiO3-perovskite", (1, 1, 0), 10.0, 10.0)
    multiple = orient_supercell("SrTiO3-perovskite", (2, 2, 0), 10.0, 10.0)
    floats = orient_supercell("SrTiO3-perovskite", [1.0, 1.0, 0.0], 10.0, 10.0)
    assert multiple.zone_axis == floats.zone_axis == (1, 1, 0)
    assert np.array_equal(reduced.positions_A, multiple.positions_A)
    assert np.array_equal(reduced.positions_A, floats.positions_A)


def test_thickness_is_the_smallest_whole_number_of_repeats_covering_it():
    assert orient_supercell("Si-diamond", (0, 0, 1), 8.0, 5 * A_SI).tiling[2] == 5
    assert orient_supercell("Si-diamond", (0, 0, 1), 8.0, 5 * A_SI + 0.1).tiling[2] == 6
    assert orient_supercell("Si-diamond", (0, 0, 1), 8.0, 0.5).tiling[2] == 1


def test_lateral_pair_sets_x_and_y_separately():
    cell = orient_supercell("Si-diamond", (0, 0, 1), (8.0, 20.0), 5.0)
    assert cell.cell_A[0] >= 8.0 and cell.cell_A[0] < 8.0 + cell.unit_A[0]
    assert cell.cell_A[1] >= 20.0 and cell.cell_A[1] < 20.0 + cell.unit_A[1]


def test_awkward_axis_reports_strain_and_is_refused_above_the_limit():
    # Wurtzite [101]: no exactly orthogonal cell exists (c^2/a^2 is irrational), only approximants.
    cell = orient_supercell("GaN-wurtzite", (1, 0, 1), lateral_A=20.0, thickness_A=10.0)
    assert 1e-4 < cell.strain <= 0.02
    assert_box_invariants(cell)
    # The strain map stretches every vector by a factor within [1 - strain, 1 + strain], so the
    # shortest Ga-N bond (basal: sqrt(a^2/3 + (1/2 - u)^2 c^2); axial u c is longer) stays in that band.
    a, c, u = 3.189, 5.185, 0.377
    shortest_bond = min(u * c, math.sqrt(a ** 2 / 3 + ((0.5 - u) * c) ** 2))
    _, nearest = neighbour_counts(cell, cutoff=2.5)
    inside = (cell.positions_A[:, 2] > 2.5) & (cell.positions_A[:, 2] < cell.cell_A[2] - 2.5)
    assert np.all(nearest[inside] >= shortest_bond * (1 - cell.strain) - 1e-9)
    assert np.all(nearest[inside] <= shortest_bond * (1 + cell.strain) + 1e-9)
    assert np.ptp(nearest[inside]) > 0  # the strain really changed some bonds
    with pytest.raises(UserError, match=rf"needs {100 * cell.strain:.2f}% strain.*max_strain"):
        orient_supercell("GaN-wurtzite", (1, 0, 1), lateral_A=20.0, thickness_A=10.0, max_strain=cell.strain / 2)


@pytest.mark.parametrize("axis, pattern", [
    ((0, 0, 0), r"\[0, 0, 0\]"),
    ((1, 0.5, 0), "non-integer"),
    ((1, 0), "three integer"),
    ((1, 0, 0, 0), "three integer"),
    ("110", "is a string"),
    (None, "not a sequence"),
])
def test_bad_zone_axes_are_user_errors(axis, pattern):
    with pytest.raises(UserError, match=pattern):
        orient_supercell("Si-diamond", axis, 10.0, 10.0)


@pytest.mark.parametrize("kwargs, pattern", [
    ({"lateral_A": -1.0}, "lateral_A"),
    ({"thickness_A": 0.0}, "thickness_A"),
    ({"thickness_A": float("nan")}, "thickness_A"),
    ({"lateral_A": (1.0, 2.0, 3.0)}, "pair"),
])
def test_bad_sizes_are_user_errors(kwargs, pattern):
    args = {"lateral_A": 10.0, "thickness_A": 10.0} | kwargs
    with pytest.raises(UserError, match=pattern):
        orient_supercell("Si-diamond", (0, 0, 1), **args)


def test_a_cell_too_large_for_memory_is_refused_with_the_count():
    with pytest.raises(UserError, match=r"would hold [\d,]+ atoms.*max_atoms=1,000"):
        orient_supercell("Si-diamond", (0, 0, 1), 30.0, 30.0, max_atoms=1000)
    assert orient_supercell("Si-diamond", (0, 0, 1), 7.0, 5.0, max_atoms=1000).n_atoms == 4 * 2 * 2 * 1


def test_ase_and_cif_inputs_orient_like_the_library(tmp_path):
    reference = orient_supercell("Si-diamond", (1, 1, 0), 12.0, 12.0)
    from_ase = orient_supercell(bulk("Si", "diamond", a=A_SI, cubic=True), (1, 1, 0), 12.0, 12.0)
    cif = tmp_path / "si.cif"
    CifWriter(library.get("Si-diamond")).write_file(cif)
    from_cif = orient_supercell(cif, (1, 1, 0), 12.0, 12.0)
    for cell in (from_ase, from_cif):
        assert cell.n_atoms == reference.n_atoms
        assert cell.cell_A == pytest.approx(reference.cell_A)


# ---------------------------------------------------------------------------------------------
# thermal displacements
# ---------------------------------------------------------------------------------------------

def minimum_image_displacement(before: Supercell, after: Supercell) -> np.ndarray:
    box = np.array(before.cell_A)
    delta = after.positions_A - before.positions_A
    delta[:, :2] -= box[:2] * np.round(delta[:, :2] / box[:2])
    return delta


def test_thermal_displace_has_the_requested_rms_and_stays_in_the_box():
    cell = orient_supercell("GaN-wurtzite", (0, 0, 1), 40.0, 40.0)
    moved = thermal_displace(cell, np.random.default_rng(1), sigma_A={"Ga": 0.10})
    assert_box_invariants(moved)
    assert np.array_equal(moved.numbers, cell.numbers) and moved.cell_A == cell.cell_A
    delta = minimum_image_displacement(cell, moved)
    interior = (cell.positions_A[:, 2] > 1.0) & (cell.positions_A[:, 2] < cell.cell_A[2] - 1.0)  # z unclipped
    for symbol, number, sigma in (("Ga", 31, 0.10), ("N", 7, debye_waller_sigma_A("N"))):
        rows = interior & (cell.numbers == number)
        rms_per_axis = np.sqrt(np.mean(delta[rows] ** 2, axis=0))
        assert rms_per_axis == pytest.approx([sigma] * 3, rel=0.08), symbol
    assert not np.shares_memory(moved.positions_A, cell.positions_A)


def test_thermal_displace_defaults_follow_debye_waller_b():
    assert debye_waller_sigma_A("Si") == pytest.approx(math.sqrt(0.46 / (8 * math.pi ** 2)))
    assert debye_waller_sigma_A("Og") == pytest.approx(math.sqrt(0.5 / (8 * math.pi ** 2)))  # untabulated
    cell = orient_supercell("Si-diamond", (1, 1, 0), 30.0, 30.0)
    first = thermal_displace(cell, np.random.default_rng(7))
    again = thermal_displace(cell, np.random.default_rng(7))
    other = thermal_displace(cell, np.random.default_rng(8))
    assert np.array_equal(first.positions_A, again.positions_A)
    assert not np.array_equal(first.positions_A, other.positions_A)
    interior = (cell.positions_A[:, 2] > 1.0) & (cell.positions_A[:, 2] < cell.cell_A[2] - 1.0)
    rms = np.sqrt(np.mean(minimum_image_displacement(cell, first)[interior] ** 2))
    assert rms == pytest.approx(debye_waller_sigma_A("Si"), rel=0.08)


@pytest.mark.parametrize("kwargs, pattern", [
    ({"rng": 3}, "numpy.random.Generator"),
    ({"sigma_A": {"Qq": 0.1}}, "not an element"),
    ({"sigma_A": {"Si": -0.1}}, "non-negative"),
])
def test_thermal_displace_bad_inputs(kwargs, pattern):
    cell = orient_supercell("Si-diamond", (0, 0, 1), 8.0, 6.0)
    args = {"rng": np.random.default_rng(0)} | kwargs
    with pytest.raises(UserError, match=pattern):
        thermal_displace(cell, **args)


def test_normalize_zone_axis_reduces_by_gcd():
    assert normalize_zone_axis([0, 0, 4]) == (0, 0, 1)
    assert normalize_zone_axis(np.array([2, -2, 6])) == (1, -1, 3)
