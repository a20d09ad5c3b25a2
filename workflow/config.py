"""The pipeline config: one YAML file, validated by pydantic, with `--set dotted.key=value` overrides.

`PipelineConfig` composes the sections the other rooms own (simulation, data, model, training,
distributed, evaluation) with the `execution` section owned here (which Parsl profile runs the
DAG, with every site-specific field of that profile). Unknown keys, wrong types and unknown
profiles are `ConfigError`s: one line naming the dotted key, e.g.
``quickstart.yaml: simulation.energy_kv: Input should be a valid number``.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from models import ModelConfig, TrainConfig
from models.distributed import DistributedConfig
from evaluation import EvaluationConfig
from namsa.config import SimulationConfig
from namsa.errors import UserError
from stage import DataConfig

from .memory import cbed_problem, machine_memory
from .plansize import plan_problem
from .safe_yaml import MAX_CONFIG_BYTES, MAX_DEPTH, YamlRefused, load_yaml

#: names of the execution profiles; `workflow.profiles.FACTORIES` maps each to a Parsl Config factory.
PROFILE_NAMES: tuple[str, ...] = ("local", "local-htex", "slurm", "pbs")

#: the embedded default config shipped inside the package (a copy of configs/quickstart.yaml).
DEFAULT_CONFIG_NAME = "quickstart.yaml"


class ConfigError(UserError):
    """A config file or override that does not validate; the message names the dotted key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocalHtexSite(_Section):
    """`local-htex`: a HighThroughputExecutor on this machine, listening on 127.0.0.1 only.

    gpus_per_node:    GPUs to pin one worker each to (Parsl `available_accelerators`); 0 = CPU
                      workers, `execution.workers` of them.
    cores_per_worker: CPU cores Parsl budgets per worker.
    """

    gpus_per_node: int = Field(0, ge=0)
    cores_per_worker: float = Field(1.0, gt=0)


class ClusterSite(_Section):
    """Fields every batch-scheduler site has (see `SlurmSite`, `PBSSite`).

    Simulation and evaluation run on an HTEX pool (`nodes` per block, up to `max_blocks` blocks,
    one worker per GPU when `gpus_per_node` > 0, else `execution.workers` per node). Training runs
    as one job of `train_nodes` nodes through Parsl's MPIExecutor (one rank per GPU), or with
    `train_launcher: torchrun` as one torchrun per node. Workers connect back to the driver at
    `address`, or at the address of network `interface` (e.g. ib0, hsn0) on the driver's host;
    neither = every address Parsl finds (slow: it also asks an external service). `walltime` and
    `train_walltime` are HH:MM:SS; `worker_init` runs on every node before the workers start (load
    modules, activate the environment); `scheduler_options` are extra scheduler directive lines.
    `max_idletime` (seconds) is how long a block with no task keeps its nodes before Parsl cancels
    it: the simulation block is idle while training runs, the training block while evaluation
    runs, so on a busy (or one-node) cluster a shorter value frees nodes for the next stage sooner.
    `heartbeat_threshold` (seconds) is how long a silent worker node may stay silent before the
    driver declares it lost and its tasks failed (retried, or left to the next run): a block that was
    cancelled, preempted or ran out of walltime is noticed this long after it died.
    """

    account: str | None = None
    address: str | None = None
    interface: str | None = None
    walltime: str = "01:00:00"
    train_walltime: str = "02:00:00"
    worker_init: str = ""
    scheduler_options: str = ""
    nodes: int = Field(1, ge=1)
    max_blocks: int = Field(1, ge=1)
    train_nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    max_idletime: float = Field(120.0, gt=0)
    heartbeat_threshold: int = Field(120, ge=4)


class SlurmSite(ClusterSite):
    """`slurm`: SlurmProvider + SrunLauncher; training through MPIExecutor with srun.

    `partition`, `qos`, `constraint` become `#SBATCH` lines; `cores_per_node` and
    `mem_per_node_gb` size the request; `exclusive` asks for whole nodes.
    """

    partition: str | None = None
    qos: str | None = None
    constraint: str | None = None
    cores_per_node: int | None = Field(None, ge=1)
    mem_per_node_gb: int | None = Field(None, ge=1)
    exclusive: bool = True
    train_launcher: Literal["srun", "torchrun"] = "srun"


