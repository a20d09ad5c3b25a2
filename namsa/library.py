"""Built-in library of crystal structures with stable ids.

The lattice data live in ``namsa/data/structure_library.json`` (one entry per structure: space
group, conventional lattice in Angstrom and degrees, asymmetric-unit sites, formula units per
cell ``Z``, published density in g/cm^3 and the sources of the numbers). Each structure is
built with :meth:`pymatgen.core.Structure.from_spacegroup`, so the full conventional cell comes
from the space-group operations rather than from hand-typed coordinates.

Ids look like ``"<formula>-<prototype>"`` (``"Si-diamond"``, ``"SrTiO3-perovskite"``,
``"GaN-wurtzite"``) and never change once published: sample ids and dataset splits depend on them.
"""
from __future__ import annotations

import difflib
import json
from functools import lru_cache
from importlib import resources
from typing import Any

from pymatgen.core import Lattice, Structure

from .errors import UserError

_DATA_FILE = "structure_library.json"


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


def suggest_ids(structure_id: str) -> str:
    """A one-line hint naming the library ids closest to ``structure_id``."""
    ids = list_ids()
    lowered = {i.lower(): i for i in ids}
    close = difflib.get_close_matches(str(structure_id).lower(), list(lowered), n=3, cutoff=0.5)
    # A bare formula ("GaN") should find "GaN-wurtzite" even when difflib's ratio is low.
    prefix = [i for i in ids if i.lower().split("-")[0] == str(structure_id).lower()]
    names = list(dict.fromkeys(prefix + [lowered[c] for c in close]))
    if names:
        return f"did you mean {', '.join(names)}? (namsa.library.list_ids() lists all)"
    return "namsa.library.list_ids() lists the built-in ids; pass a CIF path for anything else"


def _lattice(params: dict[str, float]) -> Lattice:
    a = params["a"]
    return Lattice.from_parameters(
        a, params.get("b", a), params.get("c", a),
        params.get("alpha", 90.0), params.get("beta", 90.0), params.get("gamma", 90.0))


@lru_cache(maxsize=None)
def _build(structure_id: str) -> Structure:
    entry = _entry(structure_id)
    species = [site[0] for site in entry["sites"]]
    coords = [site[1] for site in entry["sites"]]
    structure = Structure.from_spacegroup(entry["spacegroup"], _lattice(entry["lattice"]), species, coords)
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

    Keys: ``id``, ``prototype``, ``formula`` (reduced), ``spacegroup``, ``lattice`` (a, b, c in
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
        "lattice": {"a": lat.a, "b": lat.b, "c": lat.c,
                    "alpha": lat.alpha, "beta": lat.beta, "gamma": lat.gamma},
        "Z": entry["Z"],
        "n_atoms": len(structure),
        "density_g_cm3": entry["density_g_cm3"],
        "density_built_g_cm3": float(structure.density),
        "sources": [sources[key] for key in entry["source"]],
    }
