"""The one error type users see.

Every package (namsa, stage, models, workflow) raises a subclass of :class:`UserError` for bad
input. Its message is a single line that says what is wrong and what to do; the CLI prints it
and exits non-zero without a traceback. ``namsa.errors`` and ``namsa.sample`` are the two
contract modules every room may import.
"""
from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user: one line, names the input and the fix."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
