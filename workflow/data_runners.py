"""Stage runners for the data: `namsa simulate` (plan, claim, simulate into one store per writer),
`namsa stage` and `namsa inspect`; plain functions that the CLI and the Parsl apps both call.

Heavy imports (the multislice code, stage) happen inside the runners so that `namsa --help` and
the Parsl driver stay light.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from namsa.errors import RunError, UserError

from .runner_io import one_line, progress_bar, write_summary_json

if TYPE_CHECKING:  # the config pulls in torch (models); simulation workers must not pay for it
    from namsa import SimulationConfig
    from stage import DataConfig

    from .config import PipelineConfig

#: Set on Ctrl-C by the DAG: simulation loops finish the sample in hand, close their store
#: (manifest written) and return, so everything written so far stays usable.
STOP = threading.Event()


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
    #: stopped by execution.simulate_deadline_s: the samples not reached are not failures
    deadline_reached: bool = False

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
        if self.deadline_reached:
            return text + " [stopped at the deadline: rerun to finish]"
        return text + (" [stopped early: rerun to finish]" if self.stopped else "")

    @property
    def not_reached(self) -> int:
        """Planned samples this worker never came to (a stop or the deadline): not failures."""
        return max(self.planned - self.written - self.skipped - len(self.failed), 0)


def spec_key(spec: Any) -> list:
    """A JSON-able key of a SampleSpec: [material_id, [u, v, w], variant] (Parsl can hash it)."""
    return [spec.material_id, [int(i) for i in spec.zone_axis], int(spec.variant)]


def spec_from_key(key: Sequence[Any]) -> Any:
    """The SampleSpec named by `spec_key`."""
    import namsa

    material_id, axis, variant = key
    return namsa.SampleSpec(material_id, tuple(int(i) for i in axis), int(variant))


def worker_share(specs: Sequence[Any], worker: int, num_workers: int) -> list[Any]:
    """Worker ``worker``'s share of ``specs`` (of ``num_workers``): every ``num_workers``-th spec of their
    `interleaved` order. What a deadline leaves, the first samples of every worker together, then spans
    as many structure types as samples; slices of the plan's own order each began with the same few
    (16 workers stopped at 252 samples of the GPU study held 4 dev samples: RESULTS.md, the second device run)."""
    return interleaved(specs)[worker::num_workers]


def interleaved(specs: Sequence[Any]) -> list[Any]:
    """``specs`` reordered round-robin over their templates (a generated material's template, any other
    material itself: `namsa.material_id.template_of`), each template's own order kept: a prefix of the
    result, what a deadline leaves, spans the structure types instead of the first materials of the plan."""
    from namsa.material_id import template_of

    groups: dict[str, list[Any]] = {}
    for spec in specs:
        groups.setdefault(template_of(spec.material_id), []).append(spec)
    queues = list(groups.values())
    return [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]


def plan(cfg: "PipelineConfig"):
    """`namsa.plan_samples` over the config's simulation section, or the plan kept in
    execution.plan_cache_dir (`workflow.plan_cache`); an empty plan is bad input."""
    from .plan_cache import cached_plan

    planned, read_from = cached_plan(cfg.simulation, cfg.execution.plan_cache_dir)
    if read_from is not None:
        print(f"namsa: the plan ({len(planned.specs)} samples) read from {read_from}", file=sys.stderr)
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


def check_same_physics(data_dir: str | Path, physics_hash: str) -> None:
    """Refuse, before any simulation, a data directory whose stores hold samples of other physics
    (another simulation section, or a namsa whose physics or targets changed since, such as the
    Gaussian targets of 2026-11-24): new samples could never join those stores."""
    import stage

    data_dir = Path(data_dir)
    if not data_dir.exists():
        return
    for path in stage.find_stores(data_dir):
        with stage.open_store(path, allow_empty=True) as reader:
            found = reader.info.get("config_hash")
            version = reader.info.get("code_version", "?")
            empty = len(reader) == 0
        # an empty store (its writer killed before its info record or its first sample) holds no
        # physics: its writer adopts it on the rerun (stage.StoreWriter)
        if found != physics_hash and not empty:
            raise UserError(f"{data_dir} holds samples of other physics (store {Path(path).name}: config hash "
                            f"{str(found)[:12]}, written by namsa {version}; this config gives {physics_hash[:12]}): "
                            f"the simulation section or namsa's physics changed; use a new --out, or delete "
                            f"{data_dir} to simulate again")


def simulate_specs(sim_cfg: "SimulationConfig", data_cfg: "DataConfig", store_dir: str | Path, specs: Sequence[Any],
                   sources: Mapping[str, str], *, progress: bool = True, progress_path: str | Path | None = None,
                   stop: threading.Event = STOP, deadline_at: float | None = None) -> SimulateSummary:
    """Simulate ``specs`` (namsa SampleSpecs) into the single store ``store_dir`` (one writer = one
    store); ``sources`` maps each material id to what `namsa.simulate_sample` loads (`Plan.sources`).

    Exactly once per data directory (``store_dir``'s parent): ids already in this store are
    skipped, and every other id is claimed (`stage.claims.ClaimBook`) before it is simulated, so a
    sample stored or being written by another store of the data directory is skipped too. When
    another live writer holds ``store_dir`` itself, the next free name (``store-000-1``, ...) is
    used: a lock clash is never a sample failure. A sample whose simulation raises is recorded in
    ``failed`` with a one-line reason and skipped (a store failure, e.g. a full disk, is not a
    sample failure and propagates). A store that ends up holding no sample (every id of its share
    stored by another writer, or failed) is removed, not left EMPTY. ``progress_path`` gets a small
    JSON after every sample so a driver can show live progress across processes. ``deadline_at`` (epoch seconds): no sample is
    started after it, and ``specs`` are taken in `interleaved` order so that what is done by then
    spans the materials.
    """
    summary = SimulateSummary(store=str(store_dir), planned=len(specs), started_at=time.time())
    if deadline_at is not None:
        specs = interleaved(specs)
    if progress_path is not None:  # marks the task as started for a watching driver
        write_summary_json(progress_path, summary.to_dict())
    if not specs:  # nothing to do: do not create an empty store
        summary.finished_at = time.time()
        return summary
    from .plansize import check_disk

    check_disk(sim_cfg, data_cfg, len(specs), store_dir)   # a full disk is found now, not at sample 9000
    writer = open_free_writer(store_dir, sim_cfg.physics_hash(), data_cfg)
    summary.store = str(writer.path)
    try:
        with progress_bar(len(specs), Path(store_dir).name, "sample", progress) as bar:
            _simulate_into(writer, sim_cfg, specs, sources, summary, bar, progress_path, stop, deadline_at)
    except BaseException:
        writer.close()
        raise
    if writer.close_removing_if_empty():  # its whole share was stored by other writers (or failed)
        summary.store += " (removed: it stored no sample)"
    summary.finished_at = time.time()
    if progress_path is not None:
        write_summary_json(progress_path, summary.to_dict())
    return summary


def release_device_pools() -> None:
    """Give the GPU memory cupy keeps cached in this process back to the driver (its default
    device pool and its pinned host pool). A Parsl worker outlives its simulation task, and a
    training job that starts next on the same GPUs would otherwise find that memory taken. A
    no-op where cupy was never imported (a CPU simulation never touches it)."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()


#: how many other names (store-000-1, store-000-2, ...) a writer tries when its store is busy
FREE_STORE_TRIES = 64


def open_free_writer(store_dir: str | Path, physics_hash: str, data_cfg: "DataConfig") -> Any:
    """A `stage.StoreWriter` on ``store_dir``, or, while another live writer holds it, on the first
    free ``<store_dir>-<k>`` (each writer its own store; the claims keep samples exactly once)."""
    import stage

    store_dir = Path(store_dir)
    for k in range(FREE_STORE_TRIES + 1):
        path = store_dir if k == 0 else store_dir.with_name(f"{store_dir.name}-{k}")
        if path.is_symlink():   # a received --out must not write through a link into someone else's folder
            raise stage.StoreError(f"{path} is a symbolic link (to {os.readlink(path)}); namsa writes a store only "
                                   "into a real directory inside --out: remove the link or choose another --out")
        try:
            return stage.StoreWriter(path, config_hash=physics_hash, data_cfg=data_cfg)
        except stage.StoreLockedError:
            continue
    raise stage.StoreLockedError(f"{store_dir} and {FREE_STORE_TRIES} alternatives beside it are all held by "
                                 f"live writers; wait for some of them to finish and run again")


def _simulate_into(writer: Any, sim_cfg: "SimulationConfig", specs: Sequence[Any], sources: Mapping[str, str],
                   summary: SimulateSummary, bar: Any, progress_path: str | Path | None,
                   stop: threading.Event, deadline_at: float | None = None) -> None:
    """The sample loop of `simulate_specs`: claim, simulate, store. The host phase of
    the next ``sim_cfg.host_threads`` samples runs ahead in a thread pool (`namsa.pipelined`); samples
    are still stored in order, and a sample whose preparation raised is recorded as failed here."""
    from namsa.pipelined import lookahead_threads, prepared_in_order
    from stage.claims import ClaimBook

    from .store_behind import WriteBehind

    claims = ClaimBook(writer.path)
    ids = [spec.sample_id(sim_cfg) for spec in specs]
    jobs = [(sources[spec.material_id], tuple(spec.zone_axis), spec.variant) for spec in specs]
    slots = prepared_in_order(jobs, sim_cfg, wanted=lambda i: not writer.has(ids[i]))
    # with samples prepared ahead (a GPU worker) each store write runs on a thread of its own, beside the next
    # sample's device phase; leaving early (stop, a store error) stops the pool at once and waits for the write
    with contextlib.closing(slots), WriteBehind(writer, summary, behind=lookahead_threads(sim_cfg) > 0) as store:
        _store_in_order(writer, claims, ids, slots, summary, bar, progress_path, stop, deadline_at, store)


def _store_in_order(writer: Any, claims: Any, ids: Sequence[str], slots: Any, summary: SimulateSummary, bar: Any,
                    progress_path: str | Path | None, stop: threading.Event, deadline_at: float | None,
                    store: Any) -> None:
    """Claim, finish (`namsa.pipelined.PreparedSlot.sample`) and store (``store``, a
    `workflow.store_behind.WriteBehind`) each sample in order."""
    import stage

    for sid, slot in zip(ids, slots):
        if stop.is_set() or (deadline_at is not None and time.time() >= deadline_at):
            summary.stopped = True
            summary.deadline_reached = not stop.is_set()
            break
        if writer.has(sid) or claims.claim(sid) is not None:
            slot.discard()
            summary.skipped += 1  # stored here, or stored / being written by another store
        else:
            try:
                store.put(sid, slot.sample())   # counted as written (or failed) when its write has finished
            except (stage.StoreError, RunError):  # the store, the disk or the run failed, not this sample
                raise
            except Exception as exc:  # one bad structure must not stop the others
                summary.failed.append((sid, one_line(exc)))
        bar.update(1)
        bar.set_postfix(written=summary.written, failed=len(summary.failed), refresh=False)
        if progress_path is not None:
            summary.finished_at = time.time()
            write_summary_json(progress_path, summary.to_dict())


def simulate(cfg: "PipelineConfig", out_dir: str | Path, *, worker: int = 0, num_workers: int = 1,
             progress: bool = True) -> SimulateSummary:
    """`namsa simulate`: plan the dataset, take this worker's `worker_share` of it (every
    ``num_workers``-th sample of the plan's `interleaved` order, from ``worker``), and write them
    into ``<out_dir>/store-<worker>`` (or the next free ``store-<worker>-<k>`` while another live
    writer holds it; see `simulate_specs`).

    Samples already in any store below ``out_dir`` are skipped, so a rerun (even with another
    worker count) only simulates what is missing. Materials that fail to load are listed in the
    summary of worker 0. The summary is also written to ``<out_dir>/simulate-<worker>.json``.
    """
    if not 0 <= worker < num_workers:
        raise UserError(f"--worker {worker} must be in [0, --of {num_workers}); number workers from 0")
    started = time.time()   # the deadline counts from here: planning a big plan takes its share
    out_dir = Path(out_dir)
    planned = plan(cfg)
    done = stored_ids(out_dir)
    mine = worker_share(planned.specs, worker, num_workers)
    todo = [s for s in mine if s.sample_id(cfg.simulation) not in done]
    if todo:
        from .memory import check_fits

        check_fits(cfg.simulation)
    deadline_s = cfg.execution.simulate_deadline_s
    summary = simulate_specs(cfg.simulation, cfg.data, out_dir / f"store-{worker:03d}", todo, planned.sources,
                             progress=progress, deadline_at=None if deadline_s is None else started + deadline_s)
    summary.skipped += len(mine) - len(todo)
    summary.planned = len(mine)
    if worker == 0:
        summary.failed = [(mid, reason) for mid, reason in planned.failures] + summary.failed
    write_summary_json(out_dir / f"simulate-{worker:03d}.json", summary.to_dict())
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
