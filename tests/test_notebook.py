"""notebooks/reconstruct.ipynb runs end to end (nbclient) against a tiny trained reconstructor."""
from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "reconstruct.ipynb"


def test_reconstruct_notebook_runs(tiny_trained_model, tiny_data_dir, tmp_path, monkeypatch):  # noqa: F811
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert "parameters" in nb.cells[1].metadata.get("tags", [])
    # The kernel inherits the environment: that is how the parameters cell gets its values.
    monkeypatch.setenv("NAMSA_MODEL_DIR", str(tiny_trained_model.model_dir))
    monkeypatch.setenv("NAMSA_DATA_DIR", str(tiny_data_dir))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()   # raises CellExecutionError on any failing cell
    text = "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                     for out in cell.get("outputs", []) if out.get("output_type") == "stream")
    assert "potential" in text and "network" in text and "iCoM" in text and "rel_l2" in text
    images = [out for cell in nb.cells for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
    assert len(images) >= 2   # CBED patterns and truth / prediction / error