class PBSSite(ClusterSite):
    """`pbs`: PBSProProvider + MpiExecLauncher; training through MPIExecutor with mpiexec.

    `select_options` is appended to the `#PBS -l select=` line (`ngpus=` is added from
    `gpus_per_node`); `scheduler_options` are extra `#PBS` lines (e.g. `#PBS -l filesystems=home`).
    `mpiexec_bind_cmd` / `mpiexec_overrides` shape the mpiexec that starts one worker pool per node
    (Parsl's defaults suit Open MPI/MPICH; Cray PALS wants `--cpu-bind` and `--ppn 1`).
    """

    queue: str | None = None
    select_options: str = ""
    cpus_per_node: int = Field(1, ge=1)
    train_launcher: Literal["mpiexec", "torchrun"] = "mpiexec"
    mpiexec_bind_cmd: str = "--bind-to"
    mpiexec_overrides: str = ""


class ExecutionConfig(_Section):
    """How the DAG runs: which Parsl profile, how many workers, how failures are tolerated.

    profile:                  one of PROFILE_NAMES.
    workers:                  simulation/evaluation workers (threads for `local`, worker processes
                              per node otherwise); the simulation fans out into this many tasks
                              per node, each writing its own store.
    retries:                  Parsl retries of a failed task before it is recorded and skipped.
    min_success_fraction:     training starts when at least this fraction of the planned samples
                              exists (1.0 = all of them).
    train_processes_per_node: training ranks per node (GPUs per node on a GPU machine; > 1 on a
                              laptop uses `torchrun --standalone` with gloo).
    data_dir:                 where simulation tasks write their stores (default <run>/data); set
                              it to node-local or scratch storage on a cluster.
    simulate_deadline_s:      seconds after the simulate stage starts (`namsa simulate`, `namsa run`;
                              planning included) when no new sample is started: the samples not reached are stopped,
                              not failed (a rerun simulates them), and training starts on what exists;
                              each worker takes its samples in an interleaved order, so a cut set still
                              spans the materials. None: no deadline.
    plan_cache_dir:           where the plan of the simulation section is kept (`workflow.plan_cache`):
                              read there when the config, the namsa package and the structure
                              libraries are unchanged, else made and stored; None: planned afresh
                              every time. Relative paths are relative to the working directory.
    """

    profile: str = "local"
    workers: int = Field(2, ge=1)
    retries: int = Field(1, ge=0)
    min_success_fraction: float = Field(1.0, ge=0.0, le=1.0)
    train_processes_per_node: int = Field(1, ge=1)
    data_dir: str | None = None
    simulate_deadline_s: float | None = Field(None, gt=0.0)
    plan_cache_dir: str | None = None
    local_htex: LocalHtexSite = LocalHtexSite()
    slurm: SlurmSite = SlurmSite()
    pbs: PBSSite = PBSSite()

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        if value not in PROFILE_NAMES:
            raise ValueError(f"unknown profile {value!r}; choose one of {', '.join(PROFILE_NAMES)}")
        return value


class PipelineConfig(_Section):
    """The whole pipeline: one section per room plus `execution`."""

    name: str = "quickstart"
    simulation: SimulationConfig = SimulationConfig()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    training: TrainConfig = TrainConfig()
    distributed: DistributedConfig = DistributedConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    execution: ExecutionConfig = ExecutionConfig()

    @field_validator("name")
    @classmethod
    def _name_is_a_directory_name(cls, value: str) -> str:
        if not value or "/" in value or value in (".", ".."):
            raise ValueError(f"name {value!r} must be a plain directory name (it names runs/<name>/)")
        return value

    @field_validator("simulation")
    @classmethod
    def _materials_are_ids(cls, value: SimulationConfig) -> SimulationConfig:
        """simulation.materials names library ids; a CIF path there gets the advice that works."""
        if value.materials == "library":
            return value
        paths = [m for m in value.materials if m.lower().endswith(".cif") or "/" in m or os.sep in m]
        if paths:
            raise ValueError(f"materials entry {paths[0]!r} is a file path, but materials lists built-in "
                             f"structure ids (namsa.library.list_ids()); put your CIF files in one directory "
                             f"and set simulation.cif_dir to it (materials: [] simulates only those)")
        return value

    @model_validator(mode="after")
    def _sections_agree(self) -> "PipelineConfig":
        """The network must fit the simulated data: caught here, not an hour into a run."""
        # An absurd scan must be refused before the advice below would match the model to it.
        too_big = cbed_problem(self.simulation, machine_memory()[0])
        if too_big:
            raise ValueError(f"simulation.scan_shape: {too_big}")
        too_many = plan_problem(self.simulation, self.data)
        if too_many:
            raise ValueError(f"simulation: {too_many}")
        try:
            arch = self.model.architecture()
        except UserError as exc:  # pydantic reports only ValueErrors as validation errors (one line, with the source)
            raise ValueError(str(exc)) from None
        sim = self.simulation
        problem = arch.data_mismatch(sim.scan_shape[0] * sim.scan_shape[1], sim.pattern_px, sim.target_px,
                                     tuple(sim.scan_shape))
        if problem:
            raise ValueError(f"{problem} (model preset {self.model.preset})")
        return self


