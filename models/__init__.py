"""models: the FC-DenseNet reconstructor, its training loop, checkpoints and the notebook API.

    cfg = ModelConfig(preset="tiny")                  # paper | small | tiny, plus overrides
    model = build_model(cfg)                          # (B, S, P, P) -> (B, C, P, P)
    result = train(cfg, TrainConfig(), None, DataConfig(), [data_dir], out_dir)
    rec = load_reconstructor(result.model_dir); rec.predict(cbed)   # physical units

The trainer and the reconstructor are imported lazily so that ``import models`` (and the
distributed engines that import ``models.distributed``) stays light. See docs/models.md.
"""
from __future__ import annotations

from typing import Any

from .config import Architecture, ModelConfig, ModelConfigError, TrainConfig
from .fcdensenet import FCDenseNet, build_model, count_parameters

_LAZY = {"train": "training", "TrainResult": "training", "load_reconstructor": "reconstructor",
         "Reconstructor": "reconstructor",
         "pretrained_names": "reconstructor", "pretrained_card": "reconstructor", "forward_conv_ops": "flops"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")


__all__ = ["ModelConfig", "TrainConfig", "Architecture", "ModelConfigError", "FCDenseNet", "build_model",
           "count_parameters", "train", "TrainResult", "load_reconstructor", "Reconstructor", "pretrained_names",
           "pretrained_card", "forward_conv_ops"]
