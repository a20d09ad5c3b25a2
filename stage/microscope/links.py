"""Symbolic links around a microscope file a user received, refused before anything is opened.

A reader opens more than the path it is given: a Merlin ``.mib`` its ``.hdr``, a TIA ``.emi`` its
``<name>_N.ser`` files, an EMPAD header its raw file, an Arina master its data files. A symbolic
link among them (to /etc/passwd, to another user's scan) would be read as data or header, so:

- the input itself may be a link only to a file in its own folder (a link leaving it is refused);
- a companion file may not be a link at all, and must lie in the input's folder.

Each format names its companion files (``companions`` in stage.microscope.formats). EMPAD raw
files and Arina data files are named inside the file, so their formats' checks call
`refuse_companion_link` (stage.microscope.safety) once they know the name.
"""
from __future__ import annotations

import os
from pathlib import Path

from .errors import MicroscopeFileError
from .formats import format_of
from .safety import refuse_companion_link


def check_links(path: Path) -> None:
    """The input ``path`` and the companion files its reader opens (see the module docstring)."""
    if path.is_symlink() and Path(os.path.realpath(path)).parent != Path(os.path.realpath(path.parent)):
        raise MicroscopeFileError(f"{path} is a symbolic link to {os.path.realpath(path)}, outside its own folder; "
                                  "namsa reads only the file it is given: pass the file itself (or copy it here)")
    for companion in companions(path):
        refuse_companion_link(companion, path)


def companions(path: Path) -> list[Path]:
    """The other files the reader of ``path``'s format opens, by its own naming rules (none for a
    file no format claims: it is refused unread)."""
    fmt = format_of(path)
    return fmt.companions(path) if fmt is not None else []
