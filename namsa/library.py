"""Built-in library of crystal structures with stable ids.

The lattice data live in ``namsa/data/structure_library.json`` (one entry per structure: space
group, conventional lattice in Angstrom and degrees, asymmetric-unit sites, formula units per
cell ``Z``, published density in g/cm^3 and the sources of the numbers). Each structure is
built from pymatgen's space-group operation table (the same operations, in the same default
settings, as :meth:`pymatgen.core.Structure.from_spacegroup`; Fd-3m is origin choice 1), so the
full conventional cell comes from the symmetry operations rather than hand-typed coordinates.

Ids look like ``"<formula>-<prototype>"`` (``"Si-diamond"``, ``"SrTiO3-perovskite"``,
``"GaN-wurtzite"``) and never change once published: sample ids and dataset splits depend on them.
"""
from __future__ import annotations

import difflib
import json
from functools import lru_cache
from importlib import resources
from typing import Any, Sequence

import numpy as np
from pymatgen.core import Lattice, Structure
from pymatgen.core.operations import SymmOp
from pymatgen.symmetry.groups import SpaceGroup

from .errors import UserError

_DATA_FILE = "structure_library.json"
#: fractional distance below which two symmetry images are the same site
_SITE_TOLERANCE = 1e-5


class UnknownStructureIdError(UserError):
    """A library id that is not in the built-in library."""


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    text = resources.files("namsa").joinpath("data", _DATA_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    data["by_id"] = {entry["id"]: entry for entry in data["entries"]}
    return data


def list_ids() -> list[str]:
    """All built-in structure ids, in library order (stable)."""
    return [entry["id"] for entry in _table()["entries"]]


def _entry(structure_id: str) -> dict[str, Any]:
    by_id = _table()["by_id"]
    if structure_id in by_id:
        return by_id[structure_id]
    raise UnknownStructureIdError(
        f"unknown structure id {structure_id!r}; {suggest_ids(structure_id)}")


#: what an unknown id gets told to do instead, from Python and from a config file
API_ADVICE = "pass a CIF path for anything else"
CONFIG_ADVICE = "for anything else put CIF files in a folder and set simulation.cif_dir to it"


def suggest_ids(structure_id: str, otherwise: str = API_ADVICE) -> str:
    """A one-line hint naming the library ids closest to ``structure_id``, else ``otherwise``."""
    ids = list_ids()
    lowered = {i.lower(): i for i in ids}
    close = difflib.get_close_matches(str(structure_id).lower(), list(lowered), n=3, cutoff=0.5)
    # A bare formula ("GaN") should find "GaN-wurtzite" even when difflib's ratio is low.
    prefix = [i for i in ids if i.lower().split("-")[0] == str(structure_id).lower()]
    names = list(dict.fromkeys(prefix + [lowered[c] for c in close]))
    if names:
        return f"did you mean {', '.join(names)}? (namsa.library.list_ids() lists all)"
    return f"namsa.library.list_ids() lists the built-in ids; {otherwise}"


def _lattice(params: dict[str, float]) -> Lattice:
    a = params["a"]
    return Lattice.from_parameters(
        a, params.get("b", a), params.get("c", a),
        params.get("alpha", 90.0), params.get("beta", 90.0), params.get("gamma", 90.0))


def _space_group_record(symbol: str) -> dict[str, Any]:
    """pymatgen's table entry of a space group in its default setting (first match, as
    ``pymatgen.symmetry.groups.SpaceGroup`` does)."""
    symbol = SpaceGroup.abbrev_sg_mapping.get(symbol, SpaceGroup.full_sg_mapping.get(symbol, symbol))
    for group in SpaceGroup.SYMM_OPS:
        if symbol in (group["hermann_mauguin"], group["universal_h_m"], group["hermann_mauguin_u"]):
            return group
    raise ValueError(f"space group {symbol!r} is not in pymatgen's table")


@lru_cache(maxsize=None)
def _symmetry_operations(symbol: str) -> tuple[np.ndarray, np.ndarray]:
    """(rotations (n, 3, 3), translations (n, 3)) of a space group in pymatgen's default setting.

    The operations are pymatgen's own table (the one ``Structure.from_spacegroup`` uses); we
    read it directly because ``SpaceGroup()`` deduplicates them with an O(n^2) set build that
    takes seconds for cubic groups.
    """
    ops = [SymmOp.from_xyz_str(text) for text in _space_group_record(symbol)["symops"]]
    return np.array([op.rotation_matrix for op in ops]), np.array([op.translation_vector for op in ops])


def _orbit(rotations: np.ndarray, translations: np.ndarray, point: Sequence[float]) -> np.ndarray:
    """Distinct images of a fractional point under the operations, wrapped into [0, 1)."""
    images = (rotations @ np.asarray(point, float) + translations) % 1.0
    delta = images[:, None, :] - images[None, :, :]
    same = np.all(np.abs(delta - np.round(delta)) < _SITE_TOLERANCE, axis=-1)
    # keep an image unless an earlier image is the same site
    first = ~np.any(np.tril(same, k=-1), axis=1)
    return images[first]


@lru_cache(maxsize=None)
def _build(structure_id: str) -> Structure:
    entry = _entry(structure_id)
    rotations, translations = _symmetry_operations(entry["spacegroup"])
    species, coords = [], []
    for symbol, point in entry["sites"]:
        orbit = _orbit(rotations, translations, point)
        species += [symbol] * len(orbit)
        coords += list(orbit)
    structure = Structure(_lattice(entry["lattice"]), species, coords)
    structure.properties["material_id"] = structure_id
    return structure


def get(structure_id: str) -> Structure:
    """The conventional cell of a built-in structure (a fresh copy; Angstrom).

    Raises :class:`UnknownStructureIdError` (a :class:`~namsa.errors.UserError`) with the
    closest ids for an unknown id.
    """
    return _build(str(structure_id)).copy()


def info(structure_id: str) -> dict[str, Any]:
    """Metadata of a built-in structure.

    Keys: ``id``, ``prototype``, ``formula`` (reduced), ``spacegroup`` (symbol) and
    ``spacegroup_number``, ``lattice`` (a, b, c in
    Angstrom; alpha, beta, gamma in degrees), ``Z`` (formula units per conventional cell),
    ``n_atoms`` (atoms per conventional cell), ``density_g_cm3`` (published, or None),
    ``density_built_g_cm3`` (of the structure as built), ``sources`` (full citations).
    """
    entry = _entry(str(structure_id))
    structure = _build(str(structure_id))
    lat = structure.lattice
    sources = _table()["sources"]
    return {
        "id": entry["id"],
        "prototype": entry["prototype"],
        "formula": structure.composition.reduced_formula,
        "spacegroup": entry["spacegroup"],
        "spacegroup_number": int(_space_group_record(entry["spacegroup"])["number"]),
        "lattice": {"a": lat.a, "b": lat.b, "c": lat.c,
                    "alpha": lat.alpha, "beta": lat.beta, "gamma": lat.gamma},
        "Z": entry["Z"],
        "n_atoms": len(structure),
        "density_g_cm3": entry["density_g_cm3"],
        "density_built_g_cm3": float(structure.density),
        "sources": [sources[key] for key in entry["source"]],
    }
