"""Crystal structures in, oriented periodic supercells out.

Units: lengths in Angstrom, angles in degrees. A :class:`Supercell` is an orthorhombic box with
z along the beam (increasing downstream) and periodic in x and y; its ``positions_A`` columns are
(x, y, z). Zone axes are direct-lattice directions [u v w] in the basis of the lattice of the
structure as given (the conventional cell for library structures; hexagonal axes use three
indices, so [0001] is ``(0, 0, 1)``).

The commensurate-cell algorithm, the strain measure, the thickness rule and the thermal
displacement model are described in docs/structures.md.
"""
from __future__ import annotations

import dataclasses
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from pymatgen.core import Element, IStructure, Structure

from . import generator, library
from .errors import UserError

#: default upper bound on the atom count of one supercell (about 100 MB of float64 positions;
#: the paper's 10 x 10 x 20 nm cells hold ~1e5 atoms).
MAX_ATOMS = 2_000_000
#: strains below this are round-off: the cell is exactly orthogonal.
EXACT_STRAIN = 1e-9
#: in-plane cell vectors are searched up to this length at least (Angstrom), and at least up
#: to twice the longest primitive vector and the longest conventional lattice vector ...
MIN_SEARCH_A = 20.0
#: ... and never beyond this length (bounds the search cost; Angstrom).
MAX_SEARCH_A = 50.0
#: in-plane candidates must make at least this angle with the beam (|cos| below the bound).
_MAX_COS_TO_BEAM = 0.3
#: how many candidate in-plane vectors enter the pair search (by angle and by length each) ...
_N_CANDIDATES = 120
#: ... plus all usable vectors up to MIN_SEARCH_A, at most this many (bounds the pair count).
_N_SHORT = 600
#: heaviest element the potential table covers (Kirkland 2010 parameterises Z = 1..103).
MAX_Z = 103


class StructureError(UserError):
    """A structure that cannot be read or used (file, element, occupancy)."""


class ZoneAxisError(UserError):
    """A zone axis that is not a non-zero integer 3-vector, or has no usable periodic cell."""


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------

def load_structure(path_or_id: Any) -> Structure:
    """Load a crystal structure and check that namsa can simulate it.

    ``path_or_id`` is a built-in library id (``namsa.library.list_ids()``), a generated material
    id (``namsa.generator``, e.g. ``"NaCl-rocksalt:K,Br:1.0731"``), a CIF file path (str or Path), a pymatgen ``Structure`` (copied) or an ase ``Atoms`` (converted with
    pymatgen's AseAtomsAdaptor). The result is ordered, holds only real elements with
    Z <= 103, carries no oxidation states, and has ``properties["material_id"]`` set (library
    or generated id, CIF file stem, or the reduced formula).

    Raises :class:`StructureError` (a ``UserError``) for unreadable or malformed CIFs, unknown
    elements, partial occupancies and unknown library ids.
    """
    if isinstance(path_or_id, IStructure):
        structure = Structure.from_sites(path_or_id.sites, properties=dict(path_or_id.properties))
        name = structure.properties.get("material_id") or structure.composition.reduced_formula
    elif _is_ase_atoms(path_or_id):
        structure, name = _from_ase(path_or_id)
    elif isinstance(path_or_id, (str, os.PathLike)):
        structure, name = _from_path_or_id(path_or_id)
    else:
        raise StructureError(
            f"cannot load a structure from a {type(path_or_id).__name__}; pass a library id, a CIF "
            "path, a pymatgen Structure or an ase Atoms")
    return _checked(structure, str(name))


def load_cif_dir(path: str | os.PathLike) -> tuple[dict[str, Structure], list[tuple[str, str]]]:
    """Load every ``*.cif`` file of a directory (e.g. a Materials Project export).

    Returns ``(structures, failures)``: ``structures`` maps the file stem (the stable material
    id, e.g. ``"mp-149"``) to its checked structure, in sorted file-name order; ``failures``
    lists ``(file name, one-line reason)`` for files that could not be used. One bad file never
    stops the others.
    """
    directory = Path(path)
    if not directory.is_dir():
        raise StructureError(f"CIF directory {str(directory)!r} does not exist or is not a directory; "
                             "pass the folder that holds the .cif files")
    structures: dict[str, Structure] = {}
    failures: list[tuple[str, str]] = []
    for file in sorted(p for p in directory.iterdir() if p.suffix.lower() == ".cif" and p.is_file()):
        if file.stem in structures:
            failures.append((file.name, f"duplicate material id {file.stem!r}; rename one of the files"))
            continue
        try:
            structures[file.stem] = load_structure(file)
        except UserError as err:
            failures.append((file.name, str(err)))
    return structures, failures


