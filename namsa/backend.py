"""Array backend selection: numpy + scipy.fft (or pyFFTW when installed) on CPU, cupy on CUDA.

``get_backend("cpu" | "cuda" | "cuda:<i>")`` returns a :class:`Backend` whose ``xp`` is the array
module and whose ``fft2`` / ``ifft2`` transform the last two axes in place where the library allows.
FFT normalisation is numpy's "backward": ``ifft2(fft2(a)) == a``. cupy is imported lazily so that
CPU machines never need it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import scipy.fft

from .errors import UserError


class DeviceError(UserError):
    """The requested device is not available."""


@dataclass
class Backend:
    """Array module plus in-place-where-possible 2-D FFTs over the last two axes."""

    name: str
    xp: Any
    fft2: Callable[[Any], Any]
    ifft2: Callable[[Any], Any]
    device_index: int | None = None
    threads: int = 1
    _extra: dict = field(default_factory=dict)

    def asnumpy(self, a: Any) -> np.ndarray:
        if self.xp is np:
            return np.asarray(a)
        return self.xp.asnumpy(a)

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        return self.xp.asarray(a, dtype=dtype)

    def synchronize(self) -> None:
        if self.xp is not np:
            self.xp.cuda.get_current_device().synchronize()


def cpu_threads() -> int:
    """CPU cores this process may use (respects affinity masks, e.g. Slurm / taskset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def _cpu_backend(fft_threads: int) -> Backend:
    # Each multislice worker thread runs its own FFTs on its own sub-batch, so one FFT thread per
    # call by default: threading over the batch also parallelises the elementwise multiplies.
    def fft2(a):
        return scipy.fft.fft2(a, axes=(-2, -1), overwrite_x=True, workers=fft_threads)

    def ifft2(a):
        return scipy.fft.ifft2(a, axes=(-2, -1), overwrite_x=True, workers=fft_threads)

    return Backend(name="cpu", xp=np, fft2=fft2, ifft2=ifft2, threads=fft_threads)


def _cuda_backend(index: int) -> Backend:
    try:
        import cupy
    except ImportError as exc:
        raise DeviceError("device='cuda' needs cupy (pip install 'namsa[gpu]'); use device='cpu' "
                          "on machines without a CUDA GPU") from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # cupy present but no driver / device
        raise DeviceError(f"no CUDA device is usable ({type(exc).__name__}); use device='cpu'") from exc
    if index >= count:
        raise DeviceError(f"device='cuda:{index}' does not exist ({count} CUDA devices); pick 0..{count - 1}")
    cupy.cuda.Device(index).use()

    def fft2(a):
        return cupy.fft.fft2(a, axes=(-2, -1), overwrite_x=True)

    def ifft2(a):
        return cupy.fft.ifft2(a, axes=(-2, -1), overwrite_x=True)

    return Backend(name=f"cuda:{index}", xp=cupy, fft2=fft2, ifft2=ifft2, device_index=index)


def get_backend(device: str = "cpu", fft_threads: int = 1) -> Backend:
    """Backend for ``device`` ("cpu", "cuda" or "cuda:<index>"); UserError when unavailable."""
    if device == "cpu":
        return _cpu_backend(fft_threads)
    if device == "cuda":
        return _cuda_backend(0)
    if device.startswith("cuda:") and device[5:].isdigit():
        return _cuda_backend(int(device[5:]))
    raise DeviceError(f"device must be 'cpu', 'cuda' or 'cuda:<index>', got {device!r}")
