"""`load_reconstructor`: a trained model for notebooks and evaluation.

    rec = models.load_reconstructor("runs/quickstart")      # run dir, model dir or checkpoint dir
    maps = rec.predict(cbed)     # (S, P, P) -> (C, T, T); (B, S, P, P) -> (B, C, T, T), numpy float32

``predict`` takes raw diffraction stacks exactly as `namsa.simulate_sample` returns them (numpy or
torch, any float dtype, axes [scan index, row = ky, col = kx]), applies the training
normalisation, runs the network on CUDA when available (else CPU) and returns each target in
physical units: potential in V*Angstrom, density in electrons/Angstrom^2, axes [target, row = y,
col = x], in the order of ``rec.targets``. Loading reads safetensors + JSON only (never pickle).
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from namsa.ptychography.refine import RefineSettings, missing_meta
from namsa.sample_meta import SampleMeta

from . import checkpoint as ckpt
from .card import CARD_FILE, ModelCard, read_card_file
from .card_training import position_metrics
from .card_writer import card_from_state
from .config import Architecture
from .errors import ModelDirError
from .fcdensenet import FCDenseNet
from .pretrained_index import PRETRAINED_DIR, pretrained_names
from .safe_files import inside
from .scan_fit.card_checks import OutsideTrainingWarning  # noqa: F401  (the category predict warns with)
from .weights_check import check_header, check_size, expected_tensors

#: ``load_reconstructor("pretrained:<name>")`` loads ``models/pretrained/<name>/`` (package data)
PRETRAINED_PREFIX = "pretrained:"


class Reconstructor:
    """A trained FC-DenseNet with its normaliser; see the module docstring."""

    def __init__(self, model: FCDenseNet, card: ModelCard, device: torch.device, batch_size: int = 8):
        from stage import Normalizer

        self.model = model.eval()
        self.card = card
        self.device = device
        self.batch_size = batch_size
        self.normalizer = Normalizer.from_dict(card.normalizer.model_dump(exclude_unset=True))
        self.targets: list[str] = list(card.targets)
        #: what the last `predict` measured of its input against the card (models.scan_fit.card_checks)
        self.last_report: dict[str, Any] = {}
        #: what the last `predict(..., refine=...)` did per stack (`namsa.ptychography.refine.RefineResult`)
        self.last_refinement: list[Any] = []
        #: how many turns of the square group the last `predict` averaged (1: the single pass)
        self.last_turns = 1
        self._warned: set[str] = set()  # each kind of finding is warned once per reconstructor

    @property
    def targets_version(self) -> int:
        """The targets' data version the card's ``code_version`` names (`stage.manifest.targets_version`):
        1 = trained on the old hard-cutoff targets, compared with today's at the targets' resolution
        (evaluation.scoring)."""
        from stage.manifest import targets_version

        return targets_version(self.card.code_version)

    @property
    def in_channels(self) -> int:
        return self.model.arch.in_channels

    @torch.no_grad()
    def predict(self, cbed: Any, calibration: Any = None, refine: bool | RefineSettings = False,
                refine_meta: SampleMeta | Sequence[SampleMeta] | None = None,
                check_dose: bool = True, symmetry_average: bool | None = None) -> np.ndarray:
        """Targets in physical units, numpy float32: (C, T, T) for one stack, (B, C, T, T) for a batch.

        ``calibration``: a `namsa.icom.ScanCalibration` (or its dict; a sample's is ``sample.meta.calibration``)
        for every stack, a list of one per stack, or None for the training set's typical one. A model with
        physics inputs (``rec.model.arch.physics_inputs``) computes them with it; every model's input
        report reads the defocus at its probe step (without it, at both ends of the training steps).

        ``refine``: True (default `RefineSettings`) or a `RefineSettings` refines each potential map by
        ptychography started from it (`namsa.ptychography.refine`; the network's map is kept where
        that raises the data error); it needs ``refine_meta``, each stack's calibrations as a sample
        meta (a `namsa.sample_meta.SampleMeta` such as ``sample.meta``, knowing scan_shape,
        scan_positions_A, fov_A, energy_kv, semiangle_mrad, aberrations, pattern_dk_inv_A; thickness_A
        for multislice): one for every stack or a list, one per stack. What each refinement did is in
        ``rec.last_refinement`` (`RefineResult` per stack).

        ``check_dose``: False where the caller measured the dose on the data as read (`namsa reconstruct`:
        its fitted tiles are cropped and rebinned, so their counts no longer tell the dose).

        ``symmetry_average``: None (default) averages the maps of the square group's 8 turns of each stack
        wherever its grids allow (`models.symmetry_average`: 8 network passes; a model whose maps are not
        the scan's size gets one), True requires it, False is the single pass the model cards' figures
        were made with. ``rec.last_turns`` says how many were averaged."""
        x = torch.as_tensor(np.asarray(cbed) if not torch.is_tensor(cbed) else cbed)
        single = x.ndim == 3
        if single:
            x = x.unsqueeze(0)
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ReconstructorInputError(
                f"cbed must be (S, P, P) or (B, S, P, P) with S = {self.in_channels} patterns, got {tuple(x.shape)}; "
                f"pass the full scan of one sample (or a batch of them)")
        if not bool(torch.isfinite(x).all()):
            raise ReconstructorInputError(f"cbed holds {int((~torch.isfinite(x)).sum())} non-finite values (NaN or "
                                          f"inf); replace or mask the bad detector pixels before reconstructing")
        settings, metas = self._refine_request(refine, refine_meta, x.shape[0])
        cals = calibration if isinstance(calibration, list) else [calibration] * x.shape[0]
        self.last_report = _input_report(x, self.card, self._warned, cals[0], check_dose)
        outs = [self._predict_averaged(x[i: i + self.batch_size], cals[i: i + self.batch_size], symmetry_average)
                for i in range(0, x.shape[0], self.batch_size)]
        out = np.concatenate(outs)
        self._refuse_non_finite(out)
        self.last_refinement = []
        if settings is not None:
            from .refine import refine_potentials

            out, self.last_refinement = refine_potentials(out, x.cpu().numpy(), self.targets.index("potential"),
                                                          settings, metas)
        return out[0] if single else out

    def _refine_request(self, refine: Any, refine_meta: Any, batch: int
                        ) -> tuple[RefineSettings | None, list[SampleMeta]]:
        """(settings, one meta per stack) of a refinement request, (None, []) for none, or a one-line
        `ReconstructorInputError` saying what the request lacks."""
        if refine is False or refine is None:
            return None, []
        if not (refine is True or isinstance(refine, RefineSettings)):
            raise ReconstructorInputError(f"refine must be True, False or a namsa.ptychography.refine.RefineSettings, "
                                          f"got {type(refine).__name__}")
        if "potential" not in self.targets:
            raise ReconstructorInputError(f"refine refines the potential map, but this model predicts only "
                                          f"{', '.join(self.targets)}; use a model trained with the potential target")
        if refine_meta is None:
            raise ReconstructorInputError("refine needs each stack's calibrations: pass refine_meta= the sample's meta "
                                          "(sample.meta, or a list of them, one per stack)")
        metas = list(refine_meta) if isinstance(refine_meta, (list, tuple)) else [refine_meta] * batch
        if len(metas) != batch:
            raise ReconstructorInputError(f"refine_meta holds {len(metas)} metas for {batch} stacks; pass one meta "
                                          f"for every stack or a list of exactly {batch}")
        for i, meta in enumerate(metas):
            if not isinstance(meta, SampleMeta):
                raise ReconstructorInputError(f"refine_meta[{i}] is a {type(meta).__name__}, not a sample's meta: pass "
                                              f"sample.meta (a namsa.sample_meta.SampleMeta)")
            missing = missing_meta(meta)
            if missing:
                raise ReconstructorInputError(f"refine_meta[{i}] lacks the calibrations {', '.join(missing)}; pass the "
                                              f"sample's meta (namsa.simulate_sample writes them all)")
        return (RefineSettings() if refine is True else refine), metas

    def _refuse_non_finite(self, maps: np.ndarray) -> None:
        """Raise `ModelOutputError` when the (B, C, T, T) ``maps`` hold a non-finite value: from finite
        input that is the model's fault (damaged weights or normaliser, an overflow), never a silent NaN map."""
        bad = ~np.isfinite(maps)  # (B, C, T, T)
        if bad.any():
            worst = self.targets[int(np.argmax(bad.sum(axis=(0, 2, 3))))]
            raise ModelOutputError(f"the model produced {int(bad.sum())} non-finite values (NaN or inf) in its "
                                   f"{worst} map from finite input; its weights or normaliser are damaged: "
                                   f"re-export the model from a checkpoint or re-download it")

    def network_input(self, x: torch.Tensor, calibration: Any = None) -> torch.Tensor:
        """The normalised network input of raw stacks (B, S, P, P): with physics inputs the maps
        the loader adds (`stage.physics_inputs.batch_physics_planes`) follow the S patterns."""
        names = self.model.arch.physics_inputs
        planes = None
        if names:
            from stage.physics_inputs import batch_physics_planes

            planes = torch.from_numpy(batch_physics_planes(x.cpu().numpy(), calibration, names, self.normalizer))
        x = self.normalizer.cbed(x.to(self.device, dtype=torch.float32))
        return x if planes is None else torch.cat([x, planes.to(x)], dim=1)

    def _predict_averaged(self, x: torch.Tensor, calibration: list[Any], symmetry_average: bool | None) -> np.ndarray:
        """`_predict_batch`, averaged over the turns ``symmetry_average`` asks for (see `predict`)."""
        if symmetry_average not in (None, True, False):
            raise ReconstructorInputError(f"symmetry_average must be None, True or False, got {symmetry_average!r}")
        if symmetry_average is False:
            self.last_turns = 1
            return self._predict_batch(x, calibration)
        from .symmetry_average import SymmetryAverageError, averaged_over_turns, transposed_calibration

        swapped = [transposed_calibration(c) for c in calibration]

        def one_pass(stacks: np.ndarray, transposed: bool) -> np.ndarray:
            return self._predict_batch(torch.from_numpy(stacks), swapped if transposed else calibration)

        try:
            out, self.last_turns = averaged_over_turns(one_pass, x.cpu().numpy(), required=symmetry_average is True)
        except SymmetryAverageError as exc:
            raise ReconstructorInputError(str(exc)) from None
        return out

    def _predict_batch(self, x: torch.Tensor, calibration: list[Any]) -> np.ndarray:
        y = self.model(self.network_input(x, calibration)).float()
        maps = [self.normalizer.target_inverse(y[:, c], name) for c, name in enumerate(self.targets)]
        return torch.stack(maps, dim=1).cpu().numpy().astype(np.float32, copy=False)


def _input_report(x: torch.Tensor, card: ModelCard, warned: set[str], calibration: Any = None,
                  check_dose: bool = True) -> dict[str, Any]:
    """Cheap checks of the first stack of ``x`` against the card (`models.scan_fit.card_checks.input_report`:
    dose, total intensity, disc radius, and defocus and scattering against the training distribution,
    the defocus read at ``calibration``'s probe step when given); each kind of finding not in ``warned``
    yet is warned as an `OutsideTrainingWarning`, one line each, so scoring thousands of noisy stacks
    says it once."""
    from .scan_fit.card_checks import input_report, warn_report

    report = input_report(x[0].detach().float().cpu().numpy(), card, calibration, check_dose)
    new = [w for w in report["warnings"] if w["code"] not in warned]
    warned.update(w["code"] for w in new)
    warn_report({"warnings": new}, stacklevel=4)  # _input_report <- predict <- torch.no_grad <- the caller
    return report


class ReconstructorInputError(ckpt.CheckpointError, ModelDirError):
    """Bad input to `load_reconstructor` or `Reconstructor.predict`."""


class ModelOutputError(ModelDirError):
    """A model whose maps hold non-finite values from finite input (`Reconstructor.predict`)."""


def _resolve(path: Path) -> tuple[Path, ModelCard]:
    """(directory holding model.safetensors, validated card) for a model dir, run dir or checkpoint
    dir; the card is checked against its schema (`models.card`) before anything else is read."""
    # lexists, not is_file: a card or state that is a link or a FIFO is refused by name below, unopened
    if os.path.lexists(path / "model" / CARD_FILE):
        path = inside(path, "model", "the run's model folder")
    if os.path.lexists(path / CARD_FILE):
        ckpt.refuse_pickles(path)
        card = read_card_file(inside(path, CARD_FILE, "the model card"))
        info = card.files[ckpt.MODEL_FILE]
        weights = inside(path, ckpt.MODEL_FILE, "the weights file")
        if not weights.is_file() or weights.stat().st_size != info.bytes:
            raise ckpt.CorruptCheckpointError(f"model {path}: {ckpt.MODEL_FILE} is missing or not the {info.bytes} "
                                              f"bytes {CARD_FILE} records; re-export it from a checkpoint")
        return path, card
    if os.path.lexists(path / ckpt.STATE_FILE):
        state = ckpt.verify_checkpoint(path)
        card = card_from_state(state, f"checkpoint {path / ckpt.STATE_FILE}", source="checkpoint",
                               step=state.get("step"), **_position_metrics(state.get("position")))
        return path, card
    raise ReconstructorInputError(f"{path} is neither a model dir ({CARD_FILE}), a run dir (model/) nor a checkpoint "
                                  f"dir ({ckpt.STATE_FILE}); pass the --out of `namsa train` or one of its folders")


def _position_metrics(position: Any) -> dict[str, Any]:
    """A checkpoint card's ``metrics``: the losses of the checkpoint's training position, when its
    state holds one (`models.card_training.position_metrics`)."""
    return {"metrics": position_metrics(position)} if isinstance(position, dict) else {}


def _check_weights(folder: Path, card: ModelCard) -> Architecture:
    """The card's architecture, once its size is sane and the weights file's header, size and
    digest match it (nothing is allocated before this returns)."""
    arch = card.architecture.architecture()
    weights = folder / ckpt.MODEL_FILE
    check_size(arch, f"the card in {folder}")
    check_header(weights, expected_tensors(arch))
    verified = card.source == "checkpoint"  # verify_checkpoint has checked its digest already
    if not verified and ckpt.file_digest(weights) != card.files[ckpt.MODEL_FILE].xxh3_128:
        raise ckpt.CorruptCheckpointError(f"model {folder}: {ckpt.MODEL_FILE} does not match the digest its card "
                                          f"records; re-export it from a checkpoint")
    return arch


def _pretrained_path(name: str) -> Path:
    if name not in pretrained_names():
        raise ReconstructorInputError(f"no pretrained reconstructor {name!r}; shipped: "
                                      f"{', '.join(pretrained_names()) or 'none'} (models.pretrained_names())")
    return Path(str(resources.files("models") / PRETRAINED_DIR / name))


def pretrained_card(name: str) -> ModelCard:
    """The model card of the shipped reconstructor ``name`` (what it expects, what it was trained on,
    its held-out scores), without loading its weights."""
    return read_card_file(_pretrained_path(name) / CARD_FILE)


def load_reconstructor(path: str | Path, device: str | torch.device | None = None,
                       batch_size: int = 8) -> Reconstructor:
    """Load the reconstructor in ``path``: a model dir, a training run dir, a checkpoint dir, or
    ``"pretrained:<name>"`` for one shipped with the package (`pretrained_names`; its card says
    what it was trained on and how it scored on held-out materials).

    ``device``: None picks cuda when available, else cpu. ``batch_size``: stacks per forward pass.
    A damaged or hostile directory (card schema, paths leaving it, a network above the size limit,
    weights whose header does not match the architecture) raises `ReconstructorInputError` /
    `models.card.ModelDirError` (one line) before the network is built.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    text = str(path)
    path = _pretrained_path(text[len(PRETRAINED_PREFIX):]) if text.startswith(PRETRAINED_PREFIX) else Path(path)
    if not path.exists():
        raise ReconstructorInputError(f"model path {path} does not exist; pass the --out of `namsa train`")
    folder, card = _resolve(path)
    arch = _check_weights(folder, card)
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = FCDenseNet(arch)
    try:
        state = load_file(str(folder / ckpt.MODEL_FILE))
        model.load_state_dict(state)
    except (SafetensorError, RuntimeError, OSError, ValueError) as exc:  # changed on disk since the checks
        raise ckpt.CorruptCheckpointError(f"model {folder}: {ckpt.MODEL_FILE} cannot be loaded "
                                          f"({str(exc).splitlines()[0][:160]}); re-export it") from None
    _refuse_non_finite(folder, state)
    return Reconstructor(model.to(dev), card, dev, batch_size)


def _refuse_non_finite(folder: Path, state: dict[str, torch.Tensor]) -> None:
    """A NaN or inf weight makes every map NaN: such a file is damaged, whatever its digest says
    (a digest recorded after the damage matches it)."""
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ckpt.CorruptCheckpointError(
                f"model {folder}: {ckpt.MODEL_FILE} holds {bad} non-finite values (NaN or inf) in tensor {name!r}; "
                f"the file is damaged: re-export it from a checkpoint or re-download it")
