"""The Parsl DAG behind `namsa run`: simulate (fan-out) -> train -> evaluate, in a run directory
laid out as workflow.run_paths describes.

Resume: the stores' contents (LMDB records, reconciled with their manifests) decide which samples
exist; train-summary.json / eval-summary.json record the data fingerprint and config they were made
from. Parsl memoises nothing (its checkpoints are pickles, unsafe in a run directory that came
from elsewhere; see workflow.profiles.no_memoizer).
"""
from __future__ import annotations

import concurrent.futures
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import parsl
from parsl.executors.high_throughput.errors import ManagerLost, WorkerLost

from namsa.errors import NamsaError, RunError
from stage.errors import StoreLockedError
from stage.nofollow import open_no_follow

from . import data_runners, model_runners, runner_io, train_child
from .apps import evaluate_app, simulate_app, train_app
from .config import PipelineConfig, save_resolved
from .errors import NotEnoughSamples, StageFailed, out_of_memory
from .liveview import LiveView, last_step, total_steps, wait_ticking
from .memory import check_fits
from .profiles import build_parsl_config, worker_slots
from .run_paths import TRAIN_RUN_FILE, FailureLog, RunPaths
from .summary import RunSummary, TaskTiming, parsl_overhead

#: profiles whose simulation tasks all run on this machine
LOCAL_PROFILES = ("local", "local-htex")
#: what models.train writes into its output directory (the run directory), plus our summary
TRAINING_OUTPUTS = (TRAIN_RUN_FILE, "checkpoints", "model", "metrics.csv", model_runners.TRAIN_SUMMARY)


