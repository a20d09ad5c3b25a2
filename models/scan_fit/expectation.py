"""What a reconstructor expects: the physics and sampling it was trained on, from its card or stores,
the tolerances the scan fit (fit.py) holds a file to, and the table of them that
docs/experimental-data.md prints (`ranges_table`: the docs state no range the code does not enforce)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from namsa.errors import UserError
from namsa.optics import scan_step_A
from namsa.sampling import accepted
from stage.microscope.errors import ExperimentalInputError

from ..card import ModelCard

#: relative mismatch of beam energy / convergence angle the model still accepts
PHYSICS_RTOL = 0.01
#: the same for a semi-angle measured from the disc (source "from the data (fit)"): its precision,
#: stage.microscope.checks.RADIUS_RTOL (a thresholded disc on a coarse detector, ~5-10%)
FITTED_RTOL = 0.15


def physics_rtol(source: str) -> float:
    """The tolerance of a beam energy or semi-angle from ``source`` (a calibration's source text)."""
    return FITTED_RTOL if "(fit)" in source else PHYSICS_RTOL


@dataclass
class ModelExpectation:
    """The physics and sampling a reconstructor was trained on.

    ``dk_inv_A`` / ``step_A``: the (smallest, largest) detector pixel (1/Angstrom) and scan step
    (Angstrom) its training data spanned; a file inside their accepted ranges (`dk_range_inv_A`,
    `step_range_A`: namsa.sampling.accepted) is used as is, else it is resampled.
    """

    energy_kv: float
    semiangle_mrad: float
    scan_shape: tuple[int, int]
    pattern_px: int
    target_px: int
    dk_inv_A: tuple[float, float]
    step_A: tuple[float, float]
    source: str

    @property
    def dk_range_inv_A(self) -> tuple[float, float]:
        """Detector pixels (1/Angstrom) used without resampling."""
        return accepted(self.dk_inv_A)

    @property
    def step_range_A(self) -> tuple[float, float]:
        """Scan steps (Angstrom) used without resampling."""
        return accepted(self.step_A)


def model_expectation(card: ModelCard) -> ModelExpectation:
    """The physics a reconstructor was trained on, from its card.

    A published model (``pretrained:<name>``) states its simulation config in ``expects_input``; its
    sampling is `namsa.sampling.config_sampling` of it (the card computes it once, `ExpectsInput.sampling`).
    A model fresh from `namsa train` has no such section: the spans are read from the samples of its
    training stores instead.
    """
    if card.expects_input is not None:
        s = card.expects_input.sampling
        return ModelExpectation(energy_kv=s.energy_kv, semiangle_mrad=s.semiangle_mrad, scan_shape=s.scan_shape,
                                pattern_px=s.pattern_px, target_px=s.target_px, dk_inv_A=s.dk_inv_A, step_A=s.step_A,
                                source="model card expects_input")
    if card.data is not None and card.data.dirs:
        return _from_stores(card.data.dirs)
    raise ExperimentalInputError("the model's card says neither what input it expects (expects_input) nor where its "
                                 "training data is; publish it with namsa publish RUN NAME --out DIR")


def _from_stores(dirs: Sequence[str], limit: int = 64) -> ModelExpectation:
    """Spans of the training samples' sampling (the first ``limit`` samples of the first store), as
    their meta records it (namsa.sampling: pattern_dk_inv_A, and the step of fov_A over scan_shape)."""
    import stage

    try:
        with stage.open_store(dirs[0]) as store:
            samples = [store[i] for i in range(min(limit, len(store)))]
    except UserError as exc:
        raise ExperimentalInputError(f"the model's card names no expects_input and its training data cannot be read "
                                     f"({exc}); publish it with namsa publish RUN NAME --out DIR") from None
    first = samples[0]
    dks = [float(s.meta["pattern_dk_inv_A"]) for s in samples]
    steps = [step for s in samples for step in scan_step_A(s.meta["fov_A"], s.meta["scan_shape"])]
    sy, sx = (int(v) for v in first.meta["scan_shape"])
    return ModelExpectation(energy_kv=float(first.meta["energy_kv"]),
                            semiangle_mrad=float(first.meta["semiangle_mrad"]), scan_shape=(sy, sx),
                            pattern_px=int(first.cbed.shape[-1]), target_px=int(first.potential.shape[0]),
                            dk_inv_A=(min(dks), max(dks)), step_A=(min(steps), max(steps)),
                            source=f"training store {dirs[0]}")


def ranges_table(card: ModelCard, name: str) -> str:
    """The Markdown table of what the model ``name`` (its ``card``) takes from a microscope file, as
    the scan fit enforces it (models.scan_fit.fit, the dose check of card_checks): what it was trained
    on, what is used as it is, and what happens otherwise. Units: kV, mrad, Angstrom, 1/Angstrom."""
    from namsa.constants import wavelength_A

    from .card_checks import trained_dose_range

    e = model_expectation(card)
    (s0, s1), (a0, a1) = e.step_A, e.step_range_A
    (d0, d1), (b0, b1) = e.dk_inv_A, e.dk_range_inv_A
    mrad = wavelength_A(e.energy_kv) * 1e3
    sy, sx = e.scan_shape
    p = e.pattern_px
    reach = min(p // 2, p - 1 - p // 2) + 0.5
    dose = trained_dose_range(card)
    rows = [
        ("beam energy (kV)", f"{e.energy_kv:g}", _around(e.energy_kv, PHYSICS_RTOL), "refused (no resampling changes "
         "the physics of the patterns: use a model trained for them)"),
        ("convergence semi-angle (mrad)", f"{e.semiangle_mrad:g}",
         f"{_around(e.semiangle_mrad, PHYSICS_RTOL)}; {_around(e.semiangle_mrad, FITTED_RTOL)} when measured from "
         "the disc", "refused"),
        ("scan step (Angstrom)", f"{s0:.4g}-{s1:.4g}", f"{a0:.4g}-{a1:.4g}", f"finer: every m-th position (m x step "
         f"inside the range), else interpolated to {s0:.4g}; coarser: refused"),
        ("detector pixel (1/Angstrom)", f"{d0:.4g}-{d1:.4g} ({d0 * mrad:.3g}-{d1 * mrad:.3g} mrad)",
         f"{b0:.4g}-{b1:.4g}", f"finer: rebinned to the smallest whole multiple inside the range, else {d0:.4g}; "
         "coarser: refused"),
        ("scan positions (y x x)", f"{sy} x {sx}", f"at least {sy} x {sx} after the scan step is fitted",
         f"larger: overlapping {sy} x {sx} tiles; fewer: refused"),
        ("detector (pixels)", f"{p} x {p}, k = 0 at pixel {p // 2}", f"reaching {reach:g} of the model's pixels "
         "from k = 0 on every side", "larger: cropped around k = 0 (after the rebin); shorter: refused"),
        ("dose (e/Angstrom^2)", "noise-free only" if dose is None else f"{dose[0]:g}-{dose[1]:g}",
         "any", "below the trained doses: warned (`dose`)"),
    ]
    head = f"| `{name}` | trained on | used as it is | otherwise |\n|---|---|---|---|\n"
    return head + "".join(f"| {a} | {b} | {c} | {d} |\n" for a, b, c, d in rows)


def _around(value: float, rtol: float) -> str:
    return f"{value * (1 - rtol):.4g}-{value * (1 + rtol):.4g} ({100 * rtol:g}%)"
