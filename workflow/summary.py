"""What `namsa run` did: per-task timings and the Parsl overhead computed from them, the run summary
(summary.json) and the headline lines (errors and verdicts) that `namsa run` and `namsa evaluate` print."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from evaluation.verdict import study_reference
from evaluation.views import HEADLINE, LEGACY, LEVEL, STRUCTURE, VIEW_TITLES, headline_scores


@dataclass
class TaskTiming:
    """When Parsl got a task and when the task itself started and ended (time.time())."""

    stage: str
    submitted: float
    started: float | None = None
    ended: float | None = None
    resolved: float | None = None


def parsl_overhead(tasks: Sequence[TaskTiming]) -> float:
    """Seconds of each stage's wall time (first submission -> last result in the driver) not
    covered by the span in which its tasks ran (first start -> last end), summed over stages.

    This is the time Parsl itself adds on the critical path: dispatch to an executor, starting
    workers, (de)serialising, and returning results. Tasks with a missing stamp are left out.
    """
    total = 0.0
    for stage_name in dict.fromkeys(t.stage for t in tasks):
        timed = [t for t in tasks if t.stage == stage_name and None not in (t.started, t.ended, t.resolved)]
        if not timed:
            continue
        wall = max(t.resolved for t in timed) - min(t.submitted for t in timed)
        running = max(t.ended for t in timed) - min(t.started for t in timed)
        total += max(wall - running, 0.0)
    return total


@dataclass
class RunSummary:
    """What `run_pipeline` did, and where everything is."""

    run_dir: str
    data_dir: str
    planned: int = 0
    available: int = 0
    written: int = 0
    #: planned samples execution.simulate_deadline_s stopped before (a rerun simulates them)
    not_reached: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    stages_run: list[str] = field(default_factory=list)
    model_dir: str | None = None
    best_checkpoint: str | None = None
    metrics_json: str | None = None
    report_html: str | None = None
    headline: dict[str, Any] = field(default_factory=dict)
    verdicts: dict[str, Any] | None = field(default_factory=dict)  # None: an evaluation from before verdicts
    dose_sweep: list[dict[str, Any]] = field(default_factory=list)  # evaluation.doses: scores on noisy data
    timings: dict[str, float] = field(default_factory=dict)
    tasks: list[TaskTiming] = field(default_factory=list)

    def text(self) -> str:
        lines = [f"run directory: {self.run_dir}",
                 f"samples: {self.available} of {self.planned} planned in {self.data_dir}"
                 f" ({self.written} simulated now, {len(self.failures)} failed"
                 + (f", {self.not_reached} not reached by the simulate deadline: rerun to continue)"
                    if self.not_reached else ")")]
        lines += [f"  failed: {who}: {why}" for who, why in self.failures[:10]]
        if len(self.failures) > 10:
            lines.append(f"  ... {len(self.failures) - 10} more in logs/simulate-failures.json")
        lines.append("stages run: " + (", ".join(self.stages_run) or "none (everything was already done)"))
        for label, path in (("model", self.model_dir), ("best checkpoint", self.best_checkpoint),
                            ("metrics", self.metrics_json), ("report", self.report_html)):
            if path:
                lines.append(f"{label}: {path}")
        lines += headline_lines(self.headline, self.verdicts, self.dose_sweep)
        if self.timings:
            lines.append("wall time: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.timings.items()
                                                   if not k.endswith("fraction")))
        return "\n".join(lines)


def headline_lines(headline: dict[str, Any], verdicts: dict[str, Any] | None,
                   dose_sweep: list[dict[str, Any]] | None = None) -> list[str]:
    """Per target: every method's relative L2 under the field's rule (the headline: each map in its own
    units, only its mean from the truth), beside it the structure view's (one least-squares scale and
    offset for every method), the network's level error and the legacy rule's figures, said as such;
    then the verdict against each baseline as `evaluation.verdict` decided it (the report says the
    same); then, with ``evaluation.doses``, one line per dose (`evaluation.dose_sweep`). A headline
    written before the field's rule (an old eval-summary.json) is printed as the legacy rule's."""
    lines = []
    for target, per_method in headline.items():
        view, scores = headline_scores(per_method)
        errors = _rel_l2(scores)
        if not errors:
            continue
        if view == HEADLINE:
            lines.append(f"{target} relative L2 on held-out samples, {VIEW_TITLES[HEADLINE]}; lower is better: "
                         f"{errors}")
            lines += _beside(per_method)
        else:
            lines.append(f"{target} relative L2 on held-out samples, {VIEW_TITLES[LEGACY]}; this evaluation predates "
                         f"the field's rule, run namsa evaluate again: {errors}")
        if verdicts is None:
            lines.append("  no verdict: this evaluation predates verdicts; run namsa evaluate again")
            continue
        lines += [f"  {v['sentence']}" for v in verdicts.get(target, {}).values()]
    if dose_sweep:
        from evaluation.dose_sweep import dose_lines

        lines += ["on shot-noised patterns (evaluation.doses):", *dose_lines(dose_sweep)]
    study = study_reference() if lines else None
    return lines + ([study] if study else [])


def _rel_l2(scores: dict[str, Any]) -> str:
    """"network 0.225, icom 0.277" for every method with a relative L2 ("" when none has one)."""
    values = {m: (metrics or {}).get("rel_l2") for m, metrics in scores.items()}
    return ", ".join(f"{m} {v:.3f}" for m, v in values.items() if v is not None)


def _beside(per_method: dict[str, Any]) -> list[str]:
    """The lines under the field's: the structure view, the network's level error, the legacy rule."""
    lines = [_view_line(per_method, STRUCTURE)]
    level = next((v[LEVEL] for v in per_method.values() if LEVEL in v), None)
    if level and level.get("level_error") is not None:
        median = level.get("level_error_median")
        lines.append("  the network's level error |mean(pred) - mean(truth)| / |mean(truth)|: "
                     + (f"median {median:.3f}, " if median is not None else "") + f"mean {level['level_error']:.3f} "
                     "(no baseline estimates a map's mean: no verdict)")
    return [line for line in lines + [_view_line(per_method, LEGACY)] if line]


def _view_line(per_method: dict[str, Any], view: str) -> str:
    """Every method's relative L2 in ``view``, said to be no part of the verdict ("" when none has one)."""
    errors = _rel_l2({m: v.get(view) for m, v in per_method.items()})
    return f"  {VIEW_TITLES[view]}; not used by the verdict: {errors}" if errors else ""
