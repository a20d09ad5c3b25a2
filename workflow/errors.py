"""Errors of the workflow room, and the one place that turns an error's kind into an exit status.

Every `namsa` command exits with:

* ``EXIT_OK`` (0): done;
* ``EXIT_FAILED`` (1): the run or the environment failed (a `namsa.errors.RunError`: a full disk, a
  lost peer rank, a diverged loss, a checkpoint that could not be written, a failed stage), or a
  check ran and found problems (``inspect --verify``);
* ``EXIT_BAD_INPUT`` (2): bad input (a `namsa.errors.UserError`: a config key, a file, a flag, a
  path; argparse's own errors use 2 as well);
* ``EXIT_INTERRUPTED`` (130 = 128 + SIGINT): Ctrl-C.

No Parsl import here.
"""
from __future__ import annotations

import sys

from namsa.errors import NamsaError, RunError, UserError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def exit_status(exc: NamsaError) -> int:
    """``EXIT_BAD_INPUT`` for a `UserError`, ``EXIT_FAILED`` for a `RunError`.

    A `NamsaError` of neither kind (or of both) is a programming error: its class must say which
    it is, so this raises `TypeError` naming it rather than guess.
    """
    is_input, is_run = isinstance(exc, UserError), isinstance(exc, RunError)
    if is_input == is_run:
        raise TypeError(f"{type(exc).__module__}.{type(exc).__qualname__} must subclass exactly one of "
                        f"namsa.errors.UserError (bad input) and namsa.errors.RunError (the run failed)")
    return EXIT_BAD_INPUT if is_input else EXIT_FAILED


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a memory shortage found while running: a `MemoryError`, or torch's
    out-of-memory error of a GPU (looked up only where torch is already imported). The CLI reports it
    as a `namsa.errors.MemoryShortage`, the kind the estimates before a run raise."""
    gpu_kind = getattr(sys.modules.get("torch"), "OutOfMemoryError", MemoryError)
    return isinstance(exc, (MemoryError, gpu_kind))


class StageFailed(RunError):
    """A stage of the DAG failed for a reason that is not bad input (e.g. training crashed).

    The message is one line; ``detail`` is the tail of the stage's log, printed below it.
    """

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


class StageRefused(UserError):
    """A stage's child process (the `namsa train` of `namsa run`) exited for bad input: its own one
    line, so the run exits 2 as the child did (workflow.child_status carries the kind across)."""


class NotEnoughSamples(UserError):
    """Too few samples were simulated to train (execution.min_success_fraction)."""


class NothingSimulated(UserError):
    """Every planned sample (or material) failed: the command produced nothing of what was asked."""
