"""`models.train`: the training loop over stage's dataset, with exact resume (see run_state.py).

Output directory layout (``out_dir``, e.g. ``runs/<name>/``):

    train_run.json          identity of the run (architecture, training config, data manifest hash)
    checkpoints/step-*/     checkpoints (see models.checkpoint); the last ``keep_last`` and the best
    metrics.csv             one row per logged / evaluated step
    logs/tensorboard/       the same scalars for TensorBoard
    model/                  the exported reconstructor: model.safetensors + model_card.json

Files: loop.py (the Trainer, its step, `train`), data.py (stores, staging, loaders), run_state.py
(claim, checkpoints, resume), logs.py (metrics CSV, TensorBoard, FLOP accounting), export.py
(the exported model and its card), errors.py.
"""
from __future__ import annotations

from .data import manifest_hash
from .errors import CheckpointMismatchError, DataShapeError, NonFiniteLossError, OutputDirError, TrainingError
from .export import export_model
from .loop import Trainer, TrainResult, train

__all__ = ["train", "TrainResult", "Trainer", "TrainingError", "DataShapeError", "NonFiniteLossError",
           "OutputDirError", "CheckpointMismatchError", "export_model", "manifest_hash"]
