"""Batched multislice: Fresnel propagation of many probe positions through precomputed slices.

The batch of probe positions is the leading array axis. Per slice: psi *= t_s (real space),
Psi = FFT(psi), Psi *= P_s (Fresnel propagator with the band limit), psi = IFFT(Psi): two FFTs
per slice per probe, no other copies. The last slice skips the inverse FFT: the exit wave's
far field is |Psi|^2 / (ny nx), with k = 0 shifted to index N // 2 by the caller's reducer.
On CPU the batch is split across worker threads (FFTs and numpy multiplies release the GIL), so
the elementwise work is parallel too; the transmission functions are shared read-only.
"""
from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from .backend import Backend
from .errors import MemoryShortage
from .optics import plane_wave_rows, shift_phases, spatial_frequencies
from .sample_memory import bytes_per_probe


class MemoryBudgetError(MemoryShortage):
    """The simulation cannot fit the configured memory budget (or this machine, workflow.memory)."""


def fresnel_propagator(gpts: tuple[int, int], sampling: tuple[float, float], dz_A: float, wavelength_A: float,
                       mask: np.ndarray, tilt_mrad: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """P(k) = exp(-i pi lambda dz k^2 + 2 pi i dz (ky tan ty + kx tan tx)) * mask, (ny, nx) complex64.

    ``tilt_mrad`` = (ty, tx) tilts the specimen (Kirkland 2010, eq. 6.99); FFT order.
    """
    ky, kx = spatial_frequencies(gpts, sampling)
    ty, tx = (math.tan(t * 1e-3) for t in tilt_mrad)
    phase_y = np.exp(-1j * np.pi * wavelength_A * dz_A * ky ** 2 + 2j * np.pi * dz_A * ky * ty)
    phase_x = np.exp(-1j * np.pi * wavelength_A * dz_A * kx ** 2 + 2j * np.pi * dz_A * kx * tx)
    return (phase_y[:, None] * phase_x[None, :] * mask).astype(np.complex64)


#: per-thread wave buffer the CPU path aims to keep in cache: with 2 threads and a shared L3,
#: batches of 4 probes at 256^2 (2 MiB) ran 1.5x faster here than batches of 64, whose four
#: passes per slice all go to DRAM
CPU_CACHE_BYTES = 2 << 20


def cpu_batch_cap(gpts: tuple[int, int]) -> int:
    """Largest CPU batch whose complex64 waves fit ``CPU_CACHE_BYTES`` (at least 1)."""
    return max(1, CPU_CACHE_BYTES // (8 * gpts[0] * gpts[1]))


def plan_batch(n_positions: int, gpts: tuple[int, int], n_slices: int, budget_bytes: float,
               fixed_bytes: float = 0.0, max_batch: int = 64) -> int:
    """Largest batch of probes that fits the budget next to the shared arrays; `MemoryBudgetError` if none does.

    Shared: transmission functions (n_slices complex64 grids) + propagators + ``fixed_bytes``; per
    probe: `namsa.sample_memory.bytes_per_probe` (the multislice path's figure).
    """
    n = gpts[0] * gpts[1]
    shared = n_slices * n * 8 + 4 * n * 8 + fixed_bytes
    free = budget_bytes - shared
    per = bytes_per_probe(gpts)
    if free < per:
        need = (shared + per) / 1e9
        raise MemoryBudgetError(
            f"cell too large for memory: {n_slices} slices of {gpts[0]}x{gpts[1]} pixels need {need:.2f} GB but "
            f"memory_budget_gb={budget_bytes / 1e9:.2f}; raise memory_budget_gb, or reduce thickness_A, "
            f"cell_lateral_A or the grid (larger sampling_A)")
    return int(max(1, min(n_positions, max_batch, free // per)))


def balanced_batch(n_positions: int, max_batch: int, threads: int) -> int:
    """Batch size <= max_batch giving a number of batches that splits evenly over the threads."""
    n_batches = math.ceil(n_positions / max_batch)
    n_batches = math.ceil(n_batches / threads) * threads if n_positions >= threads else n_batches
    return max(1, math.ceil(n_positions / n_batches))


def shift_phases_on(backend: Backend, positions_A: np.ndarray, gpts: tuple[int, int],
                     sampling: tuple[float, float]) -> tuple[Any, Any]:
    """The probes' (B, ny) and (B, nx) phase ramps on the backend: made on a GPU itself (a batch's
    ramps cost the host ~25 ms at 1024 probes of 200^2), on the host as always on CPU."""
    if not backend.on_device:
        return shift_phases(positions_A, gpts, sampling)
    return (plane_wave_rows(positions_A[:, 0] / (gpts[0] * sampling[0]), gpts[0], backend),
            plane_wave_rows(positions_A[:, 1] / (gpts[1] * sampling[1]), gpts[1], backend))


def run_multislice(probe_k: np.ndarray, positions_A: np.ndarray, sampling: tuple[float, float],
                   transmissions: Any, propagators: list[Any], final_mask: Any, backend: Backend,
                   batch_size: int, reducer: Callable[[Any], Any],
                   threads: int = 1, device_reducer: bool = False, out: np.ndarray | None = None) -> list[np.ndarray]:
    """Exit-wave intensities for every position, passed batch by batch through ``reducer``.

    probe_k: (ny, nx) complex probe at the origin (FFT order, sum |Psi|^2 = ny nx).
    positions_A: (n, 2) probe positions [y, x] (Angstrom). transmissions: (n_slices, ny, nx) on the
    backend; propagators: per slice (the last one is not used; ``final_mask`` band-limits the exit).
    reducer: maps (b, ny, nx) float32 intensities (FFT order) to what is kept per batch: a numpy
    array, or with ``device_reducer`` an array on the backend (the reduction then runs on the device
    and only its result is copied home). Returns the list of reducer outputs (numpy) in position order:
    views of ``out`` when given (the batches are written straight into it, no concatenation).
    """
    gpts = probe_k.shape
    xp = backend.xp
    n_pixels = gpts[0] * gpts[1]
    # unnormalised FFTs: backward(forward(a)) = N a, so 1/N rides on the probe and the propagators
    probe_dev = backend.asarray((probe_k / n_pixels).astype(np.complex64))
    scaled: dict[int, Any] = {}
    for p in propagators:
        scaled.setdefault(id(p), p * np.float32(1.0 / n_pixels))
    props = [scaled[id(p)] for p in propagators]
    n_slices = transmissions.shape[0]
    inv_n = np.float32(1.0 / n_pixels)
    local = threading.local()

    def one_batch(start: int) -> np.ndarray:
        pos = positions_A[start:start + batch_size]
        used = len(pos)
        if used < batch_size:   # pad the last batch: the planned transforms have a fixed shape
            pos = np.concatenate([pos, np.repeat(pos[-1:], batch_size - used, axis=0)])
        if not hasattr(local, "ws"):
            local.ws = backend.workspace((batch_size, *gpts))
        ws = local.ws
        phase_y, phase_x = shift_phases_on(backend, pos, gpts, sampling)
        psi = ws.buffer
        xp.multiply(probe_dev[None], phase_y[:, :, None], out=psi)
        xp.multiply(psi, phase_x[:, None, :], out=psi)
        psi = ws.backward(psi)
        for s in range(n_slices):
            xp.multiply(psi, transmissions[s], out=psi)
            psi = ws.forward(psi)
            if s == n_slices - 1:
                break
            xp.multiply(psi, props[s], out=psi)
            psi = ws.backward(psi)
        exit_k = psi[:used] * final_mask
        intensity = exit_k.real ** 2
        intensity += exit_k.imag ** 2
        intensity *= inv_n
        return backend.reduce(intensity, reducer, device_reducer, None if out is None else out[start:start + used])

    starts = range(0, len(positions_A), batch_size)
    if threads <= 1 or backend.xp is not np or len(starts) == 1:
        return [one_batch(s) for s in starts]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one_batch, starts))
