"""NanoMegas blockfiles (``.blo``), read lazily by ``rsciio.blockfile`` (a memory map)."""
from __future__ import annotations

from .base import FileFormat

FORMAT = FileFormat(name="blockfile", module=__name__, suffixes=(".blo",), reader="rsciio.blockfile")
