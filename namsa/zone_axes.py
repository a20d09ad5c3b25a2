"""Automatic zone axes: low-index, symmetry-distinct directions with short beam repeats and small
commensurate cells; and the check a plan makes that a material's axes can be built."""
from __future__ import annotations

import math
from typing import Any, Iterable, Literal, Sequence

import numpy as np
from pymatgen.core import Structure

from .errors import UserError
from .structure_io import load_structure
from .supercell import MAX_SEARCH_A, MAX_STRAIN, MIN_SEARCH_A, Orienter, ZoneAxisError, best_feasible, choose_cell

#: the largest |index| the search tries, in the basis it searches (`auto_zone_axes`' ``max_index``)
MAX_INDEX = 2
#: where low indices are counted: in the structure's cell as given, or in its standard conventional
#: cell (spglib's), the setting microscopists index zone axes in
Setting = Literal["given", "standard"]


def auto_zone_axes(structure: Structure | Any, max_axes: int = 3, max_index: int = MAX_INDEX, *,
                   max_strain: float = MAX_STRAIN, lateral_A: float = MIN_SEARCH_A,
                   setting: Setting = "given") -> list[tuple[int, int, int]]:
    """Low-index zone axes with short beam repeats and small commensurate cells.

    Candidates are all [u v w] with |indices| <= ``max_index`` in the cell ``setting`` names (the
    structure's own, or its standard conventional cell); symmetry-equivalent axes (under
    the point group from pymatgen's SpacegroupAnalyzer, and u v w ~ -u -v -w) count once.
    Axes whose orthogonal cell would need more than ``max_strain`` (searching in-plane vectors
    up to ``lateral_A``) are dropped. Sorted by index order (largest |index| in that setting), then
    exact (strain-free) cells before strained ones, then beam repeat, then in-plane cell area;
    deterministic. Returned in the basis of the structure as given, whichever the setting (so a
    rhombohedral cell's [0001] may read [1, 1, -3]). With the default ``lateral_A``, every returned
    axis can be oriented by :func:`orient_supercell` at any lateral size with the same ``max_strain``.
    """
    structure = load_structure(structure)
    if int(max_axes) < 1 or int(max_index) < 1:
        raise UserError(f"auto_zone_axes needs max_axes >= 1 and max_index >= 1 (got {max_axes}, {max_index})")
    orienter = Orienter(structure, lateral_A)
    scored = []
    for index, axis in _ranked_axes(structure, int(max_index), setting):
        cells = orienter.candidate_cells(axis)
        best = best_feasible(cells, max_strain)
        if best is not None:
            scored.append((index, best.strain > 0, round(best.unit_A[2], 6), round(best.area_A2, 6), axis))
    scored.sort()
    return [axis for *_, axis in scored[: int(max_axes)]]


def planned_zone_axes(structure: Structure, max_axes: int, cell_lateral_A: float,
                      material_id: str = "this structure") -> list[tuple[int, int, int]]:
    """`auto_zone_axes` for a plan: never an empty list.

    Searched first as `auto_zone_axes` does (in-plane vectors up to `MIN_SEARCH_A`, so plans of
    structures that orient there do not change); a structure with no axis there is searched again
    up to its ``cell_lateral_A`` (the supercell is that wide, so `orient_supercell` searches as far
    and finds the same cells). A structure with no axis of index <= 2 in its own cell is then
    searched in its standard conventional cell: a rhombohedral AFLOW template given in a primitive
    setting has its [0001] at [1, 1, -3] (Bi2Se3's, the axis it is imaged along), beyond index 2.
    Plans of structures that orient in their own cell do not change. If no axis is found at all,
    raises `ZoneAxisError` saying what was tried and what would orient it (monazite, monoclinic with
    beta = 103.4 degrees, needs a 30 A cell or the explicit axis [3, 0, 2]).
    """
    for setting in ("given", "standard"):
        axes = auto_zone_axes(structure, max_axes=max_axes, setting=setting)
        if not axes and cell_lateral_A > MIN_SEARCH_A:
            axes = auto_zone_axes(structure, max_axes=max_axes, lateral_A=cell_lateral_A, setting=setting)
        if axes:
            return axes
    searched = max(MIN_SEARCH_A, min(cell_lateral_A, MAX_SEARCH_A))
    raise ZoneAxisError(f"zone_axes: auto found no usable zone axis for {material_id}: none of its symmetry-distinct "
                        f"axes with indices up to {MAX_INDEX} (in its cell as given or its standard conventional "
                        f"cell) has an orthogonal periodic cell within {MAX_STRAIN:.0%} strain using "
                        f"in-plane vectors up to {searched:g} A; {_orientation_advice(structure, searched)}")


