"""The README's notebook example runs exactly as written, against a quickstart-shaped run directory
(the shared tiny store and tiny trained reconstructor, linked where `make demo` puts its outputs)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)

README = Path(__file__).resolve().parents[1] / "README.md"


def notebook_example() -> str:
    """The python block of the README's "From a notebook" section, verbatim."""
    section = README.read_text().split("## From a notebook", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


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
