"""Issue 32 (C): a structure too large to read and orient is refused before it is built.

pymatgen reads a CIF and finds its primitive cell in time quadratic in the atoms (a 20,000-atom
CIF ran five minutes, then died of a MemoryError), so `namsa.structure_io` counts a CIF's atoms
from its site rows and symmetry operations first and refuses above `MAX_SITES`.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from pymatgen.core import Lattice, Structure
from pymatgen.io.cif import CifFile, CifParser, CifWriter

from namsa import library
from namsa.structure_io import MAX_SITES, StructureError, _cif_site_count, load_cif_dir, load_structure


def _grid_structure(n_side: tuple[int, int, int]) -> Structure:
    """Si atoms on a grid 2 A apart (P1: one CIF row per atom)."""
    grid = np.stack(np.meshgrid(*(np.arange(n) for n in n_side), indexing="ij"), -1).reshape(-1, 3)
    return Structure(Lattice.orthorhombic(*(2.0 * n for n in n_side)), ["Si"] * len(grid), grid / np.array(n_side))


@pytest.fixture(scope="module")
def big_cif_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("big")
    CifWriter(_grid_structure((20, 20, 50))).write_file(folder / "big.cif")   # 20,000 sites
    return folder


def test_a_20000_atom_cif_is_refused_before_pymatgen_builds_it(big_cif_dir):
    with pytest.raises(StructureError, match=r"holds 20,000 atoms, more than the 2,000 namsa reads"):
        load_structure(big_cif_dir / "big.cif")
    structures, failures = load_cif_dir(big_cif_dir)
    assert structures == {} and failures[0][0] == "big.cif" and "unit cell" in failures[0][1]


def test_symmetry_operations_count_toward_the_bound(tmp_path):
    """11 rows of Fm-3m (192 operations; row 6 lies on a mirror, x = y, so 96) are 2,016 atoms."""
    rows = "\n".join(f"Si{i} Si {0.013 + 0.011 * i:.4f} {0.037 + 0.007 * i:.4f} {0.071 + 0.005 * i:.4f} 1"
                     for i in range(11))
    text = (_cubic_header("F m -3 m", 225, 30.0) + "loop_\n_atom_site_label\n_atom_site_type_symbol\n"
            "_atom_site_fract_x\n_atom_site_fract_y\n_atom_site_fract_z\n_atom_site_occupancy\n" + rows + "\n")
    (tmp_path / "fm3m.cif").write_text(text)
    with pytest.raises(StructureError, match=r"holds 2,016 atoms"):
        load_structure(tmp_path / "fm3m.cif")


def _cubic_header(symbol: str, number: int, a: float) -> str:
    return (f"data_x\n_symmetry_space_group_name_H-M '{symbol}'\n_symmetry_Int_Tables_number {number}\n"
            f"_cell_length_a {a}\n_cell_length_b {a}\n_cell_length_c {a}\n"
            "_cell_angle_alpha 90\n_cell_angle_beta 90\n_cell_angle_gamma 90\n")


@pytest.mark.parametrize("material_id", ["Si-diamond", "Cu-fcc", "Mg-hcp", "Fe-bcc"])
def test_the_count_is_what_pymatgen_builds(material_id):
    """Special positions count once (a symmetrised CIF is never refused for its symmetry)."""
    if material_id not in library.list_ids():
        pytest.skip(f"{material_id} is not a library id")
    text = str(CifWriter(library.get(material_id), symprec=0.01))
    parser = CifParser.from_str(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        count = sum(_cif_site_count(parser, block) for block in CifFile.from_str(text).data.values())
        assert count == len(parser.parse_structures(primitive=False)[0])


def test_a_pymatgen_structure_or_ase_atoms_above_the_bound_is_refused():
    big = _grid_structure((MAX_SITES + 1, 1, 1))
    with pytest.raises(StructureError, match=f"holds {MAX_SITES + 1:,} atoms"):
        load_structure(big)
    from pymatgen.io.ase import AseAtomsAdaptor

    with pytest.raises(StructureError, match=f"holds {MAX_SITES + 1:,} atoms"):
        load_structure(AseAtomsAdaptor.get_atoms(big))
    assert len(load_structure(_grid_structure((MAX_SITES, 1, 1)))) == MAX_SITES
