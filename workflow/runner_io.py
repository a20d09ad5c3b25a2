"""Small helpers every stage runner shares: one-line failure reasons, progress bars on stderr,
atomic JSON files and output directories."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from namsa.errors import NamsaError, UserError
from stage.jsonfile import write_json_atomic


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, for failure records."""
    text = " ".join(str(exc).split()) or "(no message)"
    return text if isinstance(exc, NamsaError) else f"{type(exc).__name__}: {text}"


def write_summary_json(path: str | Path, payload: Any) -> None:
    """The workflow's summaries and progress files: stage.jsonfile's atomic writer, parents made,
    anything JSON cannot hold written as its str()."""
    write_json_atomic(path, payload, default=str, make_parents=True)


def progress_bar(total: int, desc: str, unit: str, enabled: bool):
    """A tqdm bar on stderr (rate shown as <unit>/s); silent when ``enabled`` is False."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr,
                dynamic_ncols=True, smoothing=0.1)


def tqdm_write(text: str) -> None:
    """Print a line without breaking a progress bar that is on screen."""
    from tqdm import tqdm

    tqdm.write(text, file=sys.stderr)


def require_directory(path: str | Path, flag: str = "--out", make: bool = True) -> Path:
    """``path`` as an output directory: absent (it will be made) or a directory, never a file.
    ``make=False`` for outputs swapped into place whole (workflow.replace_out checks those)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file, not a directory; choose a directory")
    if make:
        # Made now: an unwritable place (under a file, read-only, full) is found before any work,
        # as an OSError that the CLI turns into one line.
        path.mkdir(parents=True, exist_ok=True)
    return path
