"""The one error root: every error namsa means a user to read is a `NamsaError` of one of two kinds.

* :class:`UserError`: the input is wrong (a config key, a file, a flag, a path). The user fixes it.
* :class:`RunError`: the input was fine but the environment or the run failed (a full disk, a lost
  peer rank, a diverged loss, a checkpoint that could not be written). Rerunning may succeed once
  the cause is gone; finished work is kept.

Each package subclasses one of the two, and the kind is the whole decision: the CLI
(`workflow.errors.exit_status`) turns it into the exit status. The message is a single line that
says what is wrong and what to do. Neither kind is a `ValueError`, so a caller's
``except ValueError`` (or a pydantic validator) never swallows one by accident. ``namsa.errors``
and ``namsa.sample`` are the two contract modules every room may import.
"""
from __future__ import annotations


class NamsaError(Exception):
    """The root: a one-line message for a person. Subclass `UserError` or `RunError`, never this."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class UserError(NamsaError):
    """Bad input from the user: one line, names the input and the fix."""


class RunError(NamsaError):
    """The environment or the run failed (disk, peers, divergence, writes): one line, the reason and what to do."""


class MemoryShortage(UserError):
    """What was asked needs more memory than this machine gives it: one kind whether an estimate finds
    it before anything runs or the run finds it as a `MemoryError` (or a GPU's out-of-memory error).

    Bad input, not a failed run: the same command on the same machine runs short again, so the fix
    is in the input (smaller sizes, fewer parallel tasks, a smaller batch, another machine), which
    every such line names; unlike a full disk, nothing outside the command is to blame.
    """
