"""The README's notebook example runs exactly as written, against a quickstart-shaped run directory
(the shared tiny store and tiny trained reconstructor, linked where `make demo` puts its outputs)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block(heading: str) -> str:
    """The first python block of the README section that starts with ``heading``, verbatim."""
    section = README.read_text().split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def notebook_example() -> str:
    return python_block("## From a notebook")


def test_readme_notebook_example_runs_as_written(tiny_trained_model, tiny_data_dir, tmp_path,  # noqa: F811
                                                 monkeypatch):
    run = tmp_path / "runs" / "quickstart"
    (run / "data").mkdir(parents=True)
    (run / "data" / "store-000").symlink_to(tiny_data_dir / "store-0", target_is_directory=True)
    (run / "model").symlink_to(tiny_trained_model.model_dir, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(notebook_example(), str(README), "exec"), scope)
    assert scope["sample"].cbed.shape == (1024, 32, 32)
    patterns, info = scope["patterns"], scope["info"]
    assert patterns.shape == (2, *info["gpts"]) and len(info["cell_A"]) == 3
    assert np.all(patterns.sum(axis=(1, 2)) <= 1.0 + 1e-5) and patterns.sum(axis=(1, 2)).min() > 0.5
    assert np.isfinite(scope["potential"]).all()


def test_readme_pretrained_example_runs_as_written(tmp_path, monkeypatch):
    """The study section's example: the shipped reconstructor on a (1024, 32, 32) scan from a file."""
    import namsa

    sample = namsa.simulate_sample(namsa.load_structure("Si-diamond"), (0, 0, 1),
                                   namsa.SimulationConfig(scan_shape=(32, 32), pattern_px=32, target_px=32))
    np.save(tmp_path / "scan.npy", sample.cbed)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(python_block("## Does the network beat"), str(README), "exec"), scope)
    assert scope["potential"].shape == scope["density"].shape == (32, 32)
    r = np.corrcoef(scope["potential"].ravel(), sample.potential.ravel())[0, 1]
    assert r > 0.8, r   # a real reconstruction of a material it was trained on, not just the right shape
