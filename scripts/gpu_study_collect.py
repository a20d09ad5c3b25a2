"""After the GPU study run (scripts/gpu_study.sh): the figures a session records, in at most 8 files of
at most 16 MiB under $OUT: the new model and the shipped flagship scored on the same dev samples,
the simulation and training figures, and the model itself when its weights fit.

    python scripts/gpu_study_collect.py RUN OUT

Both networks are judged by the field's rule (issue 30): in physical units with only the map's mean
taken from the truth, which for a network's map is the contrast part of its relative L2
(``rel_l2_contrast`` in metrics.json, ||(p - mean p) - (t - mean t)|| / ||t||); the plain relative L2
and the level error are reported beside it.

What a step left is read field by field and trusted in nothing: a step killed at its limit leaves a
file missing or half a run (a training without train-summary.json or without ``finished_at``), and a
damaged file may hold a list where an object was or text where a number was. Whatever could not be
read is one line in study.json's ``notes``, and study.json is always written: on a device every minute
counts, and this is the step that brings the others' figures back. Files are read only inside RUN,
never through a symbolic link (a linked model file is refused, not copied).

This script imports none of namsa's packages: it must also run when the install step was killed.
"""
from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import stat
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable

#: what comes back from a device call
MAX_FILES, MAX_FILE_BYTES = 8, 16 << 20
#: the largest JSON or CSV file read from the run (metrics.json of 120 samples is well under 1 MiB)
MAX_READ_BYTES = 32 << 20
RULE = ("rel_l2_contrast", "rel_l2", "rel_l2_level")
#: metrics.json's view of the network as predicted (evaluation.views.LEGACY; this script runs without the package)
LEGACY_VIEW = "legacy_network_as_predicted_baselines_fitted"
#: the step timings of metrics.csv (models/training/logs.py)
TIMING = ("step_s", "compute_s", "other_s")
#: the exported model's files (models/training/export.py)
MODEL_FILES = ("model.safetensors", "model_card.json")


class Unreadable(Exception):
    """Why a file of the run was not read, in one line (it becomes a note of study.json)."""


