"""The evaluation of the tiny really-trained reconstructor on the tiny real data set, run once per session
and shared (read-only) by tests/test_evaluate.py and tests/test_report_reading.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from evaluation import EvaluationConfig, evaluate


@pytest.fixture(scope="session")
def evaluated(tiny_trained_model, tiny_data_dir, tmp_path_factory):  # noqa: F811
    """(the EvaluationResult, its metrics.json as a dict): bootstrap 200, 2 panels, worst 2, ptychography on."""
    import stage

    out = tmp_path_factory.mktemp("eval")
    cfg = EvaluationConfig(n_bootstrap=200, n_panels=2, worst_k=2, ptycho=True)
    result = evaluate(cfg, stage.DataConfig(), [tiny_data_dir], tiny_trained_model.model_dir, out,
                      train_metrics_csv=tiny_trained_model.metrics_csv)
    return result, json.loads(Path(result.metrics_json).read_text())
