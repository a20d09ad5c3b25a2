"""The Parsl apps of the DAG, in a module of their own.

A worker unpickles an app by importing the module that defines it, so this module imports only
Parsl: the simulation app then runs without importing torch (workflow.config pulls in the models
room). Arguments are plain JSON-able values. No app is memoised (see workflow.profiles.no_memoizer):
the stores and the stage summaries decide what is done. Each app records ``entered_at`` as its
first statement, so the driver can measure Parsl's own latency.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from parsl import bash_app, python_app

#: executor labels every profile defines (workflow.profiles): simulation/evaluation workers, training
WORKERS = "workers"
TRAIN = "train"


@python_app(executors=[WORKERS])
def simulate_app(simulation: dict, data: dict, store_dir: str, spec_keys: list, sources: dict,
                 progress_path: str, deadline_at: float | None = None) -> dict:
    """One simulation chunk -> one store; only the simulation and data sections travel (and the
    simulate stage's deadline, epoch seconds, the same for every chunk)."""
    entered_at = time.time()
    from namsa import SimulationConfig
    from stage import DataConfig
    from workflow import data_runners

    specs = [data_runners.spec_from_key(k) for k in spec_keys]
    try:
        summary = data_runners.simulate_specs(SimulationConfig.model_validate(simulation),
                                              DataConfig.model_validate(data), store_dir, specs, sources,
                                              progress=False, progress_path=progress_path, deadline_at=deadline_at)
    finally:  # the worker lives on; training may start next on the same GPUs
        data_runners.release_device_pools()
    return {**summary.to_dict(), "entered_at": entered_at}


@bash_app(executors=[TRAIN])
def train_app(command: str, stdout: str | None = None, stderr: str | None = None,
              parsl_resource_specification: dict | None = None) -> str:
    """The training job: `namsa train` under the profile's launcher (see profiles.train_command)."""
    return command


@python_app(executors=[WORKERS])
def evaluate_app(cfg_dict: dict, data_dirs: list, model_dir: str, out_dir: str, metrics_csv: str | None,
                 inputs: Sequence[Any] = ()) -> dict:
    """Evaluation of the trained model; ``inputs`` carries the training future it waits for."""
    entered_at = time.time()
    from workflow import model_runners
    from workflow.config import PipelineConfig

    cfg = PipelineConfig.model_validate(cfg_dict)
    summary = model_runners.evaluate(cfg, data_dirs, model_dir, out_dir, train_metrics_csv=metrics_csv)
    return {**summary, "entered_at": entered_at}
