"""Stage runners: plain functions that the `namsa` CLI and the Parsl apps of the DAG both call.

Each runner does one stage on this machine, prints a progress bar when asked, and returns a small
summary object. Heavy imports (torch, the multislice code) happen inside the runners so that
`namsa --help` and the Parsl driver stay light.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from namsa.errors import UserError

if TYPE_CHECKING:  # the config pulls in torch (models); simulation workers must not pay for it
    from namsa import SimulationConfig
    from stage import DataConfig

    from .config import PipelineConfig

#: Set on Ctrl-C by the DAG: simulation loops finish the sample in hand, close their store
#: (manifest written) and return, so everything written so far stays usable.
STOP = threading.Event()

#: summary of a finished training run, written in its output directory (the DAG's "done" marker).
TRAIN_SUMMARY = "train-summary.json"
#: summary of a finished evaluation, written beside metrics.json.
EVAL_SUMMARY = "eval-summary.json"
#: what `namsa evaluate` writes into --out: an --out holding anything else is refused, never replaced
EVAL_OUTPUTS = frozenset({"metrics.json", "report.html", "figures", EVAL_SUMMARY})


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, for failure records."""
    text = " ".join(str(exc).split()) or "(no message)"
    return text if isinstance(exc, UserError) else f"{type(exc).__name__}: {text}"


def write_json_atomic(path: str | Path, payload: Any) -> None:
    """Write JSON through a temporary file so a kill never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    tmp.replace(path)


def progress_bar(total: int, desc: str, unit: str, enabled: bool):
    """A tqdm bar on stderr (rate shown as <unit>/s); silent when ``enabled`` is False."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr,
                dynamic_ncols=True, smoothing=0.1)


def tqdm_write(text: str) -> None:
    """Print a line without breaking a progress bar that is on screen."""
    from tqdm import tqdm

    tqdm.write(text, file=sys.stderr)


# --------------------------------------------------------------------------------------------
# simulate