def _shown(root: Path, path: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def open_inside(root: Path, path: Path) -> BinaryIO:
    """``path`` opened for binary reading when it is a regular file inside ``root``, with no symbolic
    link at its name and none on the way that leads out of ``root``; `Unreadable` otherwise. O_NOFOLLOW
    and the `fstat` of the open file decide, so a link or a FIFO swapped in meanwhile is refused too."""
    shown = _shown(root, path)
    try:
        outside = not path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):   # a loop of links
        outside = True
    if outside:
        raise Unreadable(f"{shown} leads outside {root} through a symbolic link; the study reads only the "
                         f"run's own files")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unreadable(f"{shown} is a symbolic link; the study reads only the run's own files, "
                             f"never through a link") from None
        why = "missing" if exc.errno == errno.ENOENT else f"not readable ({exc.strerror or exc})"
        raise Unreadable(f"{shown} is {why}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Unreadable(f"{shown} is not a regular file")
    return os.fdopen(fd, "rb")


def read_bounded(root: Path, path: Path, limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of ``path`` (`open_inside`), refused when they exceed ``limit``."""
    try:
        with open_inside(root, path) as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise Unreadable(f"{_shown(root, path)} is not readable ({exc.strerror or exc})") from None
    if len(raw) > limit:
        raise Unreadable(f"{_shown(root, path)} holds more than {limit} bytes")
    return raw


def read_object(root: Path, path: Path, notes: list[str]) -> dict[str, Any]:
    """The JSON object in ``path``; {} with a note when it is missing, damaged or not an object."""
    try:
        value = json.loads(read_bounded(root, path).decode("utf-8", errors="replace"))
    except Unreadable as exc:
        notes.append(str(exc))
        return {}
    except (ValueError, RecursionError) as exc:   # empty, truncated, or nested beyond Python's stack
        notes.append(f"{_shown(root, path)} is not JSON ({str(exc)[:80] or type(exc).__name__}): empty or cut short?")
        return {}
    if not isinstance(value, dict):
        notes.append(f"{_shown(root, path)} holds a JSON {type(value).__name__}, not an object; ignored")
        return {}
    return value


def finite(value: Any, *, text: bool = False) -> float | None:
    """``value`` as a finite float: a JSON number (not a bool), or with ``text`` a CSV cell; else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or (isinstance(value, str) and not text):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _network_entry(methods: Any) -> dict[str, Any]:
    """The network as predicted among one target's methods (metrics.json's legacy view holds its level /
    contrast split; its contrast part is the field rule's rel_l2); older files call it "physical"."""
    network = methods.get("network") if isinstance(methods, dict) else None
    if not isinstance(network, dict):
        return {}
    raw = network.get(LEGACY_VIEW) or network.get("physical")
    return raw if isinstance(raw, dict) else {}


def _record_scores(record: Any) -> tuple[str, dict[str, dict[str, float]]] | None:
    """(sample id, target -> the network's scores) of one sample record; None when the record is damaged."""
    if not isinstance(record, dict) or not isinstance(record.get("sample_id"), str):
        return None
    targets = record.get("metrics", {})
    if not isinstance(targets, dict):
        return None
    scores = {}
    for target, methods in targets.items():
        values = {k: finite(_network_entry(methods).get(k)) for k in RULE}
        if all(v is not None for v in values.values()):
            scores[target] = values
    return record["sample_id"], scores


def _network_scores(metrics: dict[str, Any], where: str, notes: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """sample id -> target -> {rel_l2_contrast, rel_l2, rel_l2_level} of the network."""
    records = metrics.get("samples", [])
    if not isinstance(records, list):
        notes.append(f"{where}: samples is a JSON {type(records).__name__}, not a list; no scores read")
        return {}
    out: dict[str, dict[str, dict[str, float]]] = {}
    damaged = 0
    for record in records:
        scored = _record_scores(record)
        if scored is None:
            damaged += 1
        elif scored[1]:
            out.setdefault(scored[0], {}).update(scored[1])
    if damaged:
        notes.append(f"{where}: {damaged} of {len(records)} sample records damaged; skipped")
    return out


def compare(run: Path, notes: list[str]) -> dict[str, Any]:
    """Mean scores of the new model and the flagship over the samples both were scored on."""
    new, old = (_network_scores(read_object(run, run / name / "metrics.json", notes), f"{name}/metrics.json", notes)
                for name in ("eval-new", "eval-flagship"))
    shared = sorted(set(new) & set(old))
    table: dict[str, Any] = {"samples": len(shared)}
    for target in ("potential", "density"):
        rows = [(new[s][target], old[s][target]) for s in shared if target in new[s] and target in old[s]]
        if rows:   # each term divided first: a mean of finite numbers stays finite
            table[target] = {k: {"new": sum(a[k] / len(rows) for a, _ in rows),
                                 "flagship": sum(b[k] / len(rows) for _, b in rows)} for k in RULE}
    return table


def _timing_rows(run: Path, notes: list[str]) -> list[dict[str, float]]:
    """The step rows of train/metrics.csv with a number in each of `TIMING` (rows without ``step_s``
    are other events; a row with text or a gap where a number belongs is skipped, with a note)."""
    path = run / "train" / "metrics.csv"
    try:
        text = read_bounded(run, path).decode("utf-8", errors="replace")
        rows = [r for r in csv.DictReader(io.StringIO(text, newline="")) if r.get("step_s")]
    except Unreadable as exc:
        notes.append(str(exc))
        return []
    except csv.Error as exc:   # a NUL byte, a field larger than csv allows
        notes.append(f"train/metrics.csv is not CSV ({exc}); no step timings read")
        return []
    numbers = [{k: finite(r.get(k), text=True) for k in TIMING} for r in rows]
    kept = [n for n in numbers if None not in n.values()]
    if len(kept) < len(rows):
        notes.append(f"train/metrics.csv: {len(rows) - len(kept)} of {len(rows)} step rows lack a number in "
                     f"{', '.join(TIMING)}; skipped")
    return kept  # type: ignore[return-value]


def train_timing(run: Path, summary: dict[str, Any], notes: list[str]) -> dict[str, float]:
    """Where a training step's time goes (medians over the logged steps of metrics.csv, seconds):
    ``compute_s`` forward, backward and update on the device, ``other_s`` the rest of the step
    (waiting for the loader, the batch's copy and its shot noise); ``outside_steps_s`` the run's
    wall time that no step holds (start-up, dev evaluations, checkpoints, export), when train-summary.json
    says when the training started and finished. Empty without a log."""
    rows = _timing_rows(run, notes)
    if not rows:
        return {}
    timing = {k: statistics.median(r[k] for r in rows) for k in TIMING}
    ends = {k: finite(summary.get(k)) for k in ("started_at", "finished_at", "steps")}
    if None in ends.values():
        if summary:   # a missing summary has its note already
            missing = ", ".join(k for k, v in ends.items() if v is None)
            notes.append(f"train/train-summary.json has no number for {missing} (a training killed at its "
                         f"limit?); no outside_steps_s")
        return timing
    timing["outside_steps_s"] = ends["finished_at"] - ends["started_at"] - ends["steps"] * timing["step_s"]
    return timing


def simulate_summaries(run: Path, notes: list[str]) -> dict[str, dict[str, Any]]:
    """Each simulation worker's summary (data/simulate-*.json) by file name."""
    paths = sorted((run / "data").glob("simulate-*.json"))
    if not paths:
        notes.append("data/simulate-*.json: none (the simulation left no summary)")
    return {p.name: read_object(run, p, notes) for p in paths}


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary sibling and a rename: a kill leaves no half file, and
    a link at the name is replaced, not written through."""
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def copy_model(run: Path, out: Path, notes: list[str]) -> list[Path]:
    """The exported model's files that fit a device call's limit, copied into ``out``."""
    written = []
    for name in MODEL_FILES:
        try:
            data = read_bounded(run, run / "train" / "model" / name, MAX_FILE_BYTES)
        except Unreadable as exc:
            notes.append(f"{exc}; not copied")
            continue
        write_atomic(out / name, data)
        written.append(out / name)
    return written


def _field(name: str, make: Callable[[], Any], notes: list[str]) -> Any:
    """One field of study.json. A failure this script did not foresee costs that field alone, with a
    note, never the others: the device call returns only what this script writes."""
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 (see the docstring)
        notes.append(f"{name}: not collected ({type(exc).__name__}: {exc})"[:300])
        return {}


def gather(run: Path, notes: list[str]) -> dict[str, Any]:
    """study.json's figures, each from whatever its step left."""
    summary = _field("train", lambda: read_object(run, run / "train" / "train-summary.json", notes), notes)
    return {"check": _field("check", lambda: read_object(run, run / "check.json", notes), notes),
            "simulate": _field("simulate", lambda: simulate_summaries(run, notes), notes),
            "train": summary,
            "train_timing": _field("train_timing", lambda: train_timing(run, summary, notes), notes),
            "compare": _field("compare", lambda: compare(run, notes), notes)}


def collect(run: Path, out: Path) -> dict[str, Any]:
    """Write study.json and the model into ``out``; returns study.json's content (its ``notes`` say what
    the run lacked) with ``files``, the files written (at most MAX_FILES)."""
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    figures = gather(run, notes)
    copied = _field("model", lambda: copy_model(run, out, notes), notes) or []
    figures.update(notes=notes, files=["study.json"] + [p.name for p in copied])
    write_atomic(out / "study.json", json.dumps(figures, indent=1, default=str).encode())
    return figures


def check_limits(out: Path) -> list[str]:
    """Why ``out`` would not come back whole from a device call ([] when it would)."""
    files = [p for p in out.rglob("*") if p.is_file()]
    problems = [f"{len(files)} files, more than {MAX_FILES}"] if len(files) > MAX_FILES else []
    return problems + [f"{p.name} is {p.stat().st_size} bytes" for p in files if p.stat().st_size > MAX_FILE_BYTES]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("gpu_study_collect: usage: gpu_study_collect.py RUN OUT (the study's run folder and the "
              "device call's $OUT)", file=sys.stderr)
        return 2
    run, out = Path(argv[0]), Path(argv[1])
    try:
        figures = collect(run, out)
    except OSError as exc:
        print(f"gpu_study_collect: cannot write into {out} ({exc.strerror or exc}); give a writable OUT",
              file=sys.stderr)
        return 2
    problems = check_limits(out)
    print(json.dumps({"compare": figures["compare"], "notes": figures["notes"], "limits": problems or "ok"},
                     default=str))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
