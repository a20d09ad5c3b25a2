"""Loading crystal structures: library and generated ids, CIF files and folders, pymatgen and ase
objects, checked for what the simulator can represent (ordered, real elements, Z <= 103)."""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from pymatgen.core import Element, IStructure, Structure

from . import generator, library
from .errors import UserError

#: heaviest element the potential table covers (Kirkland 2010 parameterises Z = 1..103).
MAX_Z = 103
#: most atoms one structure (the cell that is tiled) may hold: reading a CIF and finding the primitive
#: cell both take time quadratic in it (~20 s at 2,000 atoms, hours and gigabytes at 20,000), and
#: crystals simulated by the study hold well under 1,000 atoms per conventional cell
MAX_SITES = 2_000
#: largest CIF file read (a CIF of MAX_SITES atoms is a few hundred KB)
MAX_CIF_BYTES = 64 * 1024 * 1024
#: a site and its symmetry image closer than this (fractional) are one atom, as pymatgen merges them
_SAME_SITE = 1e-3


class StructureError(UserError):
    """A structure that cannot be read or used (file, element, occupancy)."""


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
        raise StructureError(f"{str(path)!r} is a directory; use namsa.structure_io.load_cif_dir for a folder of CIFs")
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
            text = _cif_text(path)
            parser = CifParser.from_str(text)
            _refuse_large_cif(parser, text, path)
            structures = parser.parse_structures(primitive=False)
        except StructureError:
            raise
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


def _cif_text(path: Path) -> str:
    if path.stat().st_size > MAX_CIF_BYTES:
        raise StructureError(f"CIF {str(path)!r} is larger than {MAX_CIF_BYTES // 2**20} MiB, far more than a crystal's "
                             f"unit cell needs; export the unit cell alone")
    return path.read_text(encoding="utf-8", errors="replace")


def _refuse_large_cif(parser: Any, text: str, path: Path) -> None:
    """Count the atoms each data block stands for before pymatgen builds it (quadratic time)."""
    from pymatgen.io.cif import CifFile

    for block in CifFile.from_str(text).data.values():
        count = _cif_site_count(parser, block)
        if count > MAX_SITES:
            raise StructureError(_too_many_sites(f"CIF {str(path)!r}", count))


def _cif_site_count(parser: Any, block: Any) -> int:
    """Atoms a CIF block's sites and symmetry operations make (0 when its sites cannot be read:
    the parser then says why)."""
    axes = [block.data.get(f"_atom_site_fract_{a}") for a in "xyz"]
    if not all(isinstance(axis, list) for axis in axes):
        return len(axes[0]) if isinstance(axes[0], list) else 0
    rows = len(axes[0])
    if rows > MAX_SITES:
        return rows  # each row is at least one atom: refused without more work
    try:
        from pymatgen.io.cif import str2float

        frac = np.array([[str2float(v) for v in axis] for axis in axes], dtype=float).T
        ops = parser.get_symops(block)
    except Exception:  # unreadable numbers or operations: pymatgen's own parse reports them
        return rows
    images = np.einsum("oij,rj->ori", np.array([op.rotation_matrix for op in ops]), frac)
    images = (images + np.array([op.translation_vector for op in ops])[:, None, :]) % 1.0
    snapped = np.round(images / _SAME_SITE).astype(np.int64) % round(1 / _SAME_SITE)
    return sum(len(np.unique(snapped[:, row], axis=0)) for row in range(rows))


def _too_many_sites(what: str, count: int) -> str:
    return (f"{what} holds {count:,} atoms, more than the {MAX_SITES:,} namsa reads in one structure (reading and "
            f"orienting it would take hours and gigabytes); pass the crystal's unit cell (conventional or "
            f"primitive), which namsa tiles to the field of view itself")


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
    if len(structure) > MAX_SITES:
        raise StructureError(_too_many_sites(f"structure {name!r}", len(structure)))
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
