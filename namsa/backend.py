"""Array backend selection: numpy + pyFFTW (or scipy.fft) on CPU, cupy on CUDA.

``get_backend("cpu" | "cuda" | "cuda:<i>")`` returns a :class:`Backend`: ``xp`` is the array
module, and ``workspace(shape)`` gives a per-thread :class:`FFTWorkspace` holding a complex64
batch buffer with planned, in-place, *unnormalised* 2-D FFTs over its last two axes
(``backward(forward(a)) == ny * nx * a``; callers fold the 1/N into their multipliers so no
extra pass over the data is spent on normalisation). On CPU, pyFFTW plans are made once per
shape and reused for every batch and slice, with FFTW_PATIENT from this machine's shared wisdom
(:mod:`namsa.fftplans`): as fast as a per-process measured plan, yet the same plan in every
process, so a sample is bit-identical wherever it is simulated. FFTW_ESTIMATE plans (no timing,
no wisdom) ran 8-16x slower at 256^2-512^2 here and are kept only for comparison; scipy.fft
(pocketfft, no plans, deterministic, about 2x slower) is the fallback without pyFFTW
(benchmarks/RESULTS.md, "FFT plans and probe-by-probe speed").
cupy is imported lazily so that CPU machines never need it; its FFT plans are cached by cupy.
On CUDA, ``fft`` is cupyx.scipy.fft (scipy.fft on CPU) for the one-off transforms of building the
potential, ``free_bytes()`` is the device's free memory (batch planning) and ``to_host`` brings a
result home through a pinned staging buffer, so the device-to-host copy runs at full bus speed.
"""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import scipy.fft

from .errors import UserError


class DeviceError(UserError):
    """The requested device is not available."""


@dataclass
class FFTWorkspace:
    """A (batch, ny, nx) complex64 buffer and unnormalised forward/backward transforms of it.

    ``forward(a)`` / ``backward(a)`` transform ``a`` (which must be the array last returned, starting
    with ``buffer``) and return the result: the buffer itself with pyFFTW, a new array otherwise.
    """

    buffer: Any
    forward: Callable[[Any], Any]
    backward: Callable[[Any], Any]


@dataclass
class Backend:
    """Array module, host/device transfers and FFT workspaces for one device."""

    name: str
    xp: Any
    workspace: Callable[[tuple[int, int, int]], FFTWorkspace]   # (batch, ny, nx) -> FFTWorkspace
    device_index: int | None = None
    fft: Any = scipy.fft        # scipy.fft-style module for one-off transforms on this device
    _pinned: threading.local = field(default_factory=threading.local, repr=False)

    @property
    def on_device(self) -> bool:
        """Whether arrays live on a GPU (so results must be copied home)."""
        return self.xp is not np

    def asnumpy(self, a: Any) -> np.ndarray:
        if self.xp is np:
            return np.asarray(a)
        return self.xp.asnumpy(a)

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        return self.xp.asarray(a, dtype=dtype)

    def synchronize(self) -> None:
        if self.xp is not np:
            self.xp.cuda.Device(self.device_index).synchronize()

    def device_scope(self) -> contextlib.AbstractContextManager:
        """``with backend.device_scope():`` makes this backend's GPU the calling thread's current device
        for the block (kernels, allocations and cuFFT plans land there) and restores the previous one
        after, so a pool thread (current device 0 when it starts) works on the right GPU and neither
        cupy's nor torch's current device is switched for good. A no-op on CPU."""
        if self.xp is np:
            return contextlib.nullcontext()
        return self.xp.cuda.Device(self.device_index)

    def free_bytes(self) -> int | None:
        """Free memory on the device (bytes), None on CPU (where memory_budget_gb alone decides)."""
        if self.xp is np:
            return None
        return int(self.xp.cuda.Device(self.device_index or 0).mem_info[0])

    def to_host(self, a: Any, out: np.ndarray | None = None) -> np.ndarray:
        """A device result as a numpy array of its own, or copied into ``out``: on CUDA through a pinned
        staging buffer kept per thread, shape and dtype (pinned allocations are slow; pageable copies run
        at a fraction of the bus speed), on CPU the array itself (or one copy into ``out``)."""
        if self.xp is np:
            if out is None:
                return np.asarray(a)
            out[...] = a
            return out
        import cupyx

        key = (tuple(a.shape), str(a.dtype))
        buffers = self._pinned.__dict__.setdefault("buffers", {})
        if key not in buffers:
            buffers[key] = cupyx.empty_pinned(key[0], dtype=a.dtype)
        staged = a.get(out=buffers[key])
        if out is None:
            return staged.copy()
        out[...] = staged
        return out

    def reduce(self, intensity: Any, reducer: Callable[[Any], Any], device_reducer: bool,
               out: np.ndarray | None = None) -> Any:
        """``reducer`` applied to a batch of intensities on the backend: on the device, then only its
        result comes home (``device_reducer``), or on a host copy (a numpy-only reducer); copied into
        ``out`` (this batch's rows of the caller's result) when given."""
        if device_reducer:
            return self.to_host(reducer(intensity), out)
        result = reducer(self.asnumpy(intensity))
        if out is None:
            return result
        out[...] = result
        return out


