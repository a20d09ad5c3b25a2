"""FEI TIA files (``.ser``, or an ``.emi`` with its ``<name>_N.ser`` files), read lazily by ``rsciio.tia``."""
from __future__ import annotations

import glob
import os
from pathlib import Path

from .base import FileFormat


def tia_companions(path: Path) -> list[Path]:
    """The .ser files rosettasciio opens for an .emi (none for a .ser, read alone)."""
    if path.suffix.lower() != ".emi":
        return []
    return [Path(p) for p in glob.glob(os.path.splitext(str(path))[0] + "_[0-9].ser")]  # rsciio.tia's rule


FORMAT = FileFormat(name="TIA", module=__name__, suffixes=(".ser", ".emi"), reader="rsciio.tia",
                    companions=tia_companions)
