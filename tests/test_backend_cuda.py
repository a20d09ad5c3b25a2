"""namsa.backend's CUDA branch, run on the CPU through the strict numpy stand-in for cupy.

The stand-in (tests/strict_cupy.py) is not a GPU result and claims none: it has cupy's API shape where
the backend relies on it (``cupy.fft`` without ``overwrite_x``, like cupy's numpy-style FFT module;
``cupyx.scipy.fft`` with it, like scipy.fft) and refuses host/device mixing as cupy does, so the
backend's own CUDA code runs here and a call cupy would refuse fails here too. Real-GPU coverage:
``pytest -m gpu`` in scripts/gpu_checks.sh.
"""
from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest

import strict_cupy
from namsa.backend import DeviceError, get_backend


def test_cuda_workspace_transforms_match_the_cpu(monkeypatch):
    strict_cupy.install(monkeypatch)
    backend = get_backend("cuda")
    assert backend.name == "cuda:0" and backend.device_index == 0
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((3, 16, 12)) + 1j * rng.standard_normal((3, 16, 12))).astype(np.complex64)
    ws = backend.workspace(a.shape)
    ws.buffer[...] = backend.asarray(a)
    spectrum = ws.forward(ws.buffer)
    np.testing.assert_allclose(backend.asnumpy(spectrum), np.fft.fft2(a), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(backend.asnumpy(ws.backward(spectrum)), a * 16 * 12, rtol=1e-4, atol=1e-3)


def test_a_cupy_that_cannot_run_an_fft_is_one_error_at_backend_creation(monkeypatch):
    broken = types.ModuleType("cupyx.scipy.fft")

    def no_cufft(*args, **kwargs):
        raise RuntimeError("cuFFT failed to load: libcufft.so.12: cannot open shared object file")

    broken.fft2 = broken.ifft2 = no_cufft
    strict_cupy.install(monkeypatch, broken)
    with pytest.raises(DeviceError) as err:
        get_backend("cuda:0")
    line = str(err.value)
    assert "\n" not in line and "cupy cannot run an FFT on cuda:0" in line and "libcufft" in line
    assert ".[gpu-cuda13]" in line and "device='cpu'" in line


def test_gpu_test_collection_survives_a_machine_without_the_notebook_packages(tmp_path):
    """`pytest -m gpu` on the GPU image (no nbformat/nbclient) must collect every module: one
    module-level ImportError would interrupt the whole collection and run zero GPU tests."""
    import subprocess
    from pathlib import Path

    for name in ("nbformat", "nbclient"):   # packages that fail to import, as on that image
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('no {name} on this machine')\n")
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                          "tests/test_notebook.py", "tests/test_backend_cuda.py"], cwd=root, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=300)
    assert run.returncode in (0, 5), run.stdout[-1500:] + run.stderr[-1500:]   # 5: nothing selected, no error
    assert "error" not in run.stdout.lower(), run.stdout[-1500:]


def test_the_stand_in_refuses_host_device_mixing_as_cupy_does(monkeypatch):
    cupy = strict_cupy.install(monkeypatch)
    host = np.ones((2, 3), np.float32)
    dev = cupy.asarray(host)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(dev)
    for mix in (lambda: dev * host, lambda: host + dev, lambda: cupy.multiply(dev, host, out=dev),
                lambda: cupy.exp(host), lambda: np.concatenate([dev, dev]), lambda: dev.__setitem__(0, host[0])):
        with pytest.raises(TypeError):
            mix()
    np.testing.assert_array_equal(cupy.asnumpy(dev * np.float32(2) + 1), host * 2 + 1)   # scalars mix freely
    assert isinstance(dev @ dev.T, cupy.ndarray) and cupy.cuda.Device(0).mem_info[0] > 0
