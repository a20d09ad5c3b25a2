"""Shared pytest setup: GPU tests skip cleanly on machines without a CUDA device."""
from __future__ import annotations

import pytest


def _cuda_available() -> bool:
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        try:
            import torch

            return torch.cuda.is_available()
        except Exception:
            return False


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU on this machine (run with -m gpu on a GPU node)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
