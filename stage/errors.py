"""Errors of the stage package, each one line naming the store and the fix: a `namsa.errors.UserError`
for a store path or contents that are wrong, a `namsa.errors.RunError` for a store that ran out of room."""
from __future__ import annotations

from namsa.errors import RunError, UserError


class StoreError(UserError):
    """Something is wrong with a store path or its contents."""


class NotAStoreError(StoreError):
    """The path exists but holds no store (no data.mdb)."""


class StoreNotFoundError(StoreError):
    """The path does not exist."""


class TruncatedStoreError(StoreError):
    """data.mdb is shorter than its LMDB header says (a half-copied store); mapping it would SIGBUS."""


class SchemaError(StoreError):
    """The manifest and the records disagree, or the store was written by a newer schema."""


class EmptyStoreError(StoreError):
    """The store holds no samples (or none in the requested split)."""


class StoreLockedError(StoreError):
    """Another writer holds the store's exclusive lock."""


class StoreFullError(RunError):
    """The disk (or the configured maximum map size) filled up while writing; the store is still valid.

    Not a `StoreError`: nothing about the store or the input is wrong, and a rerun with room resumes."""


class CorruptRecordError(StoreError):
    """A record failed its checksum or could not be parsed."""

    def __init__(self, store: str, key: str, reason: str):
        self.store = store
        self.key = key
        super().__init__(f"store {store}: record {key!r} is corrupt ({reason}); re-stage or re-simulate "
                         f"that sample, or open the store with skip_corrupt=True to skip it")
