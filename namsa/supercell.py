"""Orientation into a periodic supercell: a commensurate orthogonal cell with z along a zone axis
(lattice search and strain ranking, docs/structures.md), tiled to the requested size.

Units: lengths in Angstrom. A :class:`Supercell` is an orthorhombic box with z along the beam
(increasing downstream) and periodic in x and y; its ``positions_A`` columns are (x, y, z). Zone
axes are direct-lattice directions [u v w] in the basis of the lattice of the structure as given
(the conventional cell for library structures; hexagonal axes use three indices, so [0001] is
``(0, 0, 1)``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from pymatgen.core import Element, Structure

from .errors import UserError
from .structure_io import load_structure

#: default upper bound on the atom count of one supercell (about 100 MB of float64 positions;
#: the paper's 10 x 10 x 20 nm cells hold ~1e5 atoms).
MAX_ATOMS = 2_000_000
#: strains below this are round-off: the cell is exactly orthogonal.
EXACT_STRAIN = 1e-9
#: the strain a cell may need to become orthogonal, by default (and in every plan, namsa.zone_axes)
MAX_STRAIN = 0.02
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


class ZoneAxisError(UserError):
    """A zone axis that is not a non-zero integer 3-vector, or has no usable periodic cell."""


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


class Orienter:
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
                     thickness_A: float, *, max_strain: float = MAX_STRAIN, material_id: str | None = None,
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
    orienter = Orienter(structure, max(lateral_x, lateral_y))
    cell = choose_cell(orienter, axis, max_strain, material_id)
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
    return Supercell(positions_A=wrap_positions(positions, box), numbers=numbers, cell_A=box, zone_axis=axis,
                     repeat_A=c, strain=cell.strain, material_id=material_id, unit_A=cell.unit_A,
                     tiling=tiling)


def choose_cell(orienter: Orienter, axis: tuple[int, int, int], max_strain: float,
                material_id: str | None) -> _Cell:
    """The cell `orient_supercell` tiles along ``axis`` (also the plan's check that it can be built,
    `namsa.zone_axes.buildable_axes`); `ZoneAxisError` saying why when there is none."""
    cells = orienter.candidate_cells(axis)
    if not cells:
        raise ZoneAxisError(
            f"zone axis {list(axis)} of {material_id}: no lattice vectors within {orienter.search_A:.0f} A are "
            "close to perpendicular to the beam; choose a lower-index axis (see auto_zone_axes)")
    feasible = best_feasible(cells, max_strain)
    if feasible is not None:
        return feasible
    best = cells[0]
    raise ZoneAxisError(
        f"zone axis {list(axis)} of {material_id} needs {100 * best.strain:.2f}% strain to make a periodic "
        f"orthogonal cell (in-plane cell {best.unit_A[0]:.1f} x {best.unit_A[1]:.1f} A, limit max_strain="
        f"{max_strain:g}); choose another zone axis (auto_zone_axes lists good ones), raise max_strain, "
        "or raise the lateral size so that larger commensurate cells are searched")


def best_feasible(cells: list[_Cell], max_strain: float) -> _Cell | None:
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


def wrap_positions(positions: np.ndarray, box: tuple[float, float, float]) -> np.ndarray:
    lengths = np.array(box)
    wrapped = np.mod(positions, lengths)
    wrapped = np.where(wrapped >= lengths, wrapped - lengths, wrapped)
    return wrapped
