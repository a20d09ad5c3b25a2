"""Errors of the distributed layer, one line each: bad settings (`UserError`) or a peer lost at run
time (`RunError`)."""
from __future__ import annotations

from namsa.errors import RunError, UserError


class DistributedConfigError(UserError):
    """Bad or inconsistent distributed settings (launcher env, config mismatch across ranks)."""


class PeerFailureError(RunError):
    """A collective failed or timed out: another rank died or hung (rerun with --resume)."""


class HorovodMissingError(UserError):
    """engine='horovod' but Horovod is not importable in this installation."""