class Pipeline:
    """One `namsa run`: plans, submits and watches the stages; see `run_pipeline`."""

    def __init__(self, cfg: PipelineConfig, run_dir: str | Path | None, progress: bool, retry_failed: bool):
        self.cfg = cfg
        self.paths = RunPaths.for_config(cfg, run_dir)
        self.view = LiveView(progress)
        self.retry_failed = retry_failed
        self.summary = RunSummary(run_dir=str(self.paths.root), data_dir=str(self.paths.data))
        self.cfg_dict = cfg.model_dump(mode="json")
        self._dfk = None

    # -- Parsl is loaded only when a stage has work to do ----------------------------------
    def dfk(self):
        if self._dfk is None:
            started = time.time()
            self._dfk = parsl.load(build_parsl_config(self.cfg.execution, self.paths.root))
            self._add_time("parsl_start", time.time() - started)
        return self._dfk

    def close(self, wait: bool) -> None:
        if self._dfk is None:
            return
        started = time.time()
        try:
            if wait:
                self._dfk.wait_for_current_tasks()
            self._dfk.cleanup()
        finally:
            parsl.clear()
            self._dfk = None
            self._add_time("parsl_stop", time.time() - started)

    def _add_time(self, key: str, seconds: float) -> None:
        self.summary.timings[key] = self.summary.timings.get(key, 0.0) + seconds

    def log(self, text: str) -> None:
        with open_no_follow(self.paths.logs / "run.log") as fh:
            fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")

    # -- the stages ----------------------------------------------------------------------------
    def run(self) -> RunSummary:
        started = time.time()
        self.paths.create()
        save_resolved(self.cfg, self.paths.resolved_config)
        self.log(f"run started: {self.paths.root}")
        self.simulate()
        self.check_enough_samples()
        train_future = self.train()
        self.evaluate(train_future)
        self.close(wait=True)
        self.summary.timings["total"] = time.time() - started
        timings = self.summary.timings
        timings["parsl_overhead"] = (parsl_overhead(self.summary.tasks) + timings.get("parsl_start", 0.0)
                                     + timings.get("parsl_stop", 0.0))
        runner_io.write_summary_json(self.paths.root / "summary.json", asdict(self.summary))
        self.log("run finished: " + ", ".join(self.summary.stages_run or ["nothing to do"]))
        return self.summary

    def simulate(self) -> None:
        started = time.time()
        cfg = self.cfg
        plan = data_runners.plan(cfg)
        self._add_time("plan", time.time() - started)
        failures = FailureLog(self.paths.logs / "simulate-failures.json", cfg.simulation.physics_hash())
        if self.retry_failed:
            failures.forget()
        failures.record(plan.failures)
        self.plan = plan
        data_runners.check_same_physics(self.paths.data, cfg.simulation.physics_hash())
        present = data_runners.stored_ids(self.paths.data)
        missing = [s for s in plan.specs
                   if s.sample_id(cfg.simulation) not in present and s.sample_id(cfg.simulation) not in failures.entries]
        self.summary.planned = len(plan.specs)
        if missing:
            self._simulate(missing, plan.sources, failures)
        self.summary.failures = sorted(failures.entries.items()) + self.summary.failures
        self.summary.available = len(data_runners.stored_ids(self.paths.data) & {s.sample_id(cfg.simulation)
                                                                                 for s in plan.specs})

    def _simulate(self, missing: list, sources: dict[str, str], failures: FailureLog) -> None:
        started = time.time()
        self.summary.stages_run.append("simulate")
        n_tasks = min(len(missing), worker_slots(self.cfg.execution))
        if self.cfg.execution.profile in LOCAL_PROFILES:  # the tasks share this machine's memory
            check_fits(self.cfg.simulation, parallel=n_tasks)
        chunks = [data_runners.worker_share(missing, i, n_tasks) for i in range(n_tasks)]
        stores = self._free_store_names(n_tasks)
        deadline_s = self.cfg.execution.simulate_deadline_s
        deadline_at = None if deadline_s is None else started + deadline_s
        self.dfk()
        tasks: list[tuple[concurrent.futures.Future, TaskTiming, Path, list]] = []
        for chunk, store in zip(chunks, stores):
            progress_path = self.paths.logs / f"{store.name}.progress.json"
            progress_path.unlink(missing_ok=True)
            timing = TaskTiming("simulate", submitted=time.time())
            future = simulate_app(self.cfg_dict["simulation"], self.cfg_dict["data"], str(store),
                                  [data_runners.spec_key(s) for s in chunk],
                                  {s.material_id: sources[s.material_id] for s in chunk}, str(progress_path),
                                  deadline_at)
            future.add_done_callback(lambda _f, t=timing: setattr(t, "resolved", time.time()))
            tasks.append((future, timing, progress_path, chunk))
        self.log(f"simulate: {len(missing)} samples in {n_tasks} tasks")
        self.view.start(len(missing), "simulate", "sample")
        try:
            wait_ticking([t[0] for t in tasks], lambda: self._show_simulation(tasks))
        except KeyboardInterrupt:
            self._stop_simulation(tasks)
            raise
        self._show_simulation(tasks)
        self.view.close()
        self._collect_simulation(tasks, failures)
        self._add_time("simulate", time.time() - started)
        for future, *_ in tasks:   # a full disk, say: its own reason and exit 1, not "fix the structures"
            if isinstance(future.exception(), RunError):
                raise future.exception()

    def _free_store_names(self, n: int) -> list[Path]:
        """Store directories for ``n`` writers: store-000, store-001, ... (existing ones are resumed)."""
        return [self.paths.data / f"store-{i:03d}" for i in range(n)]

    def _show_simulation(self, tasks: list) -> None:
        done = written = failed_samples = failed_tasks = running = 0
        for future, _timing, progress_path, _chunk in tasks:
            state = _read_json(progress_path)
            written += state.get("written", 0) + state.get("skipped", 0)
            failed_samples += len(state.get("failed", []))
            if future.done():
                failed_tasks += future.exception() is not None
                done += future.exception() is None
            elif state:
                running += 1
        self.view.update(written + failed_samples, tasks=f"{done}/{len(tasks)} done, {running} running, "
                         f"{failed_tasks} failed", written=written, failed=failed_samples)

    def _stop_simulation(self, tasks: list) -> None:
        """Ctrl-C: let every task finish the sample in hand and close its store, then return."""
        data_runners.STOP.set()
        self.view.note("stopping: finishing the samples in hand (press Ctrl-C again to abort)")
        try:
            concurrent.futures.wait([t[0] for t in tasks], timeout=600)
        finally:
            data_runners.STOP.clear()
            self.view.close()

    def _collect_simulation(self, tasks: list, failures: FailureLog) -> None:
        new_failures: list[tuple[str, str]] = []
        for future, timing, _progress, chunk in tasks:
            exc = future.exception()
            if exc is None:
                result = data_runners.SimulateSummary.from_dict(future.result())
                timing.started, timing.ended = future.result()["entered_at"], result.finished_at
                self.summary.written += result.written
                self.summary.not_reached += result.not_reached if result.deadline_reached else 0
                new_failures += result.failed
                self.log("simulate: " + result.line())
            else:
                reason = f"simulation task failed after {self.cfg.execution.retries} retries: {runner_io.one_line(exc)}"
                present = data_runners.stored_ids(self.paths.data)
                unwritten = [(s.sample_id(self.cfg.simulation), reason) for s in chunk
                             if s.sample_id(self.cfg.simulation) not in present]
                if _node_lost(exc) or isinstance(exc, (StoreLockedError, RunError)):
                    # Its job was killed (scancel, walltime, preemption, a dead node), other live
                    # writers held its store, or the run's environment failed (a full disk): the
                    # samples are fine, so they count as failed in this run only and the rerun makes them.
                    self.summary.failures += unwritten
                else:  # the task itself failed: record what it left unwritten, later runs skip it
                    new_failures += unwritten
                self.log(f"simulate: {reason}")
            self.summary.tasks.append(timing)
        failures.record(new_failures)

    def check_enough_samples(self) -> None:
        """Train only when at least execution.min_success_fraction of the planned samples exist.

        A material that could not be planned at all counts as the average number of samples the
        planned materials have, so losing a whole material weighs like losing its samples (a generated
        one the plan replaced by the next draw loses none; an explicit axis a planned material's cell
        cannot be built along was never expected).
        """
        plan = self.plan
        planned = {s.material_id for s in plan.specs}
        per_material = len(plan.specs) / len(planned) if planned else 1.0
        lost = len({material_id for material_id, _ in plan.failures} - planned - set(plan.replaced))
        # samples the simulate deadline stopped before are not failures: not expected this run
        expected = len(plan.specs) + per_material * lost - self.summary.not_reached
        fraction = self.summary.available / expected if expected else 0.0
        needed = self.cfg.execution.min_success_fraction
        if self.summary.available == 0 or fraction < needed:
            first = self.summary.failures[0] if self.summary.failures else ("-", "none recorded")
            raise NotEnoughSamples(
                f"only {self.summary.available} of about {expected:.0f} planned samples exist "
                f"({fraction:.0%} < execution.min_success_fraction {needed:.0%}; the first failure: "
                f"{first[0]}: {first[1]}); see {self.paths.logs / 'simulate-failures.json'} for all, "
                f"fix the structures or lower the fraction")

    def _done(self, summary_path: Path, sections: tuple[str, ...], **expect: Any) -> dict[str, Any] | None:
        """The stage's summary if it was made from the current data and config, else None."""
        previous = _read_json(summary_path)
        if not previous:
            return None
        wanted = {"data_fingerprint": self.fingerprint, "config_hash": model_runners.section_hash(self.cfg, *sections),
                  **expect}
        return previous if all(previous.get(k) == v for k, v in wanted.items()) else None

    def train(self) -> concurrent.futures.Future | None:
        self.fingerprint = model_runners.data_fingerprint([self.paths.data])
        summary_path = self.paths.root / model_runners.TRAIN_SUMMARY
        done = self._done(summary_path, model_runners.TRAIN_SECTIONS)
        if done is not None:
            self.train_summary = done
            self._record_model(done)
            return None
        started = time.time()
        self.summary.stages_run.append("train")
        # An interrupted training of the same data and config resumes from its last checkpoint;
        # any other earlier training (finished, or of other data/config) is kept aside.
        launch_path = self.paths.logs / "train-launch.json"
        launch = {"data_fingerprint": self.fingerprint,
                  "config_hash": model_runners.section_hash(self.cfg, *model_runners.TRAIN_SECTIONS)}
        resume = (self.paths.root / TRAIN_RUN_FILE).exists() and not summary_path.exists() \
            and _read_json(launch_path) == launch
        if not resume and any((self.paths.root / name).exists() for name in TRAINING_OUTPUTS):
            self._archive_training()
        runner_io.write_summary_json(launch_path, launch)
        command, resource_spec = train_child.command(self.cfg, self.paths, resume)
        log_path = train_child.log_path(self.paths)
        self.dfk()
        timing = TaskTiming("train", submitted=time.time())
        future = train_app(command, stdout=(str(log_path), "a"),
                           stderr=(str(log_path), "a"), parsl_resource_specification=resource_spec)
        future.add_done_callback(lambda _f: setattr(timing, "resolved", time.time()))
        self.log(f"train: {command}")
        self.view.start(total_steps(self.cfg), "train", "step")
        metrics_csv = self.paths.root / "metrics.csv"
        try:
            wait_ticking([future], lambda: self.view.update(last_step(metrics_csv)))
        except KeyboardInterrupt:
            self.view.note("stopping: training saves its checkpoint; rerun to resume")
            raise
        finally:
            self.view.close()
        if future.exception() is not None:  # its own line and exit 2 if it refused its input
            raise train_child.failure(future.exception(), self.paths)
        self.train_summary = _read_json(summary_path)
        timing.started, timing.ended = train_child.stamps(self.paths)
        self.summary.tasks.append(timing)
        self._record_model(self.train_summary)
        self._add_time("train", time.time() - started)
        return future

    def _archive_training(self) -> None:
        """Move a previous training's outputs to previous/<time>/ (nothing is deleted)."""
        archive = self.paths.root / "previous" / time.strftime("%Y%m%dT%H%M%S")
        archive.mkdir(parents=True, exist_ok=True)
        for name in TRAINING_OUTPUTS:
            if (self.paths.root / name).exists():
                (self.paths.root / name).rename(archive / name)
        self.log(f"train: earlier training outputs moved to {archive}")

    def _record_model(self, train_summary: dict[str, Any]) -> None:
        """Check the summary's paths (a summary may come with a run directory someone sent) and record them."""
        train_summary["model_dir"] = str(self.paths.inside(train_summary.get("model_dir"), "model_dir"))
        for key in ("metrics_csv", "best_checkpoint"):
            if train_summary.get(key) is not None:
                train_summary[key] = str(self.paths.inside(train_summary[key], key))
        self.summary.model_dir = train_summary.get("model_dir")
        self.summary.best_checkpoint = train_summary.get("best_checkpoint")

    def evaluate(self, train_future: concurrent.futures.Future | None) -> None:
        summary_path = self.paths.eval / model_runners.EVAL_SUMMARY
        model_stamp = self.train_summary.get("finished_at")
        done = self._done(summary_path, model_runners.EVAL_SECTIONS, model_finished_at=model_stamp)
        if done is None:
            done = self._evaluate(train_future, model_stamp)
        for key in ("metrics_json", "report_html"):
            if done.get(key) is not None:
                done[key] = str(self.paths.inside(done[key], key))
        self.summary.metrics_json = done.get("metrics_json")
        self.summary.report_html = done.get("report_html")
        self.summary.headline = done.get("headline", {})
        self.summary.dose_sweep = done.get("dose_sweep", [])
        self.summary.verdicts = done.get("verdicts")

    def _evaluate(self, train_future: concurrent.futures.Future | None, model_stamp: float) -> dict[str, Any]:
        started = time.time()
        self.summary.stages_run.append("evaluate")
        self.dfk()
        timing = TaskTiming("evaluate", submitted=time.time())
        future = evaluate_app(self.cfg_dict, [str(self.paths.data)], self.train_summary["model_dir"],
                              str(self.paths.eval), self.train_summary.get("metrics_csv"),
                              inputs=[train_future] if train_future else [])
        future.add_done_callback(lambda _f: setattr(timing, "resolved", time.time()))
        self.view.note("evaluating against the baselines ...")
        wait_ticking([future], lambda: None)
        if future.exception() is not None:
            exc = future.exception()
            if isinstance(exc, (NamsaError, OSError)) or out_of_memory(exc):  # one line from main(), as when run alone
                raise exc
            raise StageFailed(f"evaluation failed: {runner_io.one_line(exc)}; see {self.paths.root / 'runinfo'}")
        result = future.result()
        # Remember which model this evaluation belongs to, so a retrained model is re-evaluated.
        result["model_finished_at"] = model_stamp
        runner_io.write_summary_json(self.paths.eval / model_runners.EVAL_SUMMARY,
                                     {**result, **model_runners.relative_paths(result, self.paths.root)})
        timing.started, timing.ended = result["entered_at"], result["finished_at"]
        self.summary.tasks.append(timing)
        self._add_time("evaluate", time.time() - started)
        return result


def _node_lost(exc: BaseException) -> bool:
    """Whether a task failed because the worker or node running it went away, not by itself."""
    return isinstance(exc, (ManagerLost, WorkerLost))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def run_pipeline(cfg: PipelineConfig, run_dir: str | Path | None = None, *, progress: bool = True,
                 retry_failed: bool = False) -> RunSummary:
    """Run the whole DAG (simulate -> train -> evaluate) for ``cfg`` in ``run_dir``.

    Rerunning on the same run directory does only what is missing. Ctrl-C lets simulation tasks
    finish the sample in hand and close their stores, then raises KeyboardInterrupt.
    """
    pipeline = Pipeline(cfg, run_dir, progress, retry_failed)
    try:
        return pipeline.run()
    except BaseException:
        pipeline.view.close()
        pipeline.close(wait=False)
        raise