def buildable_axes(structure: Structure, axes: Sequence[tuple[int, int, int]], cell_lateral_A: float,
                   material_id: str) -> tuple[list[tuple[int, int, int]], list[str]]:
    """(the explicit ``axes`` (normalised) `orient_supercell` can build at ``cell_lateral_A``, why each
    other one cannot): the cell choice it makes when the sample is simulated (the same search, the same
    strain limit), without building the supercell, so a plan refuses what its simulation would fail."""
    orienter = Orienter(structure, cell_lateral_A)
    built: list[tuple[int, int, int]] = []
    refused: list[str] = []
    for axis in axes:
        try:
            choose_cell(orienter, axis, MAX_STRAIN, material_id)
        except ZoneAxisError as exc:
            refused.append(str(exc))
            continue
        built.append(axis)
    return built, refused


def _orientation_advice(structure: Structure, searched_A: float) -> str:
    """What would orient a structure `planned_zone_axes` could not: a wider cell, else an explicit
    higher-index axis (both probed, a fraction of a second each)."""
    wider = next((size for size in (30.0, 40.0, MAX_SEARCH_A)
                  if size > searched_A and auto_zone_axes(structure, max_axes=1, lateral_A=size)), None)
    higher = auto_zone_axes(structure, max_axes=1, max_index=3, lateral_A=searched_A)
    options = ([f"set simulation.cell_lateral_A to at least {wider:g} A"] if wider is not None else []) + \
              ([f"list explicit simulation.zone_axes, e.g. [{list(higher[0])}]"] if higher else [])
    return " or ".join(options) if options else (f"even {MAX_SEARCH_A:g} A cells and index-3 axes fail: "
                                                 "leave this material out of the plan")


def _canonical(axis: Iterable[int]) -> tuple[int, int, int]:
    values = [int(v) for v in axis]
    g = math.gcd(*values)
    values = [v // g for v in values]
    first = next(v for v in values if v != 0)
    return tuple(-v for v in values) if first < 0 else tuple(values)  # type: ignore[return-value]


def _ranked_axes(structure: Structure, max_index: int, setting: Setting) -> list[tuple[int, tuple[int, int, int]]]:
    """(|index| in ``setting``, axis in the given basis): one per symmetry class of the axes with
    |indices| <= ``max_index`` in that setting's cell."""
    from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

    analyzer = SpacegroupAnalyzer(structure, symprec=0.01)
    rotations = [op.rotation_matrix for op in analyzer.get_symmetry_operations(cartesian=False)]
    span = range(-max_index, max_index + 1)
    low = sorted({_canonical((u, v, w)) for u in span for v in span for w in span if (u, v, w) != (0, 0, 0)})
    if setting == "given":
        index = {axis: max(abs(i) for i in axis) for axis in low}
    else:
        # (a_s b_s c_s) = (a b c) P^-1 (spglib's transformation matrix P): direction [uvw]_s is P^-1 [uvw]_s here
        to_given = np.linalg.inv(np.asarray(analyzer.get_symmetry_dataset().transformation_matrix, float))
        index = {}
        for axis in low:
            given = _integer_direction(to_given @ np.asarray(axis, float))
            if given is not None:
                index.setdefault(_canonical(given), max(abs(i) for i in axis))
    return [(index[axis], axis) for axis in _distinct_axes(sorted(index), rotations, index)]


def _distinct_axes(candidates: list[tuple[int, int, int]], rotations: list[np.ndarray],
                   index: dict[tuple[int, int, int], int]) -> list[tuple[int, int, int]]:
    """One representative per symmetry class: lowest ``index``, fewest minus signs, then smallest."""
    seen: set[tuple[int, int, int]] = set()
    representatives = []
    for axis in candidates:
        if axis in seen:
            continue
        orbit = {_canonical(np.rint(r @ np.array(axis)).astype(int)) for r in rotations} | {axis}
        seen |= orbit
        members = [m for m in orbit if m in index]
        representatives.append(min(members, key=lambda m: (index[m], sum(i < 0 for i in m), m)))
    return representatives


def _integer_direction(direction: np.ndarray, max_denominator: int = 48) -> tuple[int, int, int] | None:
    """The integer direction along ``direction`` (rational: an axis of a setting whose cell is a
    sublattice or superlattice of this one), None when no denominator up to ``max_denominator`` makes
    it whole (a symmetry found with a tolerance, not an exact one)."""
    scaled = direction / np.max(np.abs(direction))
    k = next((k for k in range(1, max_denominator + 1)
              if np.allclose(k * scaled, np.rint(k * scaled), atol=1e-6)), None)
    return None if k is None else tuple(int(i) for i in np.rint(k * scaled))  # type: ignore[return-value]