def _is_ase_atoms(obj: Any) -> bool:
    try:
        from ase import Atoms
    except ImportError:  # ase is a dependency, but keep loading CIFs working without it
        return False
    return isinstance(obj, Atoms)


def _from_ase(atoms: Any) -> tuple[Structure, str]:
    from pymatgen.io.ase import AseAtomsAdaptor

    if not all(atoms.pbc) or abs(atoms.cell.volume) < 1e-6:
        raise StructureError(
            f"ase Atoms {atoms.get_chemical_formula()} is not a periodic 3-D crystal (pbc={list(atoms.pbc)}, "
            f"cell volume {abs(atoms.cell.volume):.3g} A^3); set a full unit cell and pbc=True")
    structure = AseAtomsAdaptor.get_structure(atoms)
    return structure, structure.composition.reduced_formula


def _from_path_or_id(source: str | os.PathLike) -> tuple[Structure, str]:
    path = Path(source)
    if path.is_file():
        return _read_cif(path), path.stem
    if path.is_dir():
        raise StructureError(f"{str(path)!r} is a directory; use namsa.structures.load_cif_dir for a folder of CIFs")
    text = str(source)
    if text in library.list_ids():
        return library.get(text), text
    if generator.is_generated_id(text):
        return generator.build(text), text
    if path.suffix.lower() == ".cif" or os.sep in text or isinstance(source, os.PathLike):
        raise StructureError(f"CIF file {text!r} not found; check the path")
    raise StructureError(f"unknown structure {text!r}: not a library id or an existing file; "
                         f"{library.suggest_ids(text)}")


def _read_cif(path: Path) -> Structure:
    from pymatgen.io.cif import CifParser

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            structures = CifParser(str(path)).parse_structures(primitive=False)
        except Exception as err:  # pymatgen raises many types on malformed files
            hint = _first_warning(caught)
            raise StructureError(
                f"cannot read CIF {str(path)!r} ({type(err).__name__}: {err}{hint}); "
                "check that it is a complete CIF with cell parameters and atom sites, or export it again") from None
    if not structures:
        raise StructureError(f"CIF {str(path)!r} holds no structure; export it again with atom sites")
    structure = structures[0]
    unknown = _unknown_species(structure)
    if unknown:
        raise StructureError(
            f"CIF {str(path)!r} has unknown element symbol(s) {unknown}{_first_warning(caught)}; "
            "fix _atom_site_type_symbol to real element symbols")
    return structure


def _first_warning(caught: Sequence[warnings.WarningMessage]) -> str:
    return f"; pymatgen says: {str(caught[0].message).splitlines()[0][:160]}" if caught else ""


def _unknown_species(structure: Structure) -> list[str]:
    bad = set()
    for site in structure:
        for specie in site.species:
            if not isinstance(getattr(specie, "element", specie), Element):
                bad.add(str(getattr(specie, "symbol", specie)))
    return sorted(bad)


def _checked(structure: Structure, name: str) -> Structure:
    """Refuse what the simulator cannot represent; strip oxidation states; tag the id."""
    if len(structure) == 0:
        raise StructureError(f"structure {name!r} has no atoms; pass a structure with atom sites")
    unknown = _unknown_species(structure)
    if unknown:
        raise StructureError(f"structure {name!r} has unknown species {unknown}; use real element symbols")
    if not structure.is_ordered:
        raise StructureError(
            f"structure {name!r} has partial occupancies ({_disorder_summary(structure)}); order it first, "
            "e.g. with pymatgen's OrderDisorderedStructureTransformation, or pick an ordered structure")
    heavy = sorted({site.specie.symbol for site in structure if site.specie.Z > MAX_Z})
    if heavy:
        raise StructureError(f"structure {name!r} contains {heavy} beyond Z={MAX_Z}, which the Kirkland "
                             "potential table does not cover; remove or substitute those atoms")
    if structure.volume < 1e-3:
        raise StructureError(f"structure {name!r} has a degenerate cell (volume {structure.volume:.3g} A^3)")
    structure = structure.copy()
    structure.remove_oxidation_states()
    structure.properties["material_id"] = name
    return structure