# --------------------------------------------------------------------------------------------
# loading


def default_config_path() -> Path:
    """The embedded default config (the quickstart), shipped as package data."""
    return Path(str(resources.files("workflow") / DEFAULT_CONFIG_NAME))


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``dotted.key=value`` into (["dotted", "key"], value); the value is parsed as YAML.

    So ``--set training.max_steps=20`` gives an int, ``--set simulation.materials=[Si,GaAs]`` a list
    and ``--set data.node_local_dir=null`` None.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: expected dotted.key=value, e.g. --set training.max_steps=20")
    if key.count(".") >= MAX_DEPTH:
        raise ConfigError(f"--set {key[:40]}...: the key nests more than {MAX_DEPTH} levels; config keys are a "
                          f"few levels deep, e.g. --set training.max_steps=20")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except YamlRefused as exc:
        raise ConfigError(f"--set {key}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML ({_first_line(exc)})") from None
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Return a copy of ``raw`` with every ``dotted.key=value`` override applied in order."""
    merged = _deep_copy(raw)
    for text in overrides:
        keys, value = parse_override(text)
        node = merged
        for depth, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                dotted = ".".join(keys[: depth + 1])
                raise ConfigError(f"--set {'.'.join(keys)}: {dotted} is the value {child!r}, "
                                  f"not a section, so it has no key {keys[depth + 1]!r}")
            node = child
        node[keys[-1]] = value
    return merged


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, turning every failure into a one-line `ConfigError`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found; pass a YAML file such as configs/quickstart.yaml")
    try:
        data = load_yaml(_read_bounded(path).decode("utf-8"))
    except YamlRefused as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({_first_line(exc)})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (byte {exc.start} is not UTF-8); pass a YAML config "
                          f"such as configs/quickstart.yaml") from None
    except PermissionError:
        raise ConfigError(f"{path}: permission denied reading the config; fix its permissions") from None
    if data is None:
        # An empty file would silently run every default (the full-size library data set).
        raise ConfigError(f"{path}: the config is empty; start from a copy of configs/quickstart.yaml, "
                          f"or leave CONFIG out to run the embedded quickstart")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got a {type(data).__name__}")
    return data


def _read_bounded(path: Path) -> bytes:
    """The file's bytes, refusing (without reading on) a file larger than any config."""
    with path.open("rb") as fh:
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 1024} KiB, far more than a config holds; "
                          f"pass a YAML config such as configs/quickstart.yaml")
    return data


def validate_config(raw: dict[str, Any], source: str = "config") -> PipelineConfig:
    """Validate a raw mapping into a `PipelineConfig`; errors name the dotted key, on one line."""
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {format_validation_error(exc)}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> PipelineConfig:
    """Load a pipeline config (the embedded quickstart when ``path`` is None) and apply overrides."""
    path = default_config_path() if path is None else Path(path)
    raw = apply_overrides(read_yaml(path), list(overrides))
    return validate_config(raw, source=path.name)


def dump_config(cfg: PipelineConfig) -> str:
    """The resolved config as YAML (every default spelled out), loadable by `load_config`."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def save_resolved(cfg: PipelineConfig, path: str | Path) -> Path:
    """Write the resolved config atomically (a killed run never leaves half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dump_config(cfg))
    tmp.replace(path)
    return path


# --------------------------------------------------------------------------------------------
# error messages


def format_validation_error(exc: ValidationError) -> str:
    """One line per pydantic error, joined by '; ': ``dotted.key: message``."""
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        dotted = ".".join(loc)
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1])
            hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
            parts.append(f"{dotted}: unknown key{hint}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            # Cross-section checks carry no location; their message names the keys itself.
            parts.append(f"{dotted}: {msg}" if dotted else msg)
    return "; ".join(parts)


def _allowed_keys(parent_loc: list[str]) -> list[str]:
    """Field names of the model found by walking ``parent_loc`` down from PipelineConfig."""
    model: Any = PipelineConfig
    for key in parent_loc:
        field = getattr(model, "model_fields", {}).get(key)
        if field is None:
            return []
        model = field.annotation
    fields = getattr(model, "model_fields", None)
    return sorted(fields) if fields else []


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value
