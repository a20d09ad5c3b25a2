"""What a microscope file format is to `read_scan`: `FileFormat`, one per module of this package."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import ExperimentalInputError, parser_message

#: rsciio-style signal dicts (data, axes, metadata, original_metadata), or a `RawScan` when the
#: format's own reader also finds the calibrations and checks the declared size (Arina)
Opened = Any


@dataclass(frozen=True)
class ScanCalibrations:
    """What a writer may record beside a scan, each None when unknown: beam energy (kV),
    convergence semi-angle (mrad), detector pixel (1/Angstrom, both axes) and scan step ((y, x)
    Angstrom). A format records those its layout has room for (`FileFormat.records`)."""

    energy_kv: float | None = None
    semiangle_mrad: float | None = None
    dk_inv_A: float | None = None
    step_A: tuple[float, float] | None = None


#: a format's writer: (the path `namsa reconstruct` is given, the (scan_y, scan_x, ky, kx) data, the
#: calibrations) -> that path, written
Writer = Callable[[Path, Any, ScanCalibrations], Path]


def _no_check(path: Path) -> None:
    """A format whose file needs no check before it is read beyond `check_links`."""


def _no_companions(path: Path) -> list[Path]:
    return []


@dataclass(frozen=True)
class FileFormat:
    """A file format `read_scan` reads: which paths it claims and how it opens them.

    - ``name``: what a message calls it (e.g. "Arina"); ``module``: the module defining it.
    - ``suffixes``: lower-case extensions it claims; ``name_ends``: a file-name rule it claims
      before any suffix (a DECTRIS ``*_master.h5`` is not HyperSpy's .h5).
    - ``refused``: (suffix, why) pairs of files of this format that are not its input (an EMPAD
      .raw is named by its .xml header); ``why`` follows "<path>: " in the message.
    - ``reader``: the rosettasciio plugin module that reads it, None for namsa's own reader;
      ``lazy``: whether it reads lazily (False: the file is read whole when opened).
    - ``read``: namsa's own opening of a path, instead of ``reader`` (see `Opened`).
    - ``check``: the safety checks made before anything is read (stage.microscope.safety).
    - ``companions``: the other files the reader opens beside the path, by its naming rules
      (stage.microscope.links refuses them as symbolic links before anything is opened).
    - ``folder``: the input is a folder (zarr), not a file.
    - ``declared_size``: whether `read_scan` compares the declared size with the bytes stored
      (False where ``check`` already holds the data file to the byte).
    - ``write``: namsa's writer of the format (stage.microscope.writers.write_scan), None where it
      has none; ``records``: the calibrations (`ScanCalibrations` fields) its files keep.
    """

    name: str
    module: str
    suffixes: tuple[str, ...] = ()
    name_ends: str | None = None
    refused: tuple[tuple[str, str], ...] = ()
    reader: str | None = None
    lazy: bool = True
    read: Callable[[Path], Opened] | None = None
    check: Callable[[Path], None] = _no_check
    companions: Callable[[Path], list[Path]] = _no_companions
    folder: bool = False
    declared_size: bool = True
    write: Writer | None = None
    records: tuple[str, ...] = ()

    def claims(self, path: Path) -> bool:
        """Whether ``path`` is a file of this format by its name rule or its extension."""
        if self.name_ends is not None:
            return path.name.lower().endswith(self.name_ends)
        return path.suffix.lower() in self.suffixes

    def open(self, path: Path) -> Opened:
        """The file's signals (or its `RawScan`), after ``check`` has passed."""
        if self.read is not None:
            return self.read(path)
        return rsciio_read(path, str(self.reader), self.lazy)


def rsciio_read(path: Path, module: str, lazy: bool) -> list[dict[str, Any]]:
    """The signal dicts rosettasciio's plugin ``module`` reads from ``path``; any failure inside
    the parser is a one-line ExperimentalInputError (rosettasciio is an optional dependency)."""
    import importlib

    try:
        reader = importlib.import_module(module).file_reader
    except ImportError:
        raise ExperimentalInputError("reading experimental files needs rosettasciio: pip install -e '.[io]'") from None
    try:
        return list(reader(str(path), lazy=lazy))
    except Exception as exc:  # any parser failure of a foreign file is bad input
        text = parser_message(exc)
        raise ExperimentalInputError(f"{path} could not be read as {module.split('.')[-1]} ({text}); check the "
                                     "file is complete and of that format") from None