def _disorder_summary(structure: Structure) -> str:
    disordered = [(i, site) for i, site in enumerate(structure) if not site.is_ordered]
    first_index, first = disordered[0]
    return f"{len(disordered)} site(s), e.g. site {first_index}: {first.species.formula}"


# ----------------------------------------------------------------------------------------------
# Zone axes and the commensurate orthogonal cell
# ----------------------------------------------------------------------------------------------

@dataclass
class Supercell:
    """An oriented, orthorhombic supercell, periodic in x and y.

    positions_A: float64 (N, 3), columns (x, y, z) in Angstrom; z along the beam (increasing
                 downstream); x in [0, Lx), y in [0, Ly), z in [0, Lz).
    numbers:     int (N,) atomic numbers.
    cell_A:      (Lx, Ly, Lz) of the box (Angstrom); Lz is the specimen thickness.
    zone_axis:   (u, v, w), reduced by their gcd, in the basis of the input structure's lattice.
    repeat_A:    periodic repeat length of the crystal along the beam (Angstrom).
    strain:      largest principal strain applied to make the cell orthogonal (0 when exact).
    material_id: id of the structure (library id, CIF stem, or formula).
    unit_A:      (ax, by, c) of the commensurate orthogonal cell before tiling (Angstrom).
    tiling:      (nx, ny, nz) repeats of that cell in the box.
    """

    positions_A: np.ndarray
    numbers: np.ndarray
    cell_A: tuple[float, float, float]
    zone_axis: tuple[int, int, int]
    repeat_A: float
    strain: float
    material_id: str | None = None
    unit_A: tuple[float, float, float] | None = None
    tiling: tuple[int, int, int] | None = None

    @property
    def n_atoms(self) -> int:
        return int(self.numbers.shape[0])

    @property
    def thickness_A(self) -> float:
        return float(self.cell_A[2])

    @property
    def elements(self) -> list[str]:
        """Element symbols present, sorted by atomic number."""
        return [Element.from_Z(int(z)).symbol for z in np.unique(self.numbers)]


@dataclass(frozen=True)
class _Cell:
    """A commensurate cell: rows A, B, T of ``index_matrix`` in the primitive basis."""

    index_matrix: np.ndarray   # int (3, 3)
    unit_A: tuple[float, float, float]
    strain: float

    @property
    def area_A2(self) -> float:
        return self.unit_A[0] * self.unit_A[1]


