"""Digital Micrograph files (``.dm3``, ``.dm4``), read by ``rsciio.digitalmicrograph``.

rosettasciio has no lazy mode for them: a file is read whole when opened (they are small).
"""
from __future__ import annotations

from .base import FileFormat

FORMAT = FileFormat(name="Digital Micrograph", module=__name__, suffixes=(".dm3", ".dm4"),
                    reader="rsciio.digitalmicrograph", lazy=False)
