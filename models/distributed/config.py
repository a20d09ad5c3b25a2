"""Configuration of data-parallel training: which gradient-reduction engine and its knobs.

Sizes are in MiB (``*_mb``), times in milliseconds (``*_ms``) or seconds (``*_s``).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from models.distributed.errors import DistributedConfigError

EngineName = Literal["none", "ddp", "grouped", "bitvector", "master_worker", "hierarchical", "horovod"]
GroupingMode = Literal["per_block", "chunks", "min_bytes"]
Compression = Literal["none", "fp16", "bf16", "int8_linear", "int8_tree"]

# Settings a tuning run (models.distributed.tuning) may write into a tuned-settings JSON file.
TUNABLE_FIELDS = ("bucket_mb", "grouping", "group_count", "group_min_mb",
                  "fusion_threshold_mb", "cycle_time_ms", "cache_capacity")


class DistributedConfig(BaseModel):
    """How gradients are reduced across data-parallel ranks.

    ``engine``: ``none`` (single process, or no reduction), ``ddp`` (torch DDP baseline),
    ``grouped`` (per-group async all_reduce as soon as a group is complete), ``bitvector`` (the
    paper's cached bit-vector readiness coordination), ``master_worker`` (Horovod's original rank-0
    coordinator, the comparison baseline), ``hierarchical`` (Kurth et al. 2018: reduce-scatter in
    the node, all_reduce across nodes on each slice, all-gather in the node), ``horovod``
    (Horovod's DistributedOptimizer with groups). With world size 1 every engine is a no-op.
    """

    model_config = ConfigDict(extra="forbid")

    engine: EngineName = "none"
    grouping: GroupingMode = Field(
        "per_block", description="per_block: one group per model.blocks() entry; chunks: group_count "
        "contiguous chunks in backward order; min_bytes: close a group once it holds group_min_mb")
    group_count: int = Field(4, ge=1, description="number of groups for grouping='chunks'")
    group_min_mb: float = Field(1.0, gt=0, description="minimum group size for grouping='min_bytes'")
    compression: Compression = "none"
    error_feedback: bool = Field(True, description="carry int8 quantisation error into the next step")
    quant_chunk: int = Field(2048, ge=16, description="elements per max-scaled chunk (int8 codes)")
    gradient_lag: bool = Field(False, description="apply the previous step's reduced gradient")
    bucket_mb: float = Field(25.0, gt=0, description="DDP bucket size")
    cycle_time_ms: float = Field(1.0, ge=0, description="coordination cycle (bitvector, master_worker, horovod)")
    fusion_threshold_mb: float = Field(64.0, ge=0, description="Horovod tensor-fusion buffer")
    cache_capacity: int = Field(1024, ge=0, description="Horovod response-cache entries (0 disables)")
    node_size: int | None = Field(None, ge=1, description="ranks per node; default: from the launcher")
    timeline: str | None = Field(None, description="write a Chrome-trace JSON timeline to this path")
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    timeout_s: float = Field(300.0, gt=0, description="collective timeout; a dead peer fails within it")
    tuned_settings: str | None = Field(None, description="JSON from models.distributed.tuning; its "
                                       "values override the fields it names")

    def resolved(self) -> "DistributedConfig":
        """This config with the fields named in ``tuned_settings`` (if set) replaced by the tuned values."""
        if not self.tuned_settings:
            return self
        path = Path(self.tuned_settings)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DistributedConfigError(
                f"distributed.tuned_settings={path}: cannot read it ({type(exc).__name__}); "
                "run `namsa tuning --out FILE` or unset it") from None
        best = data.get("best", data)
        settings = {k: v for k, v in best.items() if k in TUNABLE_FIELDS}
        return self.model_copy(update={**DistributedConfig.model_validate(
            {**self.model_dump(), **settings, "tuned_settings": None}).model_dump(include=set(settings))})

    def digest(self) -> str:
        """Stable hash of every field; ranks compare it at start-up to catch mismatched configs."""
        payload = json.dumps(self.model_dump(exclude={"timeline"}), sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]
