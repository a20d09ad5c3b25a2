"""Integrated centre-of-mass (iCoM, equivalent to iDPC) reconstruction from a 4D-STEM stack.

The classical baseline the reconstructor is compared with. For a thin, weak-phase specimen
with transmission ``exp(i sigma V_p(r))`` the centre of mass of each diffraction pattern is the
probe-intensity-weighted phase gradient,

    <k>(r_p) = (sigma / 2 pi) (|probe|^2 * grad V_p)(r_p)         (k in 1/Angstrom, cycles),

(Lazic, Bosch & Lazar, Ultramicroscopy 160, 265 (2016); Close et al., Ultramicroscopy 159, 124
(2015)), so integrating the CoM field over the scan recovers ``V_p`` blurred by the probe
intensity. Channelling in thick or heavy crystals breaks the weak-phase picture, which is where
the learned reconstructor is expected to win.

Lives in `namsa` (physics, numpy only) so that both the evaluation's iCoM baseline
(`evaluation.baselines.icom`) and the loader's physics input channels (`stage.physics_inputs`)
use the same code.

Conventions: ``cbed`` is (S, P, P) with k = 0 at index ``P // 2`` and axes ``[row = ky,
col = kx]``; the scan is row-major over ``scan_shape = (scan_y, scan_x)`` and covers a periodic
field of view, so the CoM field is integrated in Fourier space (no boundary terms).
Physics only: numpy/scipy.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from namsa.constants import interaction_constant, mrad_per_inv_A, wavelength_A
from namsa.errors import UserError

__all__ = ["icom_reconstruct", "icom_from_sample", "ScanCalibration", "k_sampling_inv_A", "center_of_mass", "integrate_gradient",
           "integrate_gradient_mirrored", "fourier_resample", "resample_map", "wavelength_A", "interaction_constant",
           "ICoMInputError"]


class ICoMInputError(UserError):
    """The stack, scan shape or sampling given to the iCoM reconstruction is inconsistent."""


def center_of_mass(cbed: np.ndarray, k_sampling: Sequence[float] | float = 1.0) -> np.ndarray:
    """Centre of mass of every pattern, (S, 2) as [ky, kx] in the units of ``k_sampling``.

    k_sampling: (dky, dkx) or one value per detector pixel; k = 0 at index P // 2.
    Each pattern is divided by its own total intensity (antialiasing and a finite detector
    lose a little, which must not bias the CoM). A pattern without positive intensity (a blanked
    or dropped frame) carries no signal: its CoM is 0 (a tile of a scan may hold only such frames).
    """
    cbed = np.asarray(cbed)
    if cbed.ndim != 3 or cbed.shape[1] != cbed.shape[2]:
        raise ICoMInputError(f"cbed must be a (S, P, P) stack, got shape {cbed.shape}")
    p = cbed.shape[1]
    dky, dkx = _two(k_sampling, "k_sampling")
    ky = (np.arange(p) - p // 2) * dky
    kx = (np.arange(p) - p // 2) * dkx
    stack = cbed.astype(np.float64, copy=False)
    total = stack.sum(axis=(1, 2))
    lit = total > 0
    safe = np.where(lit, total, 1.0)
    com_y = np.where(lit, np.einsum("syx,y->s", stack, ky) / safe, 0.0)
    com_x = np.where(lit, np.einsum("syx,x->s", stack, kx) / safe, 0.0)
    return np.stack([com_y, com_x], axis=1)


def integrate_gradient(grad_y: np.ndarray, grad_x: np.ndarray,
                       step: Sequence[float] | float = 1.0) -> np.ndarray:
    """Periodic Fourier integration: the zero-mean ``f`` whose gradient best fits (grad_y, grad_x).

    Least-squares solution on a periodic grid (Frankot & Chellappa 1988): with q in cycles per
    unit length, ``F(q) = -i (q . G(q)) / (2 pi |q|^2)``; the q = 0 term (the mean) is
    undetermined and set to 0. step: (dy, dx) grid spacing, in the length unit of the gradient.
    """
    gy = np.asarray(grad_y, dtype=np.float64)
    gx = np.asarray(grad_x, dtype=np.float64)
    if gy.shape != gx.shape or gy.ndim != 2:
        raise ICoMInputError(f"gradient components must be equal 2-D maps, got {gy.shape} and {gx.shape}")
    dy, dx = _two(step, "step")
    qy = np.fft.fftfreq(gy.shape[0], d=dy)[:, None]
    qx = np.fft.fftfreq(gy.shape[1], d=dx)[None, :]
    q2 = qy ** 2 + qx ** 2
    q2[0, 0] = 1.0  # the mean is undetermined; its numerator is zeroed below
    spectrum = -1j * (qy * np.fft.fft2(gy) + qx * np.fft.fft2(gx)) / (2.0 * np.pi * q2)
    spectrum[0, 0] = 0.0
    return np.fft.ifft2(spectrum).real


def integrate_gradient_mirrored(grad_y: np.ndarray, grad_x: np.ndarray,
                                step: Sequence[float] | float = 1.0) -> np.ndarray:
    """Integration of a gradient field over a non-periodic scan (a window inside the crystal).

    The field is extended by mirroring (``f`` even about each edge, so ``grad_y`` is odd in y and
    ``grad_x`` even), which makes it periodic without the jump a periodic wrap would add; the
    periodic solution on the doubled grid is cropped back (the Fourier analogue of a Neumann
    boundary condition).
    """
    gy = np.asarray(grad_y, dtype=np.float64)
    gx = np.asarray(grad_x, dtype=np.float64)
    ext_y = np.block([[gy, gy[:, ::-1]], [-gy[::-1, :], -gy[::-1, ::-1]]])
    ext_x = np.block([[gx, -gx[:, ::-1]], [gx[::-1, :], -gx[::-1, ::-1]]])
    full = integrate_gradient(ext_y, ext_x, step)
    out = full[: gy.shape[0], : gy.shape[1]]
    return out - out.mean()


def fourier_resample(img: np.ndarray, out_shape: Sequence[int],
                     shift_frac: Sequence[float] = (0.0, 0.0)) -> np.ndarray:
    """Band-limited (periodic sinc) interpolation of a periodic map onto a finer/other grid.

    Output pixel m along an axis sits at ``(m / M + shift_frac) * L`` where input pixel i sits at
    ``(i / N) * L`` (L: the period). Exact for maps band-limited to the input grid.
    """
    img = np.asarray(img, dtype=np.float64)
    my = _dirichlet_matrix(img.shape[0], int(out_shape[0]), float(shift_frac[0]))
    mx = _dirichlet_matrix(img.shape[1], int(out_shape[1]), float(shift_frac[1]))
    return my @ img @ mx.T


def _dirichlet_matrix(n_in: int, n_out: int, shift: float) -> np.ndarray:
    """(n_out, n_in) real interpolation matrix of the periodic trigonometric interpolant."""
    u = (np.arange(n_out)[:, None] / n_out + shift) - np.arange(n_in)[None, :] / n_in
    freqs = np.arange(-((n_in - 1) // 2), (n_in - 1) // 2 + 1)
    mat = np.cos(2.0 * np.pi * u[..., None] * freqs).sum(-1)
    if n_in % 2 == 0:
        # The Nyquist term enters as a cosine so the interpolant stays real.
        mat += np.cos(np.pi * n_in * u)
    return mat / n_in


def icom_reconstruct(cbed: np.ndarray, scan_shape: Sequence[int], *,
                     k_sampling_invA: Sequence[float] | float | None = None,
                     k_sampling_mrad: Sequence[float] | float | None = None,
                     energy_kv: float | None = None,
                     scan_step_A: Sequence[float] | float | None = None,
                     output_shape: Sequence[int] | None = None,
                     output_shift_frac: Sequence[float] = (0.0, 0.0),
                     periodic: bool = True) -> np.ndarray:
    """iCoM map (scan_y, scan_x) or ``output_shape``, [row = y, col = x].

    Units of the result:
      * V * Angstrom (a projected potential) when the detector sampling (``k_sampling_invA``,
        or ``k_sampling_mrad`` with ``energy_kv``), ``energy_kv`` and ``scan_step_A`` are known;
      * otherwise arbitrary units proportional to it (detector pixels x scan steps).
    The mean is undetermined (set to 0): compare after an offset fit.
    output_shape: resample the scan-grid map onto this grid over the same periodic field of view
    (band-limited); output_shift_frac: the output grid's origin relative to the first scan
    position, as a fraction of the field of view, per axis.
    periodic: the scan covers whole periods of the crystal (namsa's default field of view), so the
    CoM field is integrated and resampled periodically; False for a scan window inside a larger
    cell (mirror-extended integration, cubic-spline resampling).
    """
    scan_y, scan_x = (int(v) for v in scan_shape)
    cbed = np.asarray(cbed)
    if cbed.ndim != 3 or cbed.shape[0] != scan_y * scan_x:
        raise ICoMInputError(f"cbed shape {cbed.shape} does not hold scan_shape {scan_y}x{scan_x} "
                             f"= {scan_y * scan_x} patterns; pass the scan shape the stack was taken with")
    k_unit, physical = k_sampling_inv_A(k_sampling_invA, k_sampling_mrad, energy_kv)
    if not np.any(cbed.sum(axis=(1, 2), dtype=np.float64) > 0):  # one blank frame is data; a blank scan is not
        raise ICoMInputError(f"none of the {len(cbed)} cbed patterns has positive intensity; check the stack")
    com = center_of_mass(cbed, k_unit).reshape(scan_y, scan_x, 2)
    return icom_from_com(com, energy_kv=energy_kv if physical else None, scan_step_A=scan_step_A,
                         output_shape=output_shape, output_shift_frac=output_shift_frac, periodic=periodic)


def icom_from_com(com: np.ndarray, *, energy_kv: float | None, scan_step_A: Sequence[float] | float | None,
                  output_shape: Sequence[int] | None = None, output_shift_frac: Sequence[float] = (0.0, 0.0),
                  periodic: bool = True) -> np.ndarray:
    """The integration half of `icom_reconstruct`, from a (scan_y, scan_x, 2) centre-of-mass map
    in 1/Angstrom (V * Angstrom) or detector pixels (``energy_kv`` None: arbitrary units); lets a
    caller gather the CoM block by block without holding the scan's patterns."""
    step = (1.0, 1.0) if scan_step_A is None else _two(scan_step_A, "scan_step_A")
    # <k> = grad(phase) / 2 pi  ->  phase = 2 pi * integral(<k>), V = phase / sigma.
    integrate = integrate_gradient if periodic else integrate_gradient_mirrored
    phase_over_2pi = integrate(com[..., 0], com[..., 1], step)
    if energy_kv is not None and scan_step_A is not None:
        result = 2.0 * np.pi * phase_over_2pi / interaction_constant(float(energy_kv))
    else:
        result = phase_over_2pi
    if output_shape is not None:
        result = resample_map(result, output_shape, output_shift_frac, periodic)
    return result


def _spline_resample(img: np.ndarray, out_shape: Sequence[int], shift_frac: Sequence[float]) -> np.ndarray:
    """Cubic-spline resampling of a non-periodic map (edges clamped), same geometry as fourier_resample."""
    from scipy.ndimage import map_coordinates

    axes = [(np.arange(int(m)) / int(m) + float(s)) * n for m, s, n in zip(out_shape, shift_frac, img.shape)]
    yy, xx = np.meshgrid(*axes, indexing="ij")
    return map_coordinates(img, [yy, xx], order=3, mode="nearest")


@dataclass(frozen=True)
class ScanCalibration:
    """What turns a raw stack into calibrated CoM / iCoM maps on the targets' grid.

    scan_shape: (scan_y, scan_x); k_sampling_invA: detector 1/Angstrom per pixel (dky, dkx), or
    None for pixel units; energy_kv: beam energy; scan_step_A: (dy, dx) probe step; shift_frac:
    the target grid's origin relative to the first probe position, as a fraction of the field of
    view per axis; periodic: the scan covers whole periods of the specimen (namsa's default).
    """

    scan_shape: tuple[int, int]
    k_sampling_invA: tuple[float, float] | None
    energy_kv: float | None
    scan_step_A: tuple[float, float] | None
    shift_frac: tuple[float, float] = (0.0, 0.0)
    periodic: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ScanCalibration":
        def pair(v: Any) -> tuple[float, float] | None:
            return None if v is None else _two(v, "calibration value")
        try:
            return cls(scan_shape=tuple(int(v) for v in data["scan_shape"]),
                       k_sampling_invA=pair(data.get("k_sampling_invA")), energy_kv=data.get("energy_kv"),
                       scan_step_A=pair(data.get("scan_step_A")),
                       shift_frac=tuple(float(v) for v in data.get("shift_frac", (0.0, 0.0))),
                       periodic=bool(data.get("periodic", True)))
        except (KeyError, TypeError, ValueError, ICoMInputError) as exc:
            raise ICoMInputError(f"scan calibration {data!r} is malformed ({exc}); it needs scan_shape and "
                                 "optionally k_sampling_invA, energy_kv, scan_step_A, shift_frac, periodic") from None


def icom_from_sample(sample: Any, output_shape: Sequence[int] | None = None) -> np.ndarray:
    """iCoM of a ``namsa.Sample`` (V * Angstrom), on the grid of its targets unless ``output_shape``.

    Takes the calibration of ``sample.meta`` (`namsa.sample_meta.SampleMeta.calibration`: its scan,
    energy, detector sampling, without which the result is in arbitrary units, and its cell). The
    scan is treated as periodic when the field of view is the whole supercell (namsa's default), else
    as a window (mirrored integration).
    """
    if output_shape is None:
        output_shape = np.asarray(sample.potential).shape
    cal = sample.meta.calibration
    return icom_reconstruct(sample.cbed, cal.scan_shape, k_sampling_invA=cal.k_sampling_invA,
                            energy_kv=cal.energy_kv, scan_step_A=cal.scan_step_A, output_shape=output_shape,
                            output_shift_frac=cal.shift_frac, periodic=cal.periodic)


def resample_map(img: np.ndarray, output_shape: Sequence[int], shift_frac: Sequence[float],
                 periodic: bool) -> np.ndarray:
    """A scan-grid map on another grid over the same field of view (band-limited if periodic,
    cubic spline otherwise); returned as is when nothing changes."""
    if tuple(output_shape) == img.shape and not any(shift_frac):
        return img
    return fourier_resample(img, output_shape, shift_frac) if periodic else _spline_resample(img, output_shape, shift_frac)


def k_sampling_inv_A(inv_a: Sequence[float] | float | None, mrad: Sequence[float] | float | None,
                     energy_kv: float | None) -> tuple[tuple[float, float], bool]:
    """Detector sampling (dky, dkx) in 1/Angstrom per pixel, from 1/Angstrom or mrad (with the energy,
    kV), and whether it is physical (else 1 px)."""
    if inv_a is not None:
        return _two(inv_a, "k_sampling_invA"), energy_kv is not None
    if mrad is not None:
        if energy_kv is None:
            raise ICoMInputError("k_sampling_mrad needs energy_kv (kV) to convert angles to 1/Angstrom")
        per_inv_A = mrad_per_inv_A(energy_kv)
        dky, dkx = _two(mrad, "k_sampling_mrad")
        return (dky / per_inv_A, dkx / per_inv_A), True
    return (1.0, 1.0), False


def _two(value: Sequence[float] | float, name: str) -> tuple[float, float]:
    arr = np.atleast_1d(np.asarray(value, dtype=np.float64)).ravel()
    if arr.size == 1:
        arr = np.repeat(arr, 2)
    if arr.size != 2 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ICoMInputError(f"{name} must be one positive value or [dy, dx], got {value!r}")
    return float(arr[0]), float(arr[1])
