"""The microscope file formats `read_scan` reads: one module per format, registered in `MODULES`.

Each module defines ``FORMAT``, a `FileFormat`: the suffixes (or name rule) it claims, how it opens a
path (rosettasciio's plugin, lazily where it can, or namsa's own reader), its safety checks and
its companion files. Adding a format is one module here and one line in `MODULES`. Importing this
package imports no reader (rosettasciio, h5py and zarr are imported when a file is read) and no lmdb.
"""
from __future__ import annotations

from importlib import import_module
from pathlib import Path

from ..errors import ExperimentalInputError
from .base import FileFormat

#: the format modules; a format with a name rule (Arina's ``*_master.h5``) is matched before the
#: suffixes (HyperSpy's ``.h5``), whatever the order here
MODULES = ("hspy", "zspy", "arina", "emd", "mib", "empad", "digitalmicrograph", "blockfile", "tia")
FORMATS: tuple[FileFormat, ...] = tuple(import_module(f"{__name__}.{name}").FORMAT for name in MODULES)


def format_of(path: Path) -> FileFormat | None:
    """The format that claims ``path`` (a name rule first, then its extension), or None."""
    by_name = [f for f in FORMATS if f.name_ends is not None and f.claims(path)]
    return (by_name or [f for f in FORMATS if f.claims(path)] or [None])[0]


def claim(path: Path) -> FileFormat:
    """The format of ``path``; ExperimentalInputError for a file no format reads (naming those read)."""
    found = format_of(path)
    if found is not None:
        return found
    for fmt in FORMATS:
        for suffix, why in fmt.refused:
            if path.suffix.lower() == suffix:
                raise ExperimentalInputError(f"{path}: {why}")
    raise ExperimentalInputError(f"{path}: unknown file type {path.suffix!r}; namsa reconstruct reads "
                                 f"{readable()} (convert other formats to .hspy)")


def suffixes() -> list[str]:
    """Every extension a format claims, sorted."""
    return sorted(s for f in FORMATS for s in f.suffixes)


def readable() -> str:
    """The readable types for a message: the extensions, then each name rule ("Arina *_master.h5")."""
    rules = [f" and {f.name} *{f.name_ends}" for f in FORMATS if f.name_ends is not None]
    return ", ".join(suffixes()) + "".join(rules)


__all__ = ["FileFormat", "FORMATS", "MODULES", "format_of", "claim", "suffixes", "readable"]
