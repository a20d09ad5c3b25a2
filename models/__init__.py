"""models: the FC-DenseNet reconstructor, its training loop, checkpoints and the notebook API.

    cfg = ModelConfig(preset="tiny")                  # paper | small | tiny, plus overrides
    model = build_model(cfg)                          # (B, S, P, P) -> (B, C, P, P)
    result = train(cfg, TrainConfig(), None, DataConfig(), [data_dir], out_dir)
    rec = load_reconstructor(result.model_dir); rec.predict(cbed)   # physical units

The network, the trainer and the reconstructor are imported lazily so that ``import models`` (and the
distributed engines that import ``models.distributed``) stays light: no torch until one is used. See docs/models.md.
"""
from __future__ import annotations

from typing import Any

from .config import Architecture, ModelConfig, ModelConfigError, TrainConfig

# torch is imported on first use of these, not by ``import models``: `namsa evaluate --help` lists the
# shipped models (models.pretrained_index) without it
_LAZY = {"train": "training", "TrainResult": "training", "load_reconstructor": "reconstructor",
         "Reconstructor": "reconstructor", "FCDenseNet": "fcdensenet", "build_model": "fcdensenet",
         "count_parameters": "fcdensenet", "pretrained_names": "pretrained_index",
         "flagship_name": "pretrained_index", "pretrained_card": "reconstructor", "forward_conv_ops": "flops"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")


__all__ = ["ModelConfig", "TrainConfig", "Architecture", "ModelConfigError", "FCDenseNet", "build_model",
           "count_parameters", "train", "TrainResult", "load_reconstructor", "Reconstructor", "pretrained_names",
           "flagship_name", "pretrained_card", "forward_conv_ops"]
