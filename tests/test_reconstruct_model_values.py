"""`namsa reconstruct` with a model that cannot give sound maps (issue 32, E): maps that overflow
to inf/NaN are an error of the model in one line (no NaN map written), a card whose
``expects_input`` contradicts its architecture is refused at load naming the fields (it used to
crash the stitcher with a broadcast error), and the stitcher itself refuses maps of another shape.
The scan is a real namsa simulation written through rosettasciio (tests/test_reconstruct_cli.py)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from models import checkpoint as ckpt
from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from test_hostile_model_dirs import _set, edit, expects, record_weights
from test_reconstruct_cli import _one_error_line, _run, _write, sample, tiny_model  # noqa: F401  (fixtures)


def _copy(tiny_model, tmp_path):  # noqa: F811
    model = tmp_path / "model"
    shutil.copytree(tiny_model[0], model)
    return model


def test_maps_that_overflow_are_one_line_and_nothing_is_written(sample, tiny_model, tmp_path, capsys):  # noqa: F811
    model = _copy(tiny_model, tmp_path)
    state = load_file(str(model / ckpt.MODEL_FILE))
    state["head.weight"].fill_(3e38)  # finite, so the load checks pass; the maps overflow float32
    save_file(state, str(model / ckpt.MODEL_FILE))
    record_weights(model)
    path = _write(tmp_path / "scan.hspy", sample)
    assert _run("reconstruct", path, "--model", model, "--out", tmp_path / "out") == 2
    assert "the model produced" in _one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_expects_input_that_contradicts_the_architecture_is_refused(sample, tiny_model, tmp_path, capsys):  # noqa: F811
    model = _copy(tiny_model, tmp_path)
    edit(_set("expects_input", expects(scan_shape=[4, 4])))(model)
    path = _write(tmp_path / "scan.hspy", sample)
    assert _run("reconstruct", path, "--model", model, "--out", tmp_path / "out") == 2
    assert "the data has 16 patterns per sample but the model expects in_channels=64" in _one_error_line(capsys)


def test_the_stitcher_refuses_maps_of_another_shape():
    from models.scan_fit import Stitcher, tile_grid
    from stage.microscope import ExperimentalInputError

    stitcher = Stitcher(1, tile_grid((8, 8), (8, 8), 16))
    stitcher.add(np.ones((1, 16, 16)), (0, 0))
    with pytest.raises(ExperimentalInputError, match=r"shape \[1, 8, 8\] for a tile, but its card expects"):
        stitcher.add(np.ones((1, 8, 8)), (0, 0))
    assert np.allclose(stitcher.result(), 1.0)
