"""Symbolic links around a microscope file a user received, refused before anything is opened.

A reader opens more than the path it is given: a Merlin ``.mib`` its ``.hdr``, a TIA ``.emi`` its
``<name>_N.ser`` files, an EMPAD header its raw file, an Arina master its data files. A symbolic
link among them (to /etc/passwd, to another user's scan) would be read as data or header, so:

- the input itself may be a link only to a file in its own folder (a link leaving it is refused);
- a companion file may not be a link at all, and must lie in the input's folder.

EMPAD raw files and Arina data files are named inside the file, so their readers call
`refuse_companion_link` once they know the name (stage.microscope.safety, stage.microscope.arina).
"""
from __future__ import annotations

import glob
import os
from pathlib import Path

from .errors import MicroscopeFileError


def check_links(path: Path) -> None:
    """The input ``path`` and the companion files its reader opens (see the module docstring)."""
    if path.is_symlink() and Path(os.path.realpath(path)).parent != Path(os.path.realpath(path.parent)):
        raise MicroscopeFileError(f"{path} is a symbolic link to {os.path.realpath(path)}, outside its own folder; "
                                  "namsa reads only the file it is given: pass the file itself (or copy it here)")
    for companion in companions(path):
        refuse_companion_link(companion, path)


def companions(path: Path) -> list[Path]:
    """The other files rosettasciio opens when it reads ``path``, by its own naming rules."""
    suffix = path.suffix.lower()
    if suffix == ".mib":
        return [Path(str(path).replace(".mib", ".hdr"))]  # rsciio.quantumdetector's rule, verbatim
    if suffix == ".emi":
        return [Path(p) for p in glob.glob(os.path.splitext(str(path))[0] + "_[0-9].ser")]  # rsciio.tia's rule
    return []


def refuse_companion_link(companion: Path, owner: Path) -> None:
    """A companion file of ``owner`` that is a symbolic link, or lies in another folder, is refused."""
    if companion.is_symlink():
        raise MicroscopeFileError(f"{owner}: its companion file {companion} is a symbolic link (to "
                                  f"{os.path.realpath(companion)}); namsa reads only files in the input's folder: "
                                  "copy the file itself there")
    if os.path.lexists(companion) and companion.parent.resolve() != owner.parent.resolve():
        raise MicroscopeFileError(f"{owner}: its reader would open {companion}, outside the file's folder; rename "
                                  "the folder or the file so that its companion files lie beside it")
