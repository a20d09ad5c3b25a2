"""The one-line errors of reading a microscope file and fitting it to a model."""
from __future__ import annotations

from namsa.errors import UserError


class ExperimentalInputError(UserError):
    """An experimental file, its calibrations, or its fit to a model is wrong (one line)."""


class MicroscopeFileError(UserError):
    """A microscope file reaches outside itself, is incomplete, or holds unusable values."""