class _SharedBlasLimit:
    """One process-wide "BLAS on one thread" limit shared by every holder in every thread.

    OpenBLAS (pthreads) has one process-wide thread count. threadpoolctl's limits restore on exit
    what they saw on entry, so two overlapping holders in different threads undid each other in
    the wrong order, and since 3.8 only the thread that first set a limit may change it while it
    lives: a pool thread's GEMM then ran on the default OpenBLAS threads mid-sample and changed its
    last bits (samples prepared ahead differed from sequential ones, tests/test_pipelined_simulation.py).
    Counted here instead: the first holder sets the limit, the last one to leave restores it, from
    whichever thread, and no thread is left owning OpenBLAS's setting (tests/test_blas_limit.py)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._limit: Any = None

    @contextlib.contextmanager
    def held(self):
        with self._lock:
            if self._holders == 0:
                self._limit = self._set_one_thread()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._limit is not None:
                    _release_openblas_control()
                    self._limit.restore_original_limits()
                    _release_openblas_control()
                    self._limit = None

    @staticmethod
    def _set_one_thread() -> Any:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # pragma: no cover - a declared dependency; degrade to BLAS defaults
            return None
        _release_openblas_control()
        limit = threadpool_limits(limits=1, user_api="blas")
        _release_openblas_control()
        return limit


def _release_openblas_control() -> None:
    """Let any thread set OpenBLAS's thread count next (threadpoolctl >= 3.8 gives it to the thread
    that last set it, for as long as that thread lives; older versions have no owner)."""
    try:
        from threadpoolctl import OpenBLASController
    except ImportError:  # pragma: no cover
        return
    release = getattr(OpenBLASController, "clear_controlling_thread", None)
    if release is not None:
        release(force=True)


_BLAS_LIMIT = _SharedBlasLimit()


def single_threaded_blas():
    """Context manager pinning BLAS (OpenBLAS/MKL) to one thread while any thread holds it.

    namsa parallelises over probes and beams itself; a multi-threaded BLAS underneath spins
    against those threads (and against other processes on a busy node): measured here, small
    complex GEMMs ran 15-60x slower with 2 OpenBLAS threads on 2 loaded cores than with 1.
    Safe to nest and to hold from several threads at once (:class:`_SharedBlasLimit`).
    """
    return _BLAS_LIMIT.held()


def cpu_threads() -> int:
    """CPU cores this process may use (respects affinity masks, e.g. Slurm / taskset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def _pyfftw_workspace(shape: tuple[int, int, int], effort: str) -> FFTWorkspace:
    import pyfftw

    from .fftplans import plan_pair

    buffer = pyfftw.empty_aligned(shape, dtype=np.complex64)
    fwd, bwd, _ = plan_pair(buffer, effort)
    buffer[...] = 0

    def forward(a):
        fwd.execute()   # in place on the buffer; releases the GIL, so worker threads run in parallel
        return a

    def backward(a):
        bwd.execute()
        return a

    return FFTWorkspace(buffer=buffer, forward=forward, backward=backward)


def _scipy_workspace(shape: tuple[int, int, int]) -> FFTWorkspace:
    buffer = np.zeros(shape, dtype=np.complex64)
    return FFTWorkspace(
        buffer=buffer,
        forward=lambda a: scipy.fft.fft2(a, axes=(-2, -1), overwrite_x=True, norm="backward", workers=1),
        backward=lambda a: scipy.fft.ifft2(a, axes=(-2, -1), overwrite_x=True, norm="forward", workers=1))


#: CPU FFT choices: pyFFTW with a planner effort, or scipy.fft; "auto" is the first one available
CPU_FFTS = ("fftw-patient", "fftw-measure", "fftw-estimate", "scipy")


def _cpu_backend(fft: str) -> Backend:
    if fft == "auto":
        try:
            import pyfftw  # noqa: F401

            fft = "fftw-patient"
        except ImportError:
            fft = "scipy"
    if fft not in CPU_FFTS:
        raise UserError(f"fft must be 'auto' or one of {', '.join(CPU_FFTS)}, got {fft!r}")
    if fft == "scipy":
        return Backend(name="cpu (scipy.fft)", xp=np, workspace=_scipy_workspace)
    effort = fft.split("-", 1)[1]
    return Backend(name=f"cpu (pyFFTW, {effort})", xp=np,
                   workspace=lambda shape: _pyfftw_workspace(shape, effort))


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
    try:
        import cupyx.scipy.fft as cufft
    except Exception as exc:  # a cupy without its cuFFT bindings cannot simulate anything
        raise DeviceError(f"cupy cannot load cupyx.scipy.fft ({type(exc).__name__}); install the cupy wheel of "
                          "this machine's CUDA or use device='cpu'") from None
    backend = Backend(name=f"cuda:{index}", xp=cupy, workspace=_cupy_workspace, device_index=index, fft=cufft)
    # once per process and device (a check blocks on the GPU): keyed by the cupy module too, so a test's
    # stand-in and a real cupy are never taken for one another
    key = (id(cupy), index)
    with _FFT_CHECKED_LOCK:
        if key not in _FFT_CHECKED:
            with backend.device_scope():
                _check_one_fft(backend)
            _FFT_CHECKED.add(key)
    return backend


#: (cupy module id, device index) pairs whose FFT round trip passed in this process
_FFT_CHECKED: set[tuple[int, int]] = set()
_FFT_CHECKED_LOCK = threading.Lock()


def _cupy_workspace(shape: tuple[int, int, int]) -> FFTWorkspace:
    # cupyx.scipy.fft, not cupy.fft: only the scipy-style API takes overwrite_x (cupy.fft.fft2 raises
    # TypeError on it), and overwriting spares a (batch, ny, nx) complex64 copy per transform.
    import cupy
    import cupyx.scipy.fft as cufft

    return FFTWorkspace(
        buffer=cupy.zeros(shape, dtype=cupy.complex64),
        forward=lambda a: cufft.fft2(a, axes=(-2, -1), overwrite_x=True, norm="backward"),
        backward=lambda a: cufft.ifft2(a, axes=(-2, -1), overwrite_x=True, norm="forward"))


def _check_one_fft(backend: Backend) -> None:
    """Run one small FFT round trip up front, so a cupy that cannot use this GPU (a wheel for another
    CUDA major version, missing cuFFT libraries) fails once, here, in one line, and not once per sample."""
    try:
        ws = backend.workspace((1, 8, 8))
        ws.buffer[...] = 1.0
        ok = abs(complex(backend.asnumpy(ws.backward(ws.forward(ws.buffer)))[0, 0, 0]) - 64.0) < 1e-3
    except Exception as exc:  # any cupy / CUDA / cuFFT failure means the device is unusable
        raise DeviceError(f"cupy cannot run an FFT on {backend.name} ({type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:160]}); install the cupy wheel of this machine's CUDA "
                          "(pip install -e '.[gpu]' for CUDA 12, '.[gpu-cuda13]' for CUDA 13) or use device='cpu'") from None
    if not ok:
        raise DeviceError(f"cupy's FFT on {backend.name} gives wrong numbers (a round trip of ones is not 64); "
                          "reinstall cupy for this machine's CUDA or use device='cpu'")


def get_backend(device: str = "cpu", fft: str = "auto") -> Backend:
    """Backend for ``device`` ("cpu", "cuda" or "cuda:<index>"); ``fft`` ("auto" or one of
    :data:`CPU_FFTS`) picks the CPU FFT library and FFTW planner effort. UserError when the
    device is unavailable."""
    if device == "cpu":
        return _cpu_backend(fft)
    if device == "cuda":
        return _cuda_backend(0)
    if device.startswith("cuda:") and device[5:].isdigit():
        return _cuda_backend(int(device[5:]))
    raise DeviceError(f"device must be 'cpu', 'cuda' or 'cuda:<index>', got {device!r}")