def normalize_zone_axis(zone_axis: Any) -> tuple[int, int, int]:
    """Check that ``zone_axis`` is three integers, not all zero, and divide out their gcd."""
    if isinstance(zone_axis, (str, bytes)):
        raise ZoneAxisError(f"zone axis {zone_axis!r} is a string; give three integer indices, e.g. [1, 1, 0]")
    try:
        values = [float(v) for v in zone_axis]
    except (TypeError, ValueError):
        raise ZoneAxisError(f"zone axis {zone_axis!r} is not a sequence of three integers; "
                            "write it as e.g. [1, 1, 0]") from None
    if len(values) != 3 or any(isinstance(v, bool) for v in zone_axis):
        raise ZoneAxisError(f"zone axis {list(zone_axis)!r} must have three integer indices [u, v, w] "
                            "(hexagonal [0001] is [0, 0, 1])")
    if not all(math.isfinite(v) and v == round(v) for v in values):
        raise ZoneAxisError(f"zone axis {list(zone_axis)!r} has non-integer indices; use the integer "
                            "direction [u, v, w] (multiply through by the common denominator)")
    ints = [int(round(v)) for v in values]
    if ints == [0, 0, 0]:
        raise ZoneAxisError("zone axis [0, 0, 0] is not a direction; give a non-zero [u, v, w], "
                            "e.g. [0, 0, 1], or use 'auto'")
    g = math.gcd(*ints)
    return (ints[0] // g, ints[1] // g, ints[2] // g)


class _Orienter:
    """Lattice geometry shared by :func:`orient_supercell` and :func:`auto_zone_axes`.

    Works on the primitive cell, so centred lattices get their true (shortest) repeats.
    """

    def __init__(self, structure: Structure, search_A: float):
        self.structure = structure
        self.primitive = _primitive(structure)
        self.prim = self.primitive.lattice.matrix                # rows: primitive vectors (A)
        self.to_prim = structure.lattice.matrix @ np.linalg.inv(self.prim)   # given -> primitive indices
        longest_primitive = float(np.max(np.linalg.norm(self.prim, axis=1)))
        longest_given = float(max(structure.lattice.abc))
        self.search_A = float(min(max(search_A, MIN_SEARCH_A, 2.0 * longest_primitive, 1.01 * longest_given),
                                  MAX_SEARCH_A))
        self.indices, self.vectors = _lattice_vectors(self.prim, self.search_A)
        self.lengths = np.linalg.norm(self.vectors, axis=1)

    def beam_indices(self, zone_axis: tuple[int, int, int]) -> np.ndarray:
        """Shortest primitive lattice vector along [uvw] (integer primitive indices)."""
        return _smallest_integer_multiple(np.asarray(zone_axis, float) @ self.to_prim)

    def candidate_cells(self, zone_axis: tuple[int, int, int]) -> list[_Cell]:
        """Commensurate cells with c along the zone axis, best first (see docs/structures.md)."""
        n_t = self.beam_indices(zone_axis)
        t_vec = n_t @ self.prim
        beam = t_vec / np.linalg.norm(t_vec)
        cosines = np.abs(self.vectors @ beam) / self.lengths
        usable = np.flatnonzero(cosines <= _MAX_COS_TO_BEAM)
        if usable.size < 2:
            return []
        # Every usable vector up to MIN_SEARCH_A (so a longer search never loses a cell a shorter
        # one found: auto_zone_axes and orient_supercell agree), plus the most perpendicular ones.
        by_angle = usable[np.lexsort((self.lengths[usable], np.round(cosines[usable], 9)))][:_N_CANDIDATES]
        by_length = usable[np.argsort(self.lengths[usable], kind="stable")]
        short = by_length[self.lengths[by_length] <= MIN_SEARCH_A + 1e-9][:_N_SHORT]
        chosen = np.unique(np.concatenate([by_angle, by_length[:_N_CANDIDATES], short]))
        return _rank_pairs(self.indices[chosen], self.prim, n_t)


def _primitive(structure: Structure) -> Structure:
    """The primitive cell in the same Cartesian frame, or the structure itself if none is found."""
    primitive = structure.get_primitive_structure(tolerance=0.01)
    ratio = structure.lattice.matrix @ np.linalg.inv(primitive.lattice.matrix)
    if np.allclose(ratio, np.round(ratio), atol=1e-6) and len(primitive) * round(abs(np.linalg.det(ratio))) == len(structure):
        return primitive
    return structure  # keeps correctness (a valid lattice); repeats may be longer than necessary


def _lattice_vectors(prim: np.ndarray, max_len: float) -> tuple[np.ndarray, np.ndarray]:
    """All primitive (gcd = 1) lattice vectors up to ``max_len``, one of each +-pair."""
    # |n_i| <= max_len * |b_i| bounds the search, with b_i the reciprocal vectors (no 2 pi).
    bounds = np.floor(max_len * np.linalg.norm(np.linalg.inv(prim), axis=0) + 1e-9).astype(int)
    bounds = np.minimum(bounds, 40)
    axes = [np.arange(-b, b + 1) for b in bounds]
    n = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
    first_nonzero = n[np.arange(len(n)), np.argmax(n != 0, axis=1)]
    n = n[(first_nonzero > 0) & (np.gcd.reduce(n, axis=1) == 1)]
    vectors = n @ prim
    keep = np.linalg.norm(vectors, axis=1) <= max_len + 1e-9
    return n[keep], vectors[keep]


def _smallest_integer_multiple(direction: np.ndarray, max_denominator: int = 48) -> np.ndarray:
    scaled = direction / np.max(np.abs(direction))
    for k in range(1, max_denominator + 1):
        trial = k * scaled
        if np.allclose(trial, np.round(trial), atol=1e-6):
            ints = np.round(trial).astype(int)
            return ints // math.gcd(*ints.tolist())
    raise ZoneAxisError(f"direction {direction.tolist()} is not a lattice direction of the primitive cell")


def _rank_pairs(cands: np.ndarray, prim: np.ndarray, n_t: np.ndarray) -> list[_Cell]:
    """Score every pair (A, B) of candidate in-plane vectors; return cells best first.

    Frame: z along T, x along the part of A perpendicular to T. The ideal orthogonal cell keeps
    A's x component, B's y component and T unchanged, which preserves the projected cell area
    and the beam direction; the strain is max |s - 1| over the singular values s of the map
    from the real cell to the ideal one.
    """
    i, j = np.triu_indices(len(cands), k=1)
    n_a, n_b = cands[i], cands[j]
    det = np.einsum("pi,pi->p", np.cross(n_a, n_b), np.broadcast_to(n_t, n_a.shape))
    keep = det != 0
    n_a, n_b, det = n_a[keep], n_b[keep] * np.sign(det[keep])[:, None], np.abs(det[keep])
    if len(n_a) == 0:
        return []
    t_vec = n_t @ prim
    c = float(np.linalg.norm(t_vec))
    z = t_vec / c
    a_vec, b_vec = n_a @ prim, n_b @ prim
    a_z = a_vec @ z
    a_perp = a_vec - a_z[:, None] * z
    a_x = np.linalg.norm(a_perp, axis=1)
    x = a_perp / a_x[:, None]
    y = np.cross(z, x)
    b_x, b_y, b_z = (np.einsum("pi,pi->p", b_vec, e) for e in (x, y, np.broadcast_to(z, x.shape)))
    b_y = np.maximum(b_y, 1e-12)  # > 0 for det > 0 (right-handed A, B, T); guards round-off only
    # Rows map as ideal = real @ G with G = [[1, 0, -p], [-q, 1, r], [0, 0, 1]] (solved in closed form).
    p, q = a_z / a_x, b_x / b_y
    r = (b_x * p - b_z) / b_y
    # Bounds on the strain max|s - 1|: below by max(|p|, |q|, |r|) / 2 (from 2x2 sub-blocks),
    # above by ||G - I||_F (Weyl). Only pairs that can beat the best upper bound get an SVD.
    lower = 0.5 * np.max(np.abs(np.stack([p, q, r])), axis=0)
    upper = np.sqrt(p ** 2 + q ** 2 + r ** 2)
    contenders = np.flatnonzero(lower <= upper.min() + 2e-4)
    n_a, n_b, a_x, b_y, p, q, r = (v[contenders] for v in (n_a, n_b, a_x, b_y, p, q, r))
    mapping = np.zeros((len(contenders), 3, 3))
    mapping[:, 0, 0] = mapping[:, 1, 1] = mapping[:, 2, 2] = 1.0
    mapping[:, 0, 2], mapping[:, 1, 0], mapping[:, 1, 2] = -p, -q, r
    strain = np.max(np.abs(np.linalg.svd(mapping, compute_uv=False) - 1.0), axis=1)
    strain[strain < EXACT_STRAIN] = 0.0
    area = a_x * b_y
    aspect = np.maximum(a_x, b_y) / np.minimum(a_x, b_y)
    # Exact cells first; then least strain (to 1e-4); then smallest area; then squarest.
    order = np.lexsort((np.round(aspect, 6), np.round(area, 6), np.round(strain, 4), strain > 0))
    return [_Cell(np.stack([n_a[p], n_b[p], n_t]).astype(int), (float(a_x[p]), float(b_y[p]), c), float(strain[p]))
            for p in order[:32]]


def orient_supercell(structure: Structure | Any, zone_axis: Sequence[int], lateral_A: float | Sequence[float],
                     thickness_A: float, *, max_strain: float = 0.02, material_id: str | None = None,
                     max_atoms: int = MAX_ATOMS) -> Supercell:
    """Build an orthorhombic supercell with z along ``zone_axis``, periodic in x and y.

    structure:   anything :func:`load_structure` accepts.
    zone_axis:   direct-lattice direction [u, v, w] (integers; reduced by their gcd).
    lateral_A:   minimum box size in x and y (Angstrom): a number, or (Lx, Ly).
    thickness_A: requested thickness (Angstrom); the box holds the smallest whole number of
                 beam repeats whose length is >= thickness_A (at least one repeat).
    max_strain:  refuse cells that need more strain than this to become orthogonal.
    max_atoms:   refuse boxes with more atoms than this (memory guard).

    Positions keep full float64 precision (never snapped to a grid).
    """
    structure = load_structure(structure)
    material_id = material_id or structure.properties.get("material_id")
    axis = normalize_zone_axis(zone_axis)
    lateral_x, lateral_y = _lateral_pair(lateral_A)
    thickness = _positive("thickness_A", thickness_A)
    _positive("max_strain", max_strain, allow_zero=True)
    orienter = _Orienter(structure, max(lateral_x, lateral_y))
    cell = _choose_cell(orienter, axis, max_strain, material_id)
    ax, by, c = cell.unit_A
    tiling = (_repeats(lateral_x, ax), _repeats(lateral_y, by), _repeats(thickness, c))
    per_cell = len(orienter.primitive) * round(abs(np.linalg.det(cell.index_matrix)))
    n_atoms = per_cell * tiling[0] * tiling[1] * tiling[2]
    if n_atoms > max_atoms:
        raise UserError(
            f"supercell of {material_id} along {list(axis)} would hold {n_atoms:,} atoms "
            f"({tiling[0] * ax:.0f} x {tiling[1] * by:.0f} x {tiling[2] * c:.0f} A), above max_atoms={max_atoms:,}; "
            "reduce cell_lateral_A or thickness_A, or raise max_atoms if memory allows")
    frac, numbers = _cell_contents(orienter.primitive, cell.index_matrix, per_cell)
    positions, numbers = _tile(frac * np.array(cell.unit_A), numbers, cell.unit_A, tiling)
    box = (tiling[0] * ax, tiling[1] * by, tiling[2] * c)
    return Supercell(positions_A=_wrap(positions, box), numbers=numbers, cell_A=box, zone_axis=axis,
                     repeat_A=c, strain=cell.strain, material_id=material_id, unit_A=cell.unit_A,
                     tiling=tiling)


def _choose_cell(orienter: _Orienter, axis: tuple[int, int, int], max_strain: float,
                 material_id: str | None) -> _Cell:
    cells = orienter.candidate_cells(axis)
    if not cells:
        raise ZoneAxisError(
            f"zone axis {list(axis)} of {material_id}: no lattice vectors within {orienter.search_A:.0f} A are "
            "close to perpendicular to the beam; choose a lower-index axis (see auto_zone_axes)")
    feasible = _best_feasible(cells, max_strain)
    if feasible is not None:
        return feasible
    best = cells[0]
    raise ZoneAxisError(
        f"zone axis {list(axis)} of {material_id} needs {100 * best.strain:.2f}% strain to make a periodic "
        f"orthogonal cell (in-plane cell {best.unit_A[0]:.1f} x {best.unit_A[1]:.1f} A, limit max_strain="
        f"{max_strain:g}); choose another zone axis (auto_zone_axes lists good ones), raise max_strain, "
        "or raise the lateral size so that larger commensurate cells are searched")


def _best_feasible(cells: list[_Cell], max_strain: float) -> _Cell | None:
    """The best-ranked cell within ``max_strain`` (ranking buckets strain to 1e-4, so a slightly
    less strained cell may sit below the first), or None."""
    return next((cell for cell in cells if cell.strain <= max_strain), None)


def _lateral_pair(lateral_A: float | Sequence[float]) -> tuple[float, float]:
    if np.ndim(lateral_A) == 0:
        value = _positive("lateral_A", lateral_A)
        return value, value
    values = list(lateral_A)  # type: ignore[arg-type]
    if len(values) != 2:
        raise UserError(f"lateral_A={values!r} must be one number or a pair (Lx, Ly) in Angstrom")
    return _positive("lateral_A", values[0]), _positive("lateral_A", values[1])


def _positive(name: str, value: Any, allow_zero: bool = False) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name}={value!r} is not a number; give a length in Angstrom") from None
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        raise UserError(f"{name}={value!r} must be a finite {'non-negative' if allow_zero else 'positive'} number")
    return number


