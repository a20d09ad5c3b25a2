"""The built-in structure library: every entry builds, is ordered and matches its published data."""
from __future__ import annotations

import pytest
from pymatgen.analysis.structure_matcher import StructureMatcher
from pymatgen.core import Composition, Structure
from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

from namsa import library
from namsa.errors import UserError

# Ids are part of sample identity and dataset splits: once published they never change.
PUBLISHED_IDS = [
    "Al-fcc", "Cu-fcc", "Ni-fcc", "Ag-fcc", "Au-fcc", "Pt-fcc", "Pd-fcc", "Pb-fcc", "Fe-bcc", "W-bcc",
    "Mo-bcc", "Cr-bcc", "Nb-bcc", "Ta-bcc", "Mg-hcp", "Ti-hcp", "Zn-hcp", "Co-hcp", "Zr-hcp",
    "C-diamond", "Si-diamond", "Ge-diamond", "GaAs-zincblende", "GaP-zincblende", "InP-zincblende",
    "InAs-zincblende", "AlAs-zincblende", "ZnS-zincblende", "ZnSe-zincblende", "CdTe-zincblende",
    "SiC-zincblende", "BN-zincblende", "NaCl-rocksalt", "MgO-rocksalt", "KCl-rocksalt", "LiF-rocksalt",
    "NiO-rocksalt", "PbS-rocksalt", "PbTe-rocksalt", "CaO-rocksalt", "TiN-rocksalt",
    "CsCl-cesiumchloride", "SrTiO3-perovskite", "KTaO3-perovskite", "BaZrO3-perovskite",
    "BaSnO3-perovskite", "CaF2-fluorite", "BaF2-fluorite", "SrF2-fluorite", "CeO2-fluorite",
    "UO2-fluorite", "ThO2-fluorite", "TiO2-rutile", "SnO2-rutile", "RuO2-rutile", "MgF2-rutile",
    "MgAl2O4-spinel", "Fe3O4-spinel", "Co3O4-spinel", "Al2O3-corundum", "Fe2O3-corundum",
    "Cr2O3-corundum", "GaN-wurtzite", "ZnO-wurtzite", "AlN-wurtzite", "CdS-wurtzite", "InN-wurtzite",
    "ZnS-wurtzite", "BeO-wurtzite", "C-graphite", "BN-hexagonal", "MoS2-2H", "WS2-2H", "MoSe2-2H",
    "WSe2-2H", "Bi2Se3-tetradymite", "Bi2Te3-tetradymite", "Sb2Te3-tetradymite", "TiS2-CdI2",
    "SnS2-CdI2", "PbI2-CdI2", "MgB2-AlB2", "LiCoO2-layered",
]

# Published densities are measured (CRC) and the lattice data X-ray: a few % apart at most
# (TiN, a non-stoichiometric nitride, is the widest at ~3%).
DENSITY_TOLERANCE = 0.04


def test_library_is_large_and_ids_are_stable():
    ids = library.list_ids()
    assert len(ids) >= 40
    assert len(set(ids)) == len(ids)
    assert ids[: len(PUBLISHED_IDS)] == PUBLISHED_IDS


def test_library_covers_the_common_prototypes():
    prototypes = {library.info(i)["prototype"] for i in library.list_ids()}
    wanted = {"rocksalt", "perovskite", "zincblende", "wurtzite", "fluorite", "rutile", "spinel", "corundum",
              "diamond", "fcc", "bcc", "hcp", "MoS2 (2H)", "graphite (2H)", "hexagonal BN", "tetradymite"}
    assert wanted <= prototypes


@pytest.mark.parametrize("structure_id", library.list_ids())
def test_entry_builds_with_published_composition_symmetry_and_density(structure_id):
    structure = library.get(structure_id)
    meta = library.info(structure_id)
    assert structure.is_ordered
    assert structure.composition == Composition(meta["formula"]) * meta["Z"]
    # spglib (independent of the operation table the structure was built from) finds the group.
    assert SpacegroupAnalyzer(structure, symprec=0.01).get_space_group_number() == meta["spacegroup_number"]
    # No two atoms closer than any real bond (a wrong Wyckoff position would overlap atoms).
    assert structure.distance_matrix[structure.distance_matrix > 0].min() > 1.3
    density = float(structure.density)
    if meta["density_g_cm3"] is None:
        assert 0.5 < density < 25.0
    else:
        assert density == pytest.approx(meta["density_g_cm3"], rel=DENSITY_TOLERANCE)
    assert meta["sources"] and all(isinstance(s, str) and len(s) > 20 for s in meta["sources"])


def test_get_returns_an_independent_copy():
    first = library.get("Si-diamond")
    first.translate_sites(range(len(first)), [0.1, 0.0, 0.0])
    assert (library.get("Si-diamond").frac_coords != first.frac_coords).any()
    assert library.get("Si-diamond").properties["material_id"] == "Si-diamond"


@pytest.mark.parametrize("structure_id", ["GaN-wurtzite", "TiO2-rutile", "Bi2Se3-tetradymite", "C-graphite"])
def test_build_matches_pymatgen_from_spacegroup(structure_id):
    """Same cell as Structure.from_spacegroup (small groups only: its set build is O(n^2) slow)."""
    entry = library._entry(structure_id)
    reference = Structure.from_spacegroup(entry["spacegroup"], library._lattice(entry["lattice"]),
                                          [s[0] for s in entry["sites"]], [s[1] for s in entry["sites"]])
    built = library.get(structure_id)
    assert len(built) == len(reference)
    assert StructureMatcher(ltol=1e-4, stol=1e-4, angle_tol=1e-3, primitive_cell=False, scale=False).fit(built, reference)


def test_info_reports_lattice_parameters():
    meta = library.info("GaN-wurtzite")
    assert meta["formula"] == "GaN" and meta["spacegroup"] == "P6_3mc"
    assert meta["lattice"]["a"] == pytest.approx(3.189) and meta["lattice"]["c"] == pytest.approx(5.185)
    assert meta["lattice"]["gamma"] == pytest.approx(120.0)
    assert meta["n_atoms"] == 4


@pytest.mark.parametrize("bad, hint", [("Si-diamnd", "Si-diamond"), ("GaN", "GaN-wurtzite"), ("srtio3", "SrTiO3-perovskite")])
def test_unknown_id_suggests_close_ids(bad, hint):
    with pytest.raises(UserError, match=hint):
        library.get(bad)
