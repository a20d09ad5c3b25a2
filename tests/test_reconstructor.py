"""load_reconstructor: round trip from the model dir, the run dir and a checkpoint dir; units; bad input."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import models
import stage
from _models_fixture import tiny_trained_model  # noqa: F401  (one real tiny training per session)
from models.checkpoint import PickledCheckpointError
from models.reconstructor import ReconstructorInputError
from _train_helpers import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def samples(tiny_data_dir):
    with stage.open_stores(stage.find_stores(tiny_data_dir)) as stores:
        return [stores[i] for i in range(3)]


def _by_hand(rec, cbed: np.ndarray) -> np.ndarray:
    """The documented pipeline, step by step: normalise, network, invert the target scaling."""
    with torch.no_grad():
        y = rec.model(rec.normalizer.cbed(torch.from_numpy(cbed[None].astype(np.float32))))
    return np.stack([rec.normalizer.target_inverse(y[0, c].numpy(), t) for c, t in enumerate(rec.targets)])


def test_predict_round_trip_in_physical_units(tiny_trained_model, samples):
    rec = models.load_reconstructor(tiny_trained_model.model_dir, device="cpu")
    assert rec.targets == ["potential"] and rec.card.target_units == {"potential": "V*Angstrom"}
    cbed = samples[0].cbed
    single = rec.predict(cbed)
    assert single.shape == (1, *samples[0].potential.shape) and single.dtype == np.float32
    np.testing.assert_allclose(single, _by_hand(rec, cbed), rtol=1e-5, atol=1e-5)
    batch = np.stack([s.cbed for s in samples])
    out = rec.predict(batch)
    assert out.shape == (3, 1, *samples[0].potential.shape)
    np.testing.assert_allclose(out[0], single, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(rec.predict(torch.from_numpy(batch)), out, rtol=1e-6, atol=1e-6)
    # physical units: the prediction lives on the scale of the potential (V*A), not standardised
    mean, std = rec.normalizer.targets["potential"]
    assert abs(float(out.mean()) - mean) < 3 * std


def test_run_dir_and_checkpoint_dir_load_the_same_model(tiny_trained_model, samples):
    from_model = models.load_reconstructor(tiny_trained_model.model_dir, device="cpu")
    from_run = models.load_reconstructor(Path(tiny_trained_model.model_dir).parent, device="cpu")
    from_ckpt = models.load_reconstructor(tiny_trained_model.best_checkpoint, device="cpu")
    cbed = samples[1].cbed
    ref = from_model.predict(cbed)
    np.testing.assert_array_equal(from_run.predict(cbed), ref)
    np.testing.assert_array_equal(from_ckpt.predict(cbed), ref)
    assert from_ckpt.normalizer == from_model.normalizer


def test_bad_input_is_a_user_error(tiny_trained_model, samples, tmp_path):
    rec = models.load_reconstructor(tiny_trained_model.model_dir, device="cpu")
    with pytest.raises(ReconstructorInputError, match="S = 64"):
        rec.predict(samples[0].cbed[:10])
    with pytest.raises(ReconstructorInputError, match="does not exist"):
        models.load_reconstructor(tmp_path / "nope")
    with pytest.raises(ReconstructorInputError, match="neither a model dir"):
        models.load_reconstructor(tmp_path)


def test_pickled_model_dir_is_refused(tiny_trained_model, tmp_path):
    import shutil

    dst = tmp_path / "model"
    shutil.copytree(tiny_trained_model.model_dir, dst)
    torch.save({"w": torch.zeros(1)}, dst / "model.safetensors")
    with pytest.raises(PickledCheckpointError, match="pickled payload"):
        models.load_reconstructor(dst)
