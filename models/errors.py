"""The models room's error a user reads about a model directory: `ModelDirError` (a `UserError`, exit 2
in the CLI), raised with one line by the card schema (`models.card`), the safe file readers
(`models.safe_files`), the weights check and the checkpoint reader."""
from __future__ import annotations

from namsa.errors import UserError


class ModelDirError(UserError):
    """A model directory (card, weights or checkpoint state) that cannot be used as it is."""


__all__ = ["ModelDirError"]
