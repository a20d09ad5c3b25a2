"""A strict numpy-backed stand-in for cupy, kept in tests/ only, to find host/device mix-ups on a CPU.

It is not a GPU and claims no GPU result: its arrays are numpy arrays in a :class:`DeviceArray`
wrapper that refuses what cupy refuses, so the simulator's CUDA code runs here and every place
where host and device arrays meet shows up as a TypeError:

- ``np.asarray(device_array)`` (``__array__``) raises TypeError ("Implicit conversion to a NumPy
  array is not allowed"), as cupy does; ``asnumpy`` / ``.get()`` are the explicit ways home;
- a ufunc or operator mixing a DeviceArray with a numpy ndarray (0-d included) raises TypeError,
  and so does a stand-in ``cupy.<ufunc>`` or ``cupyx.scipy.fft`` call given a numpy ndarray;
- any other numpy function given a DeviceArray (``np.concatenate``, ``np.fft.fftshift``, ...)
  raises TypeError: host-only code must not receive device arrays (stricter than cupy, whose
  ``__array_function__`` would quietly dispatch some of them).

Python and numpy scalars mix freely, as with cupy. The module surface is what namsa uses: array
creation, ufuncs, dtypes, ``fft`` (numpy-style, no ``overwrite_x``, like ``cupy.fft``),
``cupyx.scipy.fft`` (with ``overwrite_x``), ``cuda.Device(i).use() / .mem_info / .synchronize()``,
``cuda.runtime.getDeviceCount``, ``cupyx.empty_pinned`` and ``get_default_memory_pool``.
Install it with :func:`install` (monkeypatch.setitem on sys.modules). :class:`DeviceClock` adds up
the wall time spent inside stand-in device operations, so a benchmark can tell the host work of the
device path (everything else) from the array work a GPU would do.
"""
from __future__ import annotations

import functools
import sys
import threading
import time
import types
import weakref
from typing import Any

import numpy as np
import scipy.fft

MIXING = "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy array explicitly."


class DeviceClock:
    """Wall time (``seconds``) and count (``calls``) of stand-in device operations, outermost only."""

    seconds = 0.0
    calls = 0
    _depth = 0

    @classmethod
    def reset(cls) -> None:
        cls.seconds, cls.calls = 0.0, 0


def _timed(func):
    @functools.wraps(func)
    def inner(*args, **kwargs):
        if DeviceClock._depth:
            return func(*args, **kwargs)
        DeviceClock._depth += 1
        start = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            DeviceClock.seconds += time.perf_counter() - start
            DeviceClock.calls += 1
            DeviceClock._depth -= 1

    return inner


_CURRENT = threading.local()


def current_device() -> int:
    """The calling thread's current device: 0 in a new thread, as with the CUDA runtime."""
    return getattr(_CURRENT, "id", 0)


def _unwrap(value: Any, where: str) -> Any:
    """The numpy array inside a DeviceArray; scalars pass; a host ndarray is refused, as cupy refuses it,
    and so is an array of another device than the thread's current one (cupy's kernels raise ValueError)."""
    if isinstance(value, DeviceArray):
        if value.device != current_device():
            raise ValueError(f"{where}: array device = {value.device} while current = {current_device()} "
                             "(make the array's device current where the work runs)")
        return value._a
    if isinstance(value, np.ndarray):
        raise TypeError(f"{where}: a numpy.ndarray {value.shape} met a device array (host/device mixing; "
                        "move it with cupy.asarray first)")
    if isinstance(value, (tuple, list)):
        return type(value)(_unwrap(v, where) for v in value)
    return value


