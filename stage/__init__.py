"""stage: node-local LMDB sample stores (format v1), splits, normalisation, staging, torch input pipeline.

The torch adapter (`SampleDataset`, `make_loader`) is imported lazily so that writing a store
(in simulation workers) never imports torch.
"""
from __future__ import annotations

from typing import Any

from .config import DataConfig
from .errors import (CorruptRecordError, EmptyStoreError, NotAStoreError, SchemaError, StoreError,
                     StoreFullError, StoreLockedError, StoreNotFoundError, TruncatedStoreError)
from .normalize import Normalizer
from .splits import sample_split, split_of
from .layout import find_stores
from .manifest import SCHEMA_VERSION
from .reader import StoreReader
from .storeset import StoreSet, open_store, open_stores
from .writer import StoreWriter

_LAZY = {"SampleDataset": "dataset", "make_loader": "loader", "ShardedBatchSampler": "sampler",
         "stage_store": "staging", "stage_rank_shard": "staging", "inspect_store": "inspect"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'stage' has no attribute {name!r}")


__all__ = ["DataConfig", "StoreWriter", "StoreReader", "StoreSet", "open_store", "open_stores", "find_stores",
           "split_of", "sample_split", "Normalizer", "SampleDataset", "make_loader", "stage_store", "stage_rank_shard", "inspect_store",
           "SCHEMA_VERSION", "StoreError", "NotAStoreError", "StoreNotFoundError", "SchemaError",
           "EmptyStoreError", "StoreLockedError", "StoreFullError", "CorruptRecordError",
           "TruncatedStoreError"]