def _repeats(requested: float, period: float) -> int:
    # Smallest whole number of periods covering the request (tolerant to round-off).
    return max(1, math.ceil(requested / period - 1e-9))


def _cell_contents(primitive: Structure, index_matrix: np.ndarray, expected: int) -> tuple[np.ndarray, np.ndarray]:
    """Fractional coordinates (in the commensurate cell) and atomic numbers of its atoms."""
    supercell = primitive.copy()
    supercell.make_supercell(index_matrix, to_unit_cell=True)
    if len(supercell) != expected:
        raise RuntimeError(f"commensurate cell holds {len(supercell)} atoms, expected {expected}")
    frac = supercell.frac_coords % 1.0
    frac[frac >= 1.0 - 1e-12] = 0.0   # -1e-17 % 1.0 == 1.0 in floating point
    numbers = np.array([site.specie.Z for site in supercell], dtype=np.int64)
    return frac, numbers


def _tile(positions: np.ndarray, numbers: np.ndarray, unit: tuple[float, float, float],
          tiling: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    grid = np.stack(np.meshgrid(*(np.arange(n) for n in tiling), indexing="ij"), axis=-1).reshape(-1, 3)
    offsets = grid * np.array(unit)
    tiled = (offsets[:, None, :] + positions[None, :, :]).reshape(-1, 3)
    return tiled, np.tile(numbers, len(grid))


def _wrap(positions: np.ndarray, box: tuple[float, float, float]) -> np.ndarray:
    lengths = np.array(box)
    wrapped = np.mod(positions, lengths)
    wrapped = np.where(wrapped >= lengths, wrapped - lengths, wrapped)
    return wrapped


# ----------------------------------------------------------------------------------------------
# Automatic zone axes
# ----------------------------------------------------------------------------------------------

def auto_zone_axes(structure: Structure | Any, max_axes: int = 3, max_index: int = 2, *,
                   max_strain: float = 0.02, lateral_A: float = MIN_SEARCH_A) -> list[tuple[int, int, int]]:
    """Low-index zone axes with short beam repeats and small commensurate cells.

    Candidates are all [u v w] with |indices| <= ``max_index``; symmetry-equivalent axes (under
    the point group from pymatgen's SpacegroupAnalyzer, and u v w ~ -u -v -w) count once.
    Axes whose orthogonal cell would need more than ``max_strain`` (searching in-plane vectors
    up to ``lateral_A``) are dropped. Sorted by index order (largest |index|), then exact
    (strain-free) cells before strained ones, then beam repeat, then in-plane cell area;
    deterministic. With the default ``lateral_A``, every returned axis can be oriented by
    :func:`orient_supercell` at any lateral size with the same ``max_strain``.
    """
    structure = load_structure(structure)
    if int(max_axes) < 1 or int(max_index) < 1:
        raise UserError(f"auto_zone_axes needs max_axes >= 1 and max_index >= 1 (got {max_axes}, {max_index})")
    orienter = _Orienter(structure, lateral_A)
    scored = []
    for axis in _distinct_axes(structure, int(max_index)):
        cells = orienter.candidate_cells(axis)
        best = _best_feasible(cells, max_strain)
        if best is not None:
            scored.append((max(abs(i) for i in axis), best.strain > 0, round(best.unit_A[2], 6),
                           round(best.area_A2, 6), axis))
    scored.sort()
    return [axis for *_, axis in scored[: int(max_axes)]]


def _canonical(axis: Iterable[int]) -> tuple[int, int, int]:
    values = [int(v) for v in axis]
    g = math.gcd(*values)
    values = [v // g for v in values]
    first = next(v for v in values if v != 0)
    return tuple(-v for v in values) if first < 0 else tuple(values)  # type: ignore[return-value]


def _distinct_axes(structure: Structure, max_index: int) -> list[tuple[int, int, int]]:
    """One representative per symmetry class: lowest |index|, fewest minus signs, then smallest."""
    from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

    rotations = [op.rotation_matrix for op in
                 SpacegroupAnalyzer(structure, symprec=0.01).get_symmetry_operations(cartesian=False)]
    span = range(-max_index, max_index + 1)
    candidates = sorted({_canonical((u, v, w)) for u in span for v in span for w in span if (u, v, w) != (0, 0, 0)})
    seen: set[tuple[int, int, int]] = set()
    representatives = []
    for axis in candidates:
        if axis in seen:
            continue
        orbit = {_canonical(np.rint(r @ np.array(axis)).astype(int)) for r in rotations} | {axis}
        seen |= orbit
        members = [m for m in orbit if max(abs(i) for i in m) <= max_index]
        representatives.append(min(members, key=lambda m: (max(abs(i) for i in m), sum(i < 0 for i in m), m)))
    return representatives


# ----------------------------------------------------------------------------------------------
# Frozen-phonon thermal displacements
# ----------------------------------------------------------------------------------------------

#: Isotropic Debye-Waller factors B (A^2) near 300 K, rounded to two figures, after
#: L.-M. Peng, G. Ren, S. L. Dudarev and M. J. Whelan, Acta Cryst. A52, 456-470 (1996)
#: (elemental crystals) and H. X. Gao and L.-M. Peng, Acta Cryst. A55, 926-932 (1999).
#: Values for light elements in compounds (O, N, F, S, ...) are typical of oxides/nitrides.
DEBYE_WALLER_B_300K: dict[str, float] = {
    "Li": 2.7, "Be": 0.40, "B": 0.35, "C": 0.15, "N": 0.40, "O": 0.50, "F": 0.80, "Na": 1.8,
    "Mg": 1.6, "Al": 0.86, "Si": 0.46, "P": 0.45, "S": 0.60, "Cl": 1.3, "K": 1.9, "Ca": 0.70,
    "Ti": 0.60, "V": 0.49, "Cr": 0.25, "Mn": 0.40, "Fe": 0.35, "Co": 0.34, "Ni": 0.38, "Cu": 0.55,
    "Zn": 1.0, "Ga": 0.70, "Ge": 0.57, "As": 0.60, "Se": 0.80, "Sr": 0.80, "Zr": 0.45, "Nb": 0.45,
    "Mo": 0.20, "Ru": 0.30, "Pd": 0.47, "Ag": 0.66, "Cd": 1.2, "In": 1.0, "Sn": 0.80, "Sb": 1.0,
    "Te": 1.0, "Ba": 0.70, "Ce": 0.40, "Ta": 0.24, "W": 0.16, "Pt": 0.32, "Au": 0.62, "Pb": 2.0,
    "Bi": 1.3, "Th": 0.40, "U": 0.40,
}
#: B (A^2) for elements not in the table: a mid-range value for room-temperature solids.
DEFAULT_B_A2 = 0.5


def debye_waller_sigma_A(symbol: str) -> float:
    """RMS displacement per axis (Angstrom) at ~300 K: sigma = sqrt(B / (8 pi^2))."""
    b = DEBYE_WALLER_B_300K.get(symbol, DEFAULT_B_A2)
    return math.sqrt(b / (8.0 * math.pi ** 2))


def thermal_displace(supercell: Supercell, rng: np.random.Generator,
                     sigma_A: dict[str, float] | None = None) -> Supercell:
    """One frozen-phonon configuration of ``supercell``.

    Each atom moves by independent Gaussian displacements along x, y and z with per-element RMS
    ``sigma_A[symbol]`` (Angstrom, per axis); elements missing from ``sigma_A`` use the
    Debye-Waller default :func:`debye_waller_sigma_A`. x and y are wrapped into the periodic
    box; z is clipped into [0, Lz) so every atom stays inside the slab. Returns a new Supercell.
    """
    if not isinstance(rng, np.random.Generator):
        raise UserError(f"rng must be a numpy.random.Generator (got {type(rng).__name__}); "
                        "use numpy.random.default_rng(seed)")
    sigma_of_z = _sigma_per_element(supercell, sigma_A or {})
    sigma = sigma_of_z[supercell.numbers]
    moved = supercell.positions_A + rng.standard_normal(supercell.positions_A.shape) * sigma[:, None]
    lx, ly, lz = supercell.cell_A
    moved[:, :2] = _wrap(moved[:, :2], (lx, ly))
    moved[:, 2] = np.clip(moved[:, 2], 0.0, np.nextafter(lz, 0.0))
    return dataclasses.replace(supercell, positions_A=moved)


def _sigma_per_element(supercell: Supercell, overrides: dict[str, float]) -> np.ndarray:
    for symbol, value in overrides.items():
        if not Element.is_valid_symbol(symbol):
            raise UserError(f"sigma_A key {symbol!r} is not an element symbol; use e.g. {{'Si': 0.076}}")
        if not (math.isfinite(float(value)) and float(value) >= 0):
            raise UserError(f"sigma_A[{symbol!r}]={value!r} must be a non-negative RMS displacement in Angstrom")
    table = np.zeros(int(supercell.numbers.max()) + 1)
    for z in np.unique(supercell.numbers):
        symbol = Element.from_Z(int(z)).symbol
        table[z] = float(overrides[symbol]) if symbol in overrides else debye_waller_sigma_A(symbol)
    return table
