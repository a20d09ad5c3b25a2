"""What `namsa publish` reads from a finished run directory (`workflow.pretrained`), read safely and typed.

A run directory may come from someone else. Before any file in it is opened, every part is checked
for symbolic links (`RunPaths.check_parts`, the check `namsa run` makes: a linked ``model/`` would
ship another model's weights under this run's figures, a linked ``metrics.json`` publish another
run's figures); each file is then opened without following a link (`models.safe_files.open_regular`)
and read with a size cap, YAML through the bounded loader (`workflow.safe_yaml.load_yaml`: alias
bombs, deep nesting) and JSON through the bounded parser (`models.safe_files.parse_json_bytes`). What
publish uses of them is validated into small typed records (`RunConfig`, `HeldOutMetrics`), so a
wrong shape is one line naming the file and the field, never a traceback.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evaluation.methods import NETWORK
from evaluation.views import LEGACY
from models import checkpoint as ckpt
from models.card import CARD_FILE, FileInfo, TargetName, first_validation_problem
from models.card_provenance import Aggregates, EvaluatedData, Headline
from models.safe_files import open_regular, parse_json_bytes
from namsa.config import MACHINE_FIELDS, SimulationConfig
from namsa.errors import UserError
from stage import DataConfig

from .config import format_validation_error
from .run_paths import RunPaths
from .safe_yaml import MAX_CONFIG_BYTES, YamlRefused, load_yaml

MODEL_DIR = Path("model")
METRICS_FILE = Path("eval") / "metrics.json"
CONFIG_FILE = Path("config.resolved.yaml")
#: a study's metrics.json is a few MB (about 3 kB per held-out sample); beyond this it is not one
MAX_METRICS_BYTES = 64 << 20
_METRICS_KIND = "the metrics.json `namsa evaluate` writes"

# metrics.json holds many sections publish does not read: those are ignored, what it reads is strict
_READ = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
Name = Annotated[str, Field(min_length=1, max_length=256)]


class PublishInputError(UserError):
    """A finished run directory whose files `namsa publish` cannot use as they are."""


class NetworkScore(BaseModel):
    """The network's per-sample score in one view (what the card's check samples record)."""

    model_config = _READ
    rel_l2: Annotated[float, Field(ge=0)]


class NetworkViews(BaseModel):
    model_config = _READ
    legacy: NetworkScore = Field(alias=LEGACY)


class TargetScores(BaseModel):
    model_config = _READ
    network: NetworkViews = Field(alias=NETWORK)


class HeldOutSample(BaseModel):
    """One entry of metrics.json's ``samples``: what `workflow.pretrained.check_samples` picks by."""

    model_config = _READ
    sample_id: Name
    element_class: Annotated[str, Field(min_length=1, max_length=128)]
    thickness_A: Annotated[float, Field(gt=0, le=1e6)]
    metrics: Annotated[dict[TargetName, TargetScores], Field(min_length=1)]


class EvaluationSettings(BaseModel):
    """metrics.json's ``config``: the evaluation's split and whether maps were symmetry-averaged."""

    model_config = _READ
    split: Annotated[str, Field(min_length=1, max_length=16)]
    symmetry_average: bool = False   # evaluations from before it existed scored the single pass


class EvaluatedWeights(BaseModel):
    """metrics.json's ``model_card``, the one field read of it: the digest of the weights evaluated."""

    model_config = _READ
    files: dict[Name, FileInfo]


class HeldOutMetrics(BaseModel):
    """What publish copies into the card's ``held_out_evaluation`` and ``trained_on.data``, read as the
    card's own records (`models.card_provenance`), and which weights were evaluated (``model_card``)."""

    model_config = _READ
    config: EvaluationSettings
    model_card: EvaluatedWeights | None = None
    data: EvaluatedData
    headline: Annotated[Headline, Field(min_length=1)]
    aggregates: Annotated[Aggregates, Field(min_length=1)]
    samples: Annotated[list[HeldOutSample], Field(min_length=1)]


class RunConfig(BaseModel):
    """The sections of config.resolved.yaml publish reads, validated as `namsa run` validates them;
    ``simulation`` without the machine's fields (`MACHINE_FIELDS`: a GPU node's device and memory)."""

    model_config = ConfigDict(extra="ignore")
    name: Name
    simulation: SimulationConfig
    data: DataConfig


@dataclass(frozen=True)
class RunInputs:
    """A finished run directory, checked: its model folder, resolved config and held-out metrics."""

    root: Path
    config: RunConfig
    metrics: HeldOutMetrics

    @property
    def model_dir(self) -> Path:
        return self.root / MODEL_DIR


