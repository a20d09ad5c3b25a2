"""One finished run directory per test session, as `namsa publish` reads it (model/, eval/metrics.json,
config.resolved.yaml): the tiny trained model (`_models_fixture`), a real evaluation of it on the lead's
tiny data set, and the resolved config of its simulation. Test modules import the fixture together with
the one it builds on (`from _publish_fixture import finished_run` and
`from _models_fixture import tiny_trained_model`). Read-only: copy it (`copy_run`) before changing it.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

#: what publish reads from a run directory (the rest of a real run is not needed to publish)
RUN_FILES = ("model", "eval/metrics.json", "config.resolved.yaml")


@pytest.fixture(scope="session")
def finished_run(tiny_trained_model: Any, tiny_data_dir: Path, tiny_sim_config: Any,
                 tmp_path_factory: pytest.TempPathFactory) -> Path:
    import stage
    from evaluation import EvaluationConfig, evaluate
    from workflow.config import PipelineConfig, dump_config

    run = tmp_path_factory.mktemp("finished_run")
    shutil.copytree(tiny_trained_model.model_dir, run / "model")
    evaluate(EvaluationConfig(n_bootstrap=20, n_panels=1, worst_k=1), stage.DataConfig(), [tiny_data_dir],
             run / "model", run / "eval")
    cfg = PipelineConfig(simulation=tiny_sim_config, model={"preset": "tiny", "in_channels": 64})
    (run / "config.resolved.yaml").write_text(dump_config(cfg))
    return run


def copy_run(run: Path, dest: Path) -> Path:
    """A changeable copy of the files of ``run`` that publish reads, at ``dest``; returns ``dest``."""
    for rel in RUN_FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        copy = shutil.copytree if (run / rel).is_dir() else shutil.copyfile
        copy(run / rel, dest / rel)
    return dest
