"""The training errors, one line each: why a run cannot start (`TrainingError`, a `UserError`: the
data, config or output directory is wrong) or why it stopped (`NonFiniteLossError`, a `RunError`)."""
from __future__ import annotations

from namsa.errors import RunError, UserError


class TrainingError(UserError):
    """Training cannot start or continue because of its input (bad data, config or output dir)."""


class DataShapeError(TrainingError):
    """The data's shapes do not fit the model."""


class NonFiniteLossError(RunError):
    """The run diverged: too many Inf/NaN losses or gradients in a row (checkpoints before it are kept)."""


class OutputDirError(TrainingError):
    """The output directory holds another run."""


class CheckpointMismatchError(TrainingError):
    """A checkpoint written for another model configuration."""


__all__ = ["TrainingError", "DataShapeError", "NonFiniteLossError", "OutputDirError", "CheckpointMismatchError"]