def _wrap(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return DeviceArray(value)
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    return value


class DeviceMemory:
    """Bytes held by live stand-in arrays that own their memory (views count nothing), and the peak
    since the last ``reset``: what a batch really keeps alive at once, measured, for the batch plan."""

    live = 0
    peak = 0
    _owners: dict[int, int] = {}
    _lock = threading.Lock()

    @classmethod
    def reset(cls) -> None:
        with cls._lock:
            cls.peak = cls.live

    @classmethod
    def track(cls, a: np.ndarray) -> None:
        if a.base is not None or id(a) in cls._owners:
            return
        with cls._lock:
            cls._owners[id(a)] = a.nbytes
            cls.live += a.nbytes
            cls.peak = max(cls.peak, cls.live)
        weakref.finalize(a, cls._release, id(a))

    @classmethod
    def _release(cls, key: int) -> None:
        with cls._lock:
            cls.live -= cls._owners.pop(key, 0)


class DeviceArray(np.lib.mixins.NDArrayOperatorsMixin):
    """A "device" array: a numpy array that refuses to meet host arrays (see the module docstring)."""

    __array_priority__ = 1000

    def __init__(self, a: np.ndarray):
        self._a = a
        DeviceMemory.track(a)
        object.__setattr__(self, "device", current_device())   # where it was made, as a cupy array's .device

    # -- what cupy refuses ------------------------------------------------------------------------
    def __array__(self, *args, **kwargs):
        raise TypeError(MIXING)

    @_timed
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        where = f"numpy.{ufunc.__name__}"
        args = [_unwrap(x, where) for x in inputs]
        out = kwargs.pop("out", None)
        if out is not None:
            kwargs["out"] = tuple(_unwrap(o, where) for o in out)
        result = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(result)

    def __array_function__(self, func, types_, args, kwargs):
        raise TypeError(f"numpy.{func.__name__} was given a device array: host-only code on device data "
                        "(use the backend's array module, or bring it home with asnumpy)")

    def tolist(self):
        raise TypeError(MIXING)

    # -- cupy's explicit ways home ------------------------------------------------------------------
    @_timed
    def get(self, stream=None, order="C", out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return np.array(self._a, order=order)
        out[...] = self._a
        return out

    def item(self):
        return self._a.item()

    def __float__(self):
        return float(self._a)

    def __complex__(self):
        return complex(self._a)

    def __int__(self):
        return int(self._a)

    def __bool__(self):
        return bool(self._a)

    # -- array surface ---------------------------------------------------------------------------------
    def __len__(self):
        return len(self._a)

    def __repr__(self):
        return f"DeviceArray({self._a!r})"

    @_timed
    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key, "__getitem__")])

    @_timed
    def __setitem__(self, key, value):
        self._a[_unwrap(key, "__setitem__ index")] = _unwrap(value, "__setitem__ value")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)

        @_timed
        def method(*args, **kwargs):
            return _wrap(attr(*_unwrap(args, name), **{k: _unwrap(v, name) for k, v in kwargs.items()}))

        return method

    def __setattr__(self, name: str, value) -> None:
        if name != "_a":   # e.g. ``a.real = ...``: not needed by namsa, so refused rather than half-emulated
            raise AttributeError(f"the cupy stand-in does not set array attribute {name!r}")
        object.__setattr__(self, name, value)


def _device_function(func, name: str):
    """cupy.<name>: device arrays and scalars in, device arrays out; a numpy ndarray is refused."""
    @_timed
    def call(*args, **kwargs):
        where = f"cupy.{name}"
        return _wrap(func(*_unwrap(args, where), **{k: _unwrap(v, where) for k, v in kwargs.items()}))

    call.__name__ = name
    return call


@_timed
def asarray(a: Any, dtype: Any = None, order: Any = None) -> DeviceArray:
    """Host -> device (a copy, as a transfer is), or a device array as it is when no cast is asked."""
    if isinstance(a, DeviceArray):
        return a if dtype is None or a._a.dtype == np.dtype(dtype) else DeviceArray(a._a.astype(dtype))
    return DeviceArray(np.array(a, dtype=dtype, order=order or "K", copy=True))


def asnumpy(a: Any, stream=None, order="C", out: np.ndarray | None = None) -> np.ndarray:
    """Device -> host (a copy); host arrays pass, as with cupy.asnumpy."""
    if isinstance(a, DeviceArray):
        return a.get(out=out)
    return np.asarray(a, order=order)


def _scipy_fft_module() -> types.ModuleType:
    module = types.ModuleType("cupyx.scipy.fft")
    for name in ("fft2", "ifft2", "fftn", "ifftn", "fft", "ifft", "rfft2", "irfft2"):
        setattr(module, name, _device_function(getattr(scipy.fft, name), f"scipy.fft.{name}"))
    return module


def _numpy_fft_module() -> types.ModuleType:
    module = types.ModuleType("cupy.fft")   # numpy.fft's signatures: no overwrite_x, like cupy.fft
    for name in ("fft2", "ifft2", "fftn", "ifftn", "fft", "ifft", "fftshift", "ifftshift", "fftfreq"):
        setattr(module, name, _device_function(getattr(np.fft, name), f"fft.{name}"))
    return module


