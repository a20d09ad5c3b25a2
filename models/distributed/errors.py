"""Errors of the distributed layer: one line, naming the input and the fix."""
from __future__ import annotations

from namsa.errors import UserError


class DistributedConfigError(UserError):
    """Bad or inconsistent distributed settings (launcher env, config mismatch across ranks)."""


class PeerFailureError(UserError):
    """A collective failed or timed out: another rank died or hung."""


class HorovodMissingError(UserError):
    """engine='horovod' but Horovod is not importable."""