def read_run(run_dir: str | Path) -> RunInputs:
    """The run directory ``run_dir`` checked for links and missing files, its config and metrics read."""
    # the run directory itself may be a link (the user chose it); realpath, unlike resolve, ends a loop
    root = Path(os.path.realpath(run_dir))
    _check_links(root)
    for path in (root / MODEL_DIR / CARD_FILE, root / MODEL_DIR / ckpt.MODEL_FILE, root / METRICS_FILE,
                 root / CONFIG_FILE):
        if not path.is_file():
            state = "is not a regular file" if path.exists() else "is missing"
            raise PublishInputError(f"{path} {state}; run the whole pipeline first (namsa run CONFIG --out {root})")
    return RunInputs(root, _read_config(root), _read_metrics(root))


def _check_links(root: Path) -> None:
    # publish reads nothing below data/: wherever `namsa run` linked it (execution.data_dir, perhaps
    # node-local storage gone since) is accepted as the configured place
    data = root / "data"
    # (a loop of links there is nobody's data directory: check_parts refuses it in one line)
    RunPaths(root=root, data=Path(os.path.realpath(data)) if data.is_symlink() else data).check_parts()


def _read_capped(root: Path, rel: Path, limit: int) -> bytes:
    with open_regular(root / rel, f"run directory file {rel}") as fh:   # no link followed, no FIFO opened
        return fh.read(limit + 1)


def _read_config(root: Path) -> RunConfig:
    where = f"run directory {root}: {CONFIG_FILE}"
    try:
        raw = load_yaml(_read_capped(root, CONFIG_FILE, MAX_CONFIG_BYTES).decode("utf-8"))
    except (YamlRefused, UnicodeDecodeError) as exc:
        raise PublishInputError(f"{where}: {exc}; use the file `namsa run` wrote") from None
    except yaml.YAMLError as exc:
        raise PublishInputError(f"{where}: not valid YAML ({exc}); use the file `namsa run` wrote") from None
    if isinstance(raw, dict) and isinstance(raw.get("simulation"), dict):
        raw = {**raw, "simulation": {k: v for k, v in raw["simulation"].items() if k not in MACHINE_FIELDS}}
    # every problem, keys named as in `namsa run`'s config errors (a config has few)
    return _validated(RunConfig, raw, where, "publish a run directory as `namsa run` wrote it",
                      format_validation_error)


def _read_metrics(root: Path) -> HeldOutMetrics:
    return read_metrics(root / METRICS_FILE.parent, f"run directory {root}: {METRICS_FILE}")


def read_metrics(eval_dir: Path, where: str | None = None) -> HeldOutMetrics:
    """``eval_dir``'s metrics.json (what `namsa evaluate --out eval_dir` wrote), bounded and typed; one
    line naming ``where`` (default: the file) when it is missing, a link, or not such a file."""
    where = where or f"{eval_dir / METRICS_FILE.name}"
    if not (eval_dir / METRICS_FILE.name).is_file():
        raise PublishInputError(f"{where} is missing; run namsa evaluate --out {eval_dir} first")
    doc = parse_json_bytes(_read_capped(eval_dir, Path(METRICS_FILE.name), MAX_METRICS_BYTES), where,
                           MAX_METRICS_BYTES, kind=_METRICS_KIND)
    # the first problem only: a damaged file of many samples has as many errors, and one says what to fix
    return _validated(HeldOutMetrics, doc, where, f"it is not {_METRICS_KIND}: rerun namsa evaluate",
                      first_validation_problem)


Record = TypeVar("Record", bound=BaseModel)


def _validated(record: type[Record], doc: Any, where: str, advice: str,
               describe: Callable[[ValidationError], str]) -> Record:
    """``doc`` as ``record``; otherwise one line: ``where``, what is wrong (``describe``), ``advice``."""
    if not isinstance(doc, dict):
        shown = "nothing (null)" if doc is None else f"a {type(doc).__name__}"
        raise PublishInputError(f"{where} holds {shown}, not a mapping of fields; {advice}")
    try:
        return record.model_validate(doc)
    except ValidationError as exc:
        raise PublishInputError(f"{where}: {describe(exc)}; {advice}") from None


__all__ = ["RunInputs", "RunConfig", "HeldOutMetrics", "HeldOutSample", "PublishInputError", "read_run", "read_metrics",
           "MAX_METRICS_BYTES"]
