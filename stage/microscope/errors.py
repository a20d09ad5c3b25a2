"""The one-line errors of reading a microscope file and fitting it to a model."""
from __future__ import annotations

from namsa.errors import UserError


class ExperimentalInputError(UserError):
    """An experimental file, its calibrations, or its fit to a model is wrong (one line)."""


class MicroscopeFileError(UserError):
    """A microscope file reaches outside itself, is incomplete, or holds unusable values."""


def parser_message(exc: BaseException) -> str:
    """What a foreign parser (rosettasciio, h5py, zarr) said when a file failed inside it, on one
    line and at most 200 characters, for the one-line refusal that wraps it."""
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def all_problems(problems: list[str]) -> ExperimentalInputError:
    """One refusal listing every problem found (a user fixes them all in one go, not one per run):
    the problem itself when there is one, else "N problems: (1) ...; (2) ..." on one line."""
    if len(problems) == 1:
        return ExperimentalInputError(problems[0])
    return ExperimentalInputError(f"{len(problems)} problems: " + "; ".join(f"({i}) {p}" for i, p in
                                                                             enumerate(problems, 1)))
