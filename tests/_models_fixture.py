"""One tiny trained reconstructor per test session, shared by the evaluation and notebook tests.

Real training (`models.train`, tiny preset, a few CPU steps) on the lead's ``tiny_data_dir``.
Test modules import the fixture (`from _models_fixture import tiny_trained_model`); the result
is cached at module level so that importing the fixture into several modules trains once.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

#: training steps: enough for the loss to move, few enough for ~10 s on 2 CPU cores.
TINY_TRAIN_STEPS = 8
_CACHE: dict[str, Any] = {}


def tiny_train_configs(**train_overrides: Any) -> tuple[Any, Any, Any, Any]:
    """(model_cfg, train_cfg, dist_cfg, data_cfg) of the tiny CPU training run."""
    import models
    import stage
    from models.distributed import DistributedConfig

    model_cfg = models.ModelConfig(preset="tiny", targets=["potential"])
    train_cfg = models.TrainConfig(max_steps=TINY_TRAIN_STEPS, batch_size=2, lr0=1e-3, eval_every=4,
                                   checkpoint_every=4, log_every=1, device="cpu", progress=False,
                                   tensorboard=False, seed=0, **train_overrides)
    data_cfg = stage.DataConfig(num_workers=0, pin_memory=False)
    return model_cfg, train_cfg, DistributedConfig(), data_cfg


@pytest.fixture(scope="session")
def tiny_trained_model(tiny_data_dir: Path, tiny_sim_config: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`models.TrainResult` of the tiny run (``.model_dir``, ``.metrics_csv``, ...); its card records
    the input it expects (``expects_input``: the config that simulated ``tiny_data_dir``)."""
    if "result" not in _CACHE:
        import models

        model_cfg, train_cfg, dist_cfg, data_cfg = tiny_train_configs()
        out = tmp_path_factory.mktemp("tiny_model")
        _CACHE["result"] = models.train(model_cfg, train_cfg, dist_cfg, data_cfg, [tiny_data_dir], out,
                                        simulation=tiny_sim_config)
    return _CACHE["result"]
