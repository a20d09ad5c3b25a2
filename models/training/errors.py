"""The training errors: one-line `UserError`s that say why a run cannot start or continue."""
from __future__ import annotations

from namsa.errors import UserError


class TrainingError(UserError):
    """Training cannot start or continue (bad data, config, output dir, or diverged loss)."""


class DataShapeError(TrainingError):
    """The data's shapes do not fit the model."""


class NonFiniteLossError(TrainingError):
    """Too many Inf/NaN losses or gradients in a row."""


class OutputDirError(TrainingError):
    """The output directory holds another run."""


class CheckpointMismatchError(TrainingError):
    """A checkpoint written for another model configuration."""


__all__ = ["TrainingError", "DataShapeError", "NonFiniteLossError", "OutputDirError", "CheckpointMismatchError"]