@dataclass
class SimulateSummary:
    """What one simulation worker did. ``failed`` holds (sample or material id, one-line reason)."""

    store: str
    planned: int
    written: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    started_at: float = 0.0
    finished_at: float = 0.0
    stopped: bool = False

    @property
    def seconds(self) -> float:
        return max(self.finished_at - self.started_at, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> "SimulateSummary":
        known = {f.name for f in fields(cls)}
        kept = {k: v for k, v in payload.items() if k in known}
        kept["failed"] = [tuple(f) for f in kept.get("failed", [])]
        return cls(**kept)

    def line(self) -> str:
        rate = self.written / self.seconds if self.seconds > 0 else 0.0
        text = (f"{self.store}: {self.written} written, {self.skipped} already stored, "
                f"{len(self.failed)} failed in {self.seconds:.1f} s ({rate:.2f} samples/s)")
        return text + (" [stopped early: rerun to finish]" if self.stopped else "")


def spec_key(spec: Any) -> list:
    """A JSON-able key of a SampleSpec: [material_id, [u, v, w], variant] (Parsl can hash it)."""
    return [spec.material_id, [int(i) for i in spec.zone_axis], int(spec.variant)]


def spec_from_key(key: Sequence[Any]) -> Any:
    """The SampleSpec named by `spec_key`."""
    import namsa

    material_id, axis, variant = key
    return namsa.SampleSpec(material_id, tuple(int(i) for i in axis), int(variant))


def plan(cfg: "PipelineConfig"):
    """`namsa.plan_samples` over the config's simulation section; an empty plan is bad input."""
    import namsa

    planned = namsa.plan_samples(cfg.simulation)
    if not planned.specs and not planned.failures:
        where = f"and {cfg.simulation.cif_dir} holds no .cif file" if cfg.simulation.cif_dir else "and no cif_dir is set"
        raise UserError(f"nothing to simulate: simulation.materials is empty {where}; list library ids in "
                        f"simulation.materials or point simulation.cif_dir at a folder of CIF files")
    return planned


def stored_ids(data_dir: str | Path) -> set[str]:
    """Ids of every sample in every store below ``data_dir`` (the LMDB records are the truth)."""
    import stage

    data_dir = Path(data_dir)
    if not data_dir.exists():
        return set()
    ids: set[str] = set()
    for path in stage.find_stores(data_dir):
        with stage.open_store(path, allow_empty=True) as reader:
            ids.update(reader.ids())
    return ids


def simulate_specs(sim_cfg: "SimulationConfig", data_cfg: "DataConfig", store_dir: str | Path, specs: Sequence[Any],
                   sources: Mapping[str, str], *, progress: bool = True, progress_path: str | Path | None = None,
                   stop: threading.Event = STOP) -> SimulateSummary:
    """Simulate ``specs`` (namsa SampleSpecs) into the single store ``store_dir`` (one writer = one
    store); ``sources`` maps each material id to what `namsa.simulate_sample` loads (`Plan.sources`).

    Exactly once per data directory (``store_dir``'s parent): ids already in this store are
    skipped, and every other id is claimed (`stage.claims.ClaimBook`) before it is simulated, so a
    sample stored or being written by another store of the data directory is skipped too. When
    another live writer holds ``store_dir`` itself, the next free name (``store-000-1``, ...) is
    used: a lock clash is never a sample failure. A sample whose simulation raises is recorded in
    ``failed`` with a one-line reason and skipped (a store failure, e.g. a full disk, is not a
    sample failure and propagates). ``progress_path`` gets a small JSON after every sample so a
    driver can show live progress across processes.
    """
    summary = SimulateSummary(store=str(store_dir), planned=len(specs), started_at=time.time())
    if progress_path is not None:  # marks the task as started for a watching driver
        write_json_atomic(progress_path, summary.to_dict())
    if not specs:  # nothing to do: do not create an empty store
        summary.finished_at = time.time()
        return summary
    from .plansize import check_disk

    check_disk(sim_cfg, data_cfg, len(specs), store_dir)   # a full disk is found now, not at sample 9000
    with open_free_writer(store_dir, sim_cfg.physics_hash(), data_cfg) as writer, \
            progress_bar(len(specs), Path(store_dir).name, "sample", progress) as bar:
        summary.store = str(writer.path)
        _simulate_into(writer, sim_cfg, specs, sources, summary, bar, progress_path, stop)
    summary.finished_at = time.time()
    if progress_path is not None:
        write_json_atomic(progress_path, summary.to_dict())
    return summary


#: how many other names (store-000-1, store-000-2, ...) a writer tries when its store is busy
FREE_STORE_TRIES = 64


def open_free_writer(store_dir: str | Path, physics_hash: str, data_cfg: "DataConfig") -> Any:
    """A `stage.StoreWriter` on ``store_dir``, or, while another live writer holds it, on the first
    free ``<store_dir>-<k>`` (each writer its own store; the claims keep samples exactly once)."""
    import stage

    store_dir = Path(store_dir)
    for k in range(FREE_STORE_TRIES + 1):
        path = store_dir if k == 0 else store_dir.with_name(f"{store_dir.name}-{k}")
        try:
            return stage.StoreWriter(path, config_hash=physics_hash, data_cfg=data_cfg)
        except stage.StoreLockedError:
            continue
    raise stage.StoreLockedError(f"{store_dir} and {FREE_STORE_TRIES} alternatives beside it are all held by "
                                 f"live writers; wait for some of them to finish and run again")


def _simulate_into(writer: Any, sim_cfg: "SimulationConfig", specs: Sequence[Any], sources: Mapping[str, str],
                   summary: SimulateSummary, bar: Any, progress_path: str | Path | None,
                   stop: threading.Event) -> None:
    """The sample loop of `simulate_specs`: claim, simulate, store, mark stored."""
    import namsa
    import stage
    from stage.claims import ClaimBook

    claims = ClaimBook(writer.path)
    for spec in specs:
        if stop.is_set():
            summary.stopped = True
            break
        sid = spec.sample_id(sim_cfg)
        if writer.has(sid) or claims.claim(sid) is not None:
            summary.skipped += 1  # stored here, or stored / being written by another store
        else:
            try:
                sample = namsa.simulate_sample(sources[spec.material_id], tuple(spec.zone_axis),
                                               sim_cfg, variant=spec.variant)
                writer.put(sample)
                claims.stored(sid)
                summary.written += 1
            except stage.StoreError:
                raise
            except Exception as exc:  # one bad structure must not stop the others
                summary.failed.append((sid, one_line(exc)))
        bar.update(1)
        bar.set_postfix(written=summary.written, failed=len(summary.failed), refresh=False)
        if progress_path is not None:
            summary.finished_at = time.time()
            write_json_atomic(progress_path, summary.to_dict())


def simulate(cfg: "PipelineConfig", out_dir: str | Path, *, worker: int = 0, num_workers: int = 1,
             progress: bool = True) -> SimulateSummary:
    """`namsa simulate`: plan the dataset, take every ``num_workers``-th sample starting at
    ``worker``, and write them into ``<out_dir>/store-<worker>`` (or the next free
    ``store-<worker>-<k>`` while another live writer holds it; see `simulate_specs`).

    Samples already in any store below ``out_dir`` are skipped, so a rerun (even with another
    worker count) only simulates what is missing. Materials that fail to load are listed in the
    summary of worker 0. The summary is also written to ``<out_dir>/simulate-<worker>.json``.
    """
    if not 0 <= worker < num_workers:
        raise UserError(f"--worker {worker} must be in [0, --of {num_workers}); number workers from 0")
    out_dir = Path(out_dir)
    planned = plan(cfg)
    done = stored_ids(out_dir)
    mine = planned.specs[worker::num_workers]
    todo = [s for s in mine if s.sample_id(cfg.simulation) not in done]
    if todo:
        from .memory import check_fits

        check_fits(cfg.simulation)
    summary = simulate_specs(cfg.simulation, cfg.data, out_dir / f"store-{worker:03d}", todo, planned.sources,
                             progress=progress)
    summary.skipped += len(mine) - len(todo)
    summary.planned = len(mine)
    if worker == 0:
        summary.failed = [(mid, reason) for mid, reason in planned.failures] + summary.failed
    write_json_atomic(out_dir / f"simulate-{worker:03d}.json", summary.to_dict())
    return summary


# --------------------------------------------------------------------------------------------
# stage / inspect


def stage_data(src: str | Path, dst: str | Path, *, threads: int = 4, rank: int = 0, world_size: int = 1,
               verify: bool = True, progress: bool = True) -> Any:
    """`namsa stage`: copy (or re-shard for ``rank`` of ``world_size``) the stores at ``src`` into
    ``dst`` and verify every copied record (`stage.stage_store`); returns its report (``.ok``, ``.text()``)."""
    import stage

    return stage.stage_store(src, dst, threads=threads, rank=rank, world_size=world_size, verify=verify,
                             progress=progress)


def inspect(path: str | Path, verify: bool = False) -> Any:
    """`namsa inspect`: what a store (or a data dir of stores) holds; ``verify`` checks every checksum.
    Returns `stage.inspect_store`'s report (``.ok``, ``.text()``)."""
    import stage

    return stage.inspect_store(path, verify=verify)


# --------------------------------------------------------------------------------------------
# train / evaluate / scaling


def require_directory(path: str | Path, flag: str = "--out") -> Path:
    """``path`` as an output directory: absent (it will be made) or a directory, never a file."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file, not a directory; choose a directory")
    # Made now: an unwritable place (under a file, read-only, full) is found before any work,
    # as an OSError that the CLI turns into one line.
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_fingerprint(data_dirs: Iterable[str | Path]) -> str:
    """sha256 over the sorted sample ids below ``data_dirs``: changes whenever the data set does."""
    ids: set[str] = set()
    for d in data_dirs:
        ids |= stored_ids(d)
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()


def section_hash(cfg: "PipelineConfig", *sections: str) -> str:
    """sha256 over the named config sections (what decides whether earlier results still hold)."""
    payload = {name: getattr(cfg, name).model_dump(mode="json") for name in sections}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


TRAIN_SECTIONS = ("simulation", "data", "model", "training", "distributed")
EVAL_SECTIONS = TRAIN_SECTIONS + ("evaluation",)


def train(cfg: "PipelineConfig", data_dirs: Sequence[str | Path], out_dir: str | Path, *,
          resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """`namsa train`: `models.train` on the stores below ``data_dirs`` into ``out_dir`` (a run
    directory: checkpoints/, model/, metrics.csv); writes ``out_dir/train-summary.json``.

    The summary records the data fingerprint and config hash the model was trained on, which is
    how the DAG knows a finished training need not run again.
    """
    import models

    require_directory(out_dir)
    started = time.time()
    training = cfg.training if progress else cfg.training.model_copy(update={"progress": False})
    result = models.train(cfg.model, training, cfg.distributed, cfg.data, list(data_dirs), out_dir,
                          resume=resume)
    summary = {
        "model_dir": str(result.model_dir),
        "best_checkpoint": None if result.best_checkpoint is None else str(result.best_checkpoint),
        "metrics_csv": str(result.metrics_csv), "steps": int(result.steps),
        "final_dev_loss": None if result.final_dev_loss is None else float(result.final_dev_loss),
        "data_fingerprint": data_fingerprint(data_dirs), "config_hash": section_hash(cfg, *TRAIN_SECTIONS),
        "started_at": started, "finished_at": time.time(),
    }
    if _is_main_rank():
        write_json_atomic(Path(out_dir) / TRAIN_SUMMARY, summary)
    return summary


def _is_main_rank() -> bool:
    """Rank 0 of a torchrun / MPI / Slurm launch (or a single process) writes shared summaries."""
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name]) == 0
    return True


def evaluate(cfg: "PipelineConfig", data_dirs: Sequence[str | Path], model_dir: str | Path,
             out_dir: str | Path, *, train_metrics_csv: str | Path | None = None) -> dict[str, Any]:
    """`namsa evaluate`: `models.evaluation.evaluate`; writes ``eval-summary.json`` beside metrics.json."""
    from models.evaluation import evaluate as run_evaluation
    from .replace_out import replaced_atomically

    out = require_directory(out_dir)
    started = time.time()
    # Written into a sibling and swapped in whole: a kill leaves the earlier result or this one.
    with replaced_atomically(out, EVAL_OUTPUTS.__contains__) as staging:
        result = run_evaluation(cfg.evaluation, cfg.data, list(data_dirs), model_dir, staging,
                                train_metrics_csv=train_metrics_csv)

        def final(path: Path) -> str:
            return str(out / Path(path).relative_to(staging))

        summary = {
            "metrics_json": final(result.metrics_json), "report_html": final(result.report_html),
            "figures": [final(f) for f in result.figures], "headline": result.headline,
            "verdicts": result.verdicts, "compute_seconds": result.compute_seconds,
            "n_samples": result.n_samples, "model_dir": str(model_dir),
            "data_fingerprint": data_fingerprint(data_dirs), "config_hash": section_hash(cfg, *EVAL_SECTIONS),
            "started_at": started, "finished_at": time.time(),
        }
        write_json_atomic(staging / EVAL_SUMMARY, summary)
    return summary


def scaling(cfg: "PipelineConfig", data_dirs: Sequence[str | Path], out_dir: str | Path,
            fractions: Sequence[float] = (0.125, 0.25, 0.5, 1.0), metric: str = "rel_l2",
            progress: bool = True) -> dict[str, Any]:
    """`namsa scaling`: train on growing subsets and plot the error against the training-set size."""
    from models.evaluation import scaling_study

    require_directory(out_dir)
    training = cfg.training if progress else cfg.training.model_copy(update={"progress": False})
    return scaling_study(cfg.model, training, cfg.distributed, cfg.data, cfg.evaluation,
                         list(data_dirs), out_dir, fractions=fractions, metric=metric)


# --------------------------------------------------------------------------------------------
# reconstruct an experimental file


def reconstruct(path: str | Path, model: str | Path, out_dir: str | Path, *,
                calibrations: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`namsa reconstruct`: a 4D-STEM file -> the model's maps and the iCoM map in ``out_dir``.

    calibrations: energy_kv (kV), semiangle_mrad (mrad), dk_inv_A (1/Angstrom) or dk_mrad (mrad)
    per detector pixel, step_A (Angstrom per scan step); None entries are read from the file
    (models.experimental). Maps are [row = y, col = x], pixel (0, 0) at the first probe position.
    Returns a summary: the files written, the pixel size (Angstrom) and what was resampled.

    Everything is written into a temporary sibling of ``out_dir`` that then replaces it as a whole
    (workflow.replace_out), so a kill leaves the earlier result or the new one, never a mix.
    """
    from models import experimental as ex

    from .replace_out import discard, start_replacing

    out = require_directory(out_dir)
    tmp = start_replacing(out, ex.is_output_name)  # refuses an unwritable --out before any work
    try:
        return _reconstruct_into(tmp, out, path, model, calibrations or {})
    except BaseException:
        discard(tmp)
        raise


def _reconstruct_into(tmp: Path, out: Path, path: str | Path, model: str | Path,
                      calibrations: Mapping[str, Any]) -> dict[str, Any]:
    """The work of `reconstruct`: read, check, predict, write into ``tmp``, swap it into ``out``."""
    from models import experimental as ex
    from models import load_reconstructor
    from namsa.icom import icom_reconstruct

    scan = ex.read_scan(path)
    cal = ex.resolve_calibrations(scan.found, calibrations)
    rec = load_reconstructor(model)
    ex.check_map_names(rec.targets)  # the card's targets become file names
    expect = ex.model_expectation(rec.card)
    prepared = ex.fit_to_model(scan, cal, expect)
    stitched = ex.stitch(rec.predict(prepared.cbed), prepared.tiles)
    (ty, tx), (sy, sx) = prepared.tiles, prepared.scan_shape
    t_y, t_x = stitched.shape[1] // ty, stitched.shape[2] // tx
    pixel = (sy * prepared.step_A[0] / t_y, sx * prepared.step_A[1] / t_x)
    maps = dict(zip(rec.targets, stitched))
    maps["icom_potential"] = icom_reconstruct(
        ex.scan_block(prepared), (ty * sy, tx * sx), k_sampling_invA=prepared.dk_inv_A, energy_kv=cal.energy_kv,
        scan_step_A=prepared.step_A, output_shape=stitched.shape[1:], periodic=False).astype("float32")
    info = _reconstruct_info(path, model, cal, expect, prepared)
    written = _write_and_swap(ex, tmp, out, maps, pixel, info)
    return {"out": str(out), "files": written, "pixel_size_A": pixel, "shape": list(stitched.shape[1:]),
            "notes": prepared.notes}


def _write_and_swap(ex: Any, tmp: Path, out: Path, maps: Mapping[str, Any], pixel: tuple[float, float],
                    info: Mapping[str, Any]) -> dict[str, str]:
    """Write the maps into ``tmp`` and swap it into the place of ``out``; a failed write (disk full,
    file too large, permission) is one line and leaves the earlier result in ``out`` as it was."""
    from .replace_out import finish_replacing

    try:
        files = ex.write_maps(tmp, maps, pixel, info)
        finish_replacing(tmp, out)
    except OSError as exc:
        raise UserError(f"writing the maps into --out {out} failed ({exc.strerror or exc}); free some space or "
                        "choose another --out (an earlier result there is unchanged)") from None
    return {name: str(out / Path(p).name) for name, p in files.items()}


def _reconstruct_info(path: str | Path, model: str | Path, cal: Any, expect: Any, prepared: Any) -> dict[str, Any]:
    """The JSON record of a reconstruction: inputs, calibrations and their sources, resampling."""
    units = {"energy_kv": "kV", "semiangle_mrad": "mrad", "dk_inv_A": "1/Angstrom per detector pixel",
             "step_A": "Angstrom per scan step [y, x]"}
    return {
        "file": str(path), "model": str(model),
        "calibrations": {name: {"value": getattr(cal, name), "unit": unit, "source": cal.sources.get(name)}
                         for name, unit in units.items()},
        "model_expects": {"energy_kv": expect.energy_kv, "semiangle_mrad": expect.semiangle_mrad,
                          "scan_shape": list(expect.scan_shape), "dk_range_inv_A": list(expect.dk_range_inv_A),
                          "scan_step_range_A": list(expect.step_range_A), "source": expect.source},
        "sampling_used": {"dk_inv_A": prepared.dk_inv_A, "scan_step_A": list(prepared.step_A),
                          "tiles": list(prepared.tiles), "intensity_scale": prepared.intensity_scale},
        "resampling": prepared.notes or ["none: the file's sampling is the model's"],
    }
