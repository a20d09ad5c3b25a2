"""Automatic zone axes: low-index, symmetry-distinct directions with short beam repeats and small
commensurate cells."""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
from pymatgen.core import Structure

from .errors import UserError
from .structure_io import load_structure
from .supercell import MAX_SEARCH_A, MIN_SEARCH_A, Orienter, ZoneAxisError, best_feasible


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
    orienter = Orienter(structure, lateral_A)
    scored = []
    for axis in _distinct_axes(structure, int(max_index)):
        cells = orienter.candidate_cells(axis)
        best = best_feasible(cells, max_strain)
        if best is not None:
            scored.append((max(abs(i) for i in axis), best.strain > 0, round(best.unit_A[2], 6),
                           round(best.area_A2, 6), axis))
    scored.sort()
    return [axis for *_, axis in scored[: int(max_axes)]]


def planned_zone_axes(structure: Structure, max_axes: int, cell_lateral_A: float,
                      material_id: str = "this structure") -> list[tuple[int, int, int]]:
    """`auto_zone_axes` for a plan: never an empty list.

    Searched first as `auto_zone_axes` does (in-plane vectors up to `MIN_SEARCH_A`, so plans of
    structures that orient there do not change); a structure with no axis there is searched again
    up to its ``cell_lateral_A`` (the supercell is that wide, so `orient_supercell` searches as far
    and finds the same cells). If no axis is found either way, raises `ZoneAxisError` saying what
    was tried and what would orient it (monazite, monoclinic with beta = 103.4 degrees, needs a
    30 A cell or the explicit axis [3, 0, 2]).
    """
    axes = auto_zone_axes(structure, max_axes=max_axes)
    if not axes and cell_lateral_A > MIN_SEARCH_A:
        axes = auto_zone_axes(structure, max_axes=max_axes, lateral_A=cell_lateral_A)
    if axes:
        return axes
    searched = max(MIN_SEARCH_A, min(cell_lateral_A, MAX_SEARCH_A))
    raise ZoneAxisError(f"zone_axes: auto found no usable zone axis for {material_id}: none of its symmetry-distinct "
                        f"axes with indices up to 2 has an orthogonal periodic cell within 2% strain using "
                        f"in-plane vectors up to {searched:g} A; {_orientation_advice(structure, searched)}")


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
