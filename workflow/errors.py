"""Errors of the workflow room that the CLI turns into exit statuses (no Parsl import here)."""
from __future__ import annotations

from namsa.errors import UserError


class StageFailed(RuntimeError):
    """A stage of the DAG failed for a reason that is not bad input (e.g. training crashed).

    The message is one line; ``detail`` is the tail of the stage's log, printed below it.
    """

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


class NotEnoughSamples(UserError):
    """Too few samples were simulated to train (execution.min_success_fraction)."""


class NothingSimulated(UserError):
    """Every planned sample (or material) failed: the command produced nothing of what was asked."""
