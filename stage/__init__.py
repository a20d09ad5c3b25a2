"""stage: node-local LMDB sample stores (format v1), splits, normalisation, staging, torch input pipeline.

The store classes (which load lmdb) and the torch adapter (`SampleDataset`, `make_loader`) are
imported on first use, so that writing a store (in simulation workers) never imports torch and
reading a microscope file (`stage.microscope`) never imports lmdb.
"""
from __future__ import annotations

from typing import Any

from .config import DataConfig
from .errors import (CorruptRecordError, EmptyStoreError, NotAStoreError, SchemaError, StoreError,
                     StoreFullError, StoreLockedError, StoreNotFoundError, TruncatedStoreError)
from .splits import sample_split, split_of
from .layout import find_stores

#: name -> the submodule that defines it, imported on first use (lmdb, torch)
_LAZY = {"Normalizer": "normalize", "SCHEMA_VERSION": "manifest", "StoreReader": "reader",
         "StoreSet": "storeset", "open_store": "storeset", "open_stores": "storeset", "StoreWriter": "writer",
         "SampleDataset": "dataset", "make_loader": "loader", "ShardedBatchSampler": "sampler",
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
