"""What a reconstructor expects: the physics and sampling it was trained on, from its card, the
tolerances the scan fit (fit.py) holds a file to, and the table of them that docs/experimental-data.md
prints (`ranges_table`: the docs state no range the code does not enforce)."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from namsa.sampling import ScanSampling, accepted
from stage.microscope.errors import ExperimentalInputError

from ..card import ModelCard
from .trained_ranges import TrainedRanges, trained_ranges

#: relative mismatch of beam energy / convergence angle the model still accepts
PHYSICS_RTOL = 0.01
#: the same for a semi-angle measured from the disc (source "from the data (fit)"): its precision,
#: stage.microscope.checks.RADIUS_RTOL (a thresholded disc on a coarse detector, ~5-10%)
FITTED_RTOL = 0.15


def physics_rtol(source: str) -> float:
    """The tolerance of a beam energy or semi-angle from ``source`` (a calibration's source text)."""
    return FITTED_RTOL if "(fit)" in source else PHYSICS_RTOL


@dataclass(frozen=True)
class ModelExpectation(ScanSampling):
    """The physics and sampling a reconstructor was trained on: the `namsa.sampling.ScanSampling` of its
    training config (its fields: beam energy, semi-angle, scan and pattern sizes, the spans of the detector
    pixel ``dk_inv_A`` (1/Angstrom) and scan step ``step_A`` (Angstrom)), and where it was read
    (``source``). A file inside the accepted ranges (`dk_range_inv_A`, `step_range_A`:
    namsa.sampling.accepted) is used as is, else it is resampled.
    """

    source: str

    @classmethod
    def of(cls, sampling: ScanSampling, source: str) -> "ModelExpectation":
        """``sampling`` as read from ``source``."""
        return cls(**{f.name: getattr(sampling, f.name) for f in fields(ScanSampling)}, source=source)

    @property
    def dk_range_inv_A(self) -> tuple[float, float]:
        """Detector pixels (1/Angstrom) used without resampling."""
        return accepted(self.dk_inv_A)

    @property
    def step_range_A(self) -> tuple[float, float]:
        """Scan steps (Angstrom) used without resampling."""
        return accepted(self.step_A)


def model_expectation(card: ModelCard) -> ModelExpectation:
    """The physics a reconstructor was trained on, from its card's ``expects_input``: its training
    simulation config, whose sampling is `namsa.sampling.config_sampling` of it (the card computes it
    once, `ExpectsInput.sampling`), with the probe steps of `TrainedRanges.scan_step_A`. `namsa train` writes it when the stores were simulated with the
    config it was given, `namsa publish` always; a card without it is refused in one line."""
    if card.expects_input is None:
        raise ExperimentalInputError("the model's card does not say what input it expects (no expects_input): train it "
                                     "with the config that simulated its data (namsa train CONFIG --data DIR), or "
                                     "publish its run with namsa publish RUN NAME --out DIR")
    steps = trained_ranges(card).scan_step_A   # what the training split held, where the trainer measured it
    sampling = replace(card.expects_input.sampling, step_A=steps.span())
    return ModelExpectation.of(sampling, "model card expects_input")


def ranges_table(card: ModelCard, name: str) -> str:
    """The Markdown table of what the model ``name`` (its ``card``) takes from a microscope file, as
    the scan fit enforces it (models.scan_fit.fit, the dose check of card_checks): what it was trained
    on, what is used as it is, and what happens otherwise. Units: kV, mrad, Angstrom, 1/Angstrom."""
    from namsa.constants import mrad_per_inv_A

    e, trained = model_expectation(card), trained_ranges(card)
    (s0, s1), (a0, a1) = e.step_A, e.step_range_A
    (d0, d1), (b0, b1) = e.dk_inv_A, e.dk_range_inv_A
    mrad = mrad_per_inv_A(e.energy_kv)
    sy, sx = e.scan_shape
    p = e.pattern_px
    reach = min(p // 2, p - 1 - p // 2) + 0.5
    dose = trained.dose_e_per_A2
    rows = [
        ("beam energy (kV)", f"{e.energy_kv:g}", _around(e.energy_kv, PHYSICS_RTOL), "refused (no resampling changes "
         "the physics of the patterns: use a model trained for them)"),
        ("convergence semi-angle (mrad)", f"{e.semiangle_mrad:g}",
         f"{_around(e.semiangle_mrad, PHYSICS_RTOL)}; {_around(e.semiangle_mrad, FITTED_RTOL)} when measured from "
         "the disc", "refused"),
        ("scan step (Angstrom)", f"{s0:.4g}-{s1:.4g} ({trained.scan_step_A.source})", f"{a0:.4g}-{a1:.4g}", f"finer: every m-th position (m x step "
         f"inside the range), else interpolated to {s0:.4g}; coarser: refused"),
        ("detector pixel (1/Angstrom)", f"{d0:.4g}-{d1:.4g} ({d0 * mrad:.3g}-{d1 * mrad:.3g} mrad)",
         f"{b0:.4g}-{b1:.4g}", f"finer: rebinned to the smallest whole multiple inside the range, else {d0:.4g}; "
         "coarser: refused"),
        ("scan positions (y x x)", f"{sy} x {sx}", f"at least {sy} x {sx} after the scan step is fitted",
         f"larger: overlapping {sy} x {sx} tiles; fewer: refused"),
        ("detector (pixels)", f"{p} x {p}, k = 0 at pixel {p // 2}", f"reaching {reach:g} of the model's pixels "
         "from k = 0 on every side", "larger: cropped around k = 0 (after the rebin); shorter: refused"),
        ("dose (e/Angstrom^2)", "noise-free only" if dose is None else f"{dose.low:g}-{dose.high:g}",
         "any", "below the trained doses: warned (`dose`)"),
        *_physics_rows(trained),
    ]
    head = f"| `{name}` | trained on | used as it is | otherwise |\n|---|---|---|---|\n"
    return head + "".join(f"| {a} | {b} | {c} | {d} |\n" for a, b, c, d in rows)


def _physics_rows(trained: TrainedRanges) -> list[tuple[str, str, str, str]]:
    """The table's rows of the specimen and focus (`TrainedRanges`), as the input checks judge them:
    read from the data, used as they are, warned about outside."""
    from stage.scan_statistics import DEFOCUS_TOL_A, DEFOCUS_TOL_REL

    from .thickness import FLAG_ABOVE, OWN_FLAG_ABOVE, WARNING_CODE

    rows = []
    if trained.defocus_A is not None:
        f = trained.defocus_A
        rows.append(("focus (Angstrom, relative to the specimen's middle, + = overfocus)",
                     f"{f.low:g} to {f.high:g} ({f.source})",
                     f"any: read from the bright-field parallax, within {DEFOCUS_TOL_A:g} A + "
                     f"{100 * DEFOCUS_TOL_REL:g}% of the range's nearer end", "warned (`defocus`)"))
    if trained.thickness_A is not None:
        t = trained.thickness_A
        rows.append(("specimen thickness (Angstrom)", f"{t.low:g} to {t.high:g} ({t.source})",
                     f"any: estimated from the PACBED's diffuse tail (`namsa reconstruct`), up to "
                     f"{t.high * (1 + FLAG_ABOVE):.0f}; against the specimen's own series with `--specimen`, up to "
                     f"{t.high * (1 + OWN_FLAG_ABOVE):.0f}", f"thicker: warned (`{WARNING_CODE}`)"))
    return rows


def _around(value: float, rtol: float) -> str:
    return f"{value * (1 - rtol):.4g}-{value * (1 + rtol):.4g} ({100 * rtol:g}%)"