class _Device:
    """cupy.cuda.Device: a 16 GiB 'device' with ``free_bytes`` free (a test may change it). ``use()``
    makes it the calling thread's current device for good; ``with Device(i):`` for the block only;
    ``Device()`` is the current one."""

    free_bytes = 12 << 30

    def __init__(self, index: int | None = None):
        self.id = current_device() if index is None else int(index)
        self._before: list[int] = []

    def __enter__(self) -> "_Device":
        self._before.append(current_device())
        _CURRENT.id = self.id
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.id = self._before.pop()

    @property
    def mem_info(self) -> tuple[int, int]:
        return (self.free_bytes, 16 << 30)

    def use(self) -> None:
        _CURRENT.id = self.id

    def synchronize(self) -> None:
        return None


class _MemoryPool:
    def used_bytes(self) -> int:
        return 0

    def free_all_blocks(self) -> None:
        return None


_UFUNCS = ("multiply", "add", "subtract", "divide", "true_divide", "exp", "sqrt", "abs", "absolute", "conj",
           "conjugate", "cos", "sin", "arctan2", "hypot", "floor", "mod", "square", "matmul", "maximum", "minimum", "real", "imag",
           "sum", "clip", "where", "concatenate", "stack", "ascontiguousarray", "reshape", "outer", "less")
_CREATORS = ("zeros", "empty", "ones", "arange", "full", "zeros_like", "empty_like", "linspace")
_DTYPES = ("float32", "float64", "complex64", "complex128", "int32", "int64", "bool_", "dtype", "pi", "newaxis")


def modules(fft_module: types.ModuleType | None = None, device_count: int = 1) -> dict[str, types.ModuleType]:
    """sys.modules entries for the stand-in: cupy, cupy.fft, cupyx, cupyx.scipy, cupyx.scipy.fft
    (``fft_module`` replaces the last one, e.g. to simulate a broken cuFFT)."""
    cupy = types.ModuleType("cupy")
    cupy.__doc__ = "strict numpy-backed stand-in for cupy (tests/strict_cupy.py): finds host/device mixing only"
    cupy.ndarray, cupy.asarray, cupy.asnumpy = DeviceArray, asarray, asnumpy
    cupy.array = asarray
    for name in _UFUNCS:
        setattr(cupy, name, _device_function(getattr(np, name), name))
    for name in _CREATORS:
        setattr(cupy, name, _timed(lambda *a, _f=getattr(np, name), **k: DeviceArray(_f(*_unwrap(a, "create"), **k))))
    for name in _DTYPES:
        setattr(cupy, name, getattr(np, name))
    cupy.get_array_module = lambda *arrays: cupy if any(isinstance(a, DeviceArray) for a in arrays) else np
    cupy.get_default_memory_pool = cupy.get_default_pinned_memory_pool = _MemoryPool
    cupy.fft = _numpy_fft_module()
    runtime = types.SimpleNamespace(getDeviceCount=lambda: device_count)
    cupy.cuda = types.SimpleNamespace(runtime=runtime, Device=_Device,
                                      alloc_pinned_memory=lambda nbytes: bytearray(nbytes))
    cupyx, cupyx_scipy = types.ModuleType("cupyx"), types.ModuleType("cupyx.scipy")
    cupyx.empty_pinned = lambda shape, dtype=np.float64, order="C": np.empty(shape, dtype=dtype, order=order)
    cupyx.zeros_pinned = lambda shape, dtype=np.float64, order="C": np.zeros(shape, dtype=dtype, order=order)
    fft = fft_module if fft_module is not None else _scipy_fft_module()
    cupyx.scipy, cupyx_scipy.fft = cupyx_scipy, fft
    return {"cupy": cupy, "cupy.fft": cupy.fft, "cupyx": cupyx, "cupyx.scipy": cupyx_scipy, "cupyx.scipy.fft": fft}


def install(monkeypatch, fft_module: types.ModuleType | None = None, device_count: int = 1) -> types.ModuleType:
    """Put the stand-in in sys.modules for one test (undone by ``monkeypatch``); returns 'cupy'."""
    entries = modules(fft_module, device_count)
    for name, module in entries.items():
        monkeypatch.setitem(sys.modules, name, module)
    return entries["cupy"]
