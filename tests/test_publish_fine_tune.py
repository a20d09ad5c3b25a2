"""scripts/publish_fine_tune.py: a model trained outside `namsa run` published with its held-out evaluation
(the tiny trained model and a real evaluation of it, `_publish_fixture`), and what it refuses."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from _publish_fixture import finished_run  # noqa: F401  (session fixture)

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "publish_fine_tune.py"


def publish(model: Path, evaluation: Path, config: Path, run: Path, out: Path, *extra: str
            ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(model), str(evaluation), "tuned", "--config", str(config),
                           "--run", str(run), "--out", str(out), *extra], capture_output=True, text=True, timeout=300)


def test_the_fine_tune_is_published_with_its_evaluation_and_config(finished_run, tmp_path):
    from models import load_reconstructor

    done = publish(finished_run / "model", finished_run / "eval", finished_run / "config.resolved.yaml",
                   tmp_path / "run", tmp_path / "out", "--config-name", "camera-study")
    assert done.returncode == 0, done.stderr
    card = load_reconstructor(tmp_path / "out" / "tuned", device="cpu").card
    metrics = json.loads((finished_run / "eval" / "metrics.json").read_text())
    assert card.held_out_evaluation.split == metrics["config"]["split"] == "test"
    assert card.trained_on.config_name == "camera-study"
    assert card.name == "tuned" and card.training.lineage == load_reconstructor(finished_run / "model").card.training.lineage
    for rel in ("model/model.safetensors", "eval/metrics.json", "config.resolved.yaml"):
        assert (tmp_path / "run" / rel).is_file(), rel   # the record of what was published


def test_an_evaluation_of_other_weights_is_refused_and_nothing_is_written(finished_run, tmp_path):
    metrics = json.loads((finished_run / "eval" / "metrics.json").read_text())
    metrics["model_card"]["files"]["model.safetensors"]["xxh3_128"] = "0" * 32
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "metrics.json").write_text(json.dumps(metrics))
    done = publish(finished_run / "model", tmp_path / "eval", finished_run / "config.resolved.yaml",
                   tmp_path / "run", tmp_path / "out")
    assert done.returncode == 2 and "scored other weights" in done.stderr and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()


def test_an_existing_run_folder_is_not_overwritten(finished_run, tmp_path):
    (tmp_path / "run").mkdir()
    done = publish(finished_run / "model", finished_run / "eval", finished_run / "config.resolved.yaml",
                   tmp_path / "run", tmp_path / "out")
    assert done.returncode == 2 and "exists; choose a new --run" in done.stderr
    assert list((tmp_path / "run").iterdir()) == []
