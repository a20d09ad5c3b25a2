"""Staging: copy or re-shard stores from a shared filesystem to node-local storage, verified.

Following Kurth et al. (2018), every rank reads a disjoint part of the source (no two ranks read
the same bytes from the shared filesystem), with several reader threads so that the latency of
a parallel filesystem is overlapped. Records are copied verbatim (no decode/re-encode), their
checksums verified on read and again in the destination, and records already present in the
destination are skipped, so an interrupted staging run resumes where it stopped.

Layout of the destination:
* ``world_size == 1``: the source layout is mirrored (a store -> ``dst`` itself is the store; a
  data dir of stores -> ``dst/<the same relative paths>``).
* ``world_size > 1``: rank r writes one store ``dst/shard-<r>-of-<world_size>`` holding every
  world_size-th sample, from the r-th, of the source samples ordered by split, store and sample
  id: disjoint shards with equal counts of each split to within one.
"""
from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from namsa.errors import UserError

from .codec import array_layout, decode_record
from .config import DataConfig, expand_path
from .errors import CorruptRecordError, EmptyStoreError, SchemaError
from .layout import expand_store_paths, is_store
from .reader import StoreReader
from .splits import SPLITS
from .writer import StoreWriter


@dataclass
class StageReport:
    """What a staging run did. ``ok`` is False if any source record was corrupt (not copied) or
    a copied record failed verification in the destination."""

    destinations: list[Path] = field(default_factory=list)
    copied: int = 0
    skipped: int = 0
    bytes_copied: int = 0
    seconds: float = 0.0
    corrupt: list[str] = field(default_factory=list)
    failed_verify: list[str] = field(default_factory=list)

    def add(self, other: "StageReport") -> None:
        """Fold another run's report into this one (destinations and problems listed, counts summed)."""
        self.destinations += other.destinations
        self.corrupt += other.corrupt
        self.failed_verify += other.failed_verify
        self.copied += other.copied
        self.skipped += other.skipped
        self.bytes_copied += other.bytes_copied
        self.seconds += other.seconds

    @property
    def ok(self) -> bool:
        return not self.corrupt and not self.failed_verify

    def text(self) -> str:
        rate = self.bytes_copied / max(self.seconds, 1e-9) / 1e9
        lines = [f"staged into {', '.join(str(d) for d in self.destinations)}",
                 f"  copied {self.copied} samples ({self.bytes_copied / 1e9:.3f} GB, {rate:.2f} GB/s), "
                 f"skipped {self.skipped} already present, {self.seconds:.1f} s"]
        if self.corrupt:
            lines.append(f"  NOT copied, corrupt in the source: {', '.join(self.corrupt)}")
        if self.failed_verify:
            lines.append(f"  FAILED verification in the destination: {', '.join(self.failed_verify)}")
        lines.append("  OK" if self.ok else "  PROBLEMS: see above")
        return "\n".join(lines)


def _plan(src: Path, dst: Path, rank: int, world_size: int, readers: list[StoreReader]
          ) -> list[tuple[Path, list[tuple[StoreReader, int]]]]:
    """(destination store, [(source reader, index)]) for this rank."""
    if world_size == 1:
        plan = []
        for r in readers:
            target = dst if is_store(src) else dst / r.path.relative_to(src)
            plan.append((target, [(r, i) for i in range(len(r))]))
        return plan
    # Every world_size-th sample of each split in turn: the ranks' shards then hold equal numbers
    # of train (and dev, test) samples to within one, so training, which runs every rank for the
    # smallest shard's count, drops at most one sample per rank. (Contiguous blocks of the id-sorted
    # samples gave 2 and 6 training samples to two ranks of the tiny test set.)
    items = [(r, i) for split in SPLITS for r in readers for i in r.indices(split)]
    return [(dst / f"shard-{rank:05d}-of-{world_size:05d}", items[rank::world_size])]


def _writer_for(target: Path, readers: list[StoreReader]) -> StoreWriter:
    info = readers[0].info
    for r in readers[1:]:
        for key in ("config_hash", "cbed_dtype", "split_fractions", "split_seed"):
            if r.info.get(key) != info.get(key):
                raise SchemaError(f"cannot re-shard {readers[0].path} and {r.path} into one store: their "
                                  f"{key} differ; stage stores of one configuration together")
    cfg = DataConfig(cbed_dtype=info["cbed_dtype"], compression=info.get("compression") or "none",
                     split_fractions=tuple(info["split_fractions"]), split_seed=info["split_seed"],
                     split_by=info.get("split_by", "material"))
    return StoreWriter(target, config_hash=info["config_hash"], data_cfg=cfg)


def stage_store(src: str | os.PathLike, dst: str | os.PathLike, *, threads: int = 4, rank: int = 0,
                world_size: int = 1, verify: bool = True, progress: bool = True) -> StageReport:
    """Copy (``world_size == 1``) or re-shard the store(s) at ``src`` into ``dst``; see the module doc.

    ``threads`` reader threads fetch records ahead of the single LMDB writer; ``verify`` re-reads
    every copied record from ``dst`` and checks its checksum. Returns a `StageReport`.
    """
    if threads < 1:
        raise UserError(f"threads must be >= 1, got {threads}")
    if not 0 <= rank < world_size:
        raise UserError(f"rank {rank} is outside world_size {world_size}")
    src, dst = Path(src), Path(dst)
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents:
        raise UserError(f"staging destination {dst} lies inside the source {src}; choose a separate directory")
    readers = [StoreReader(p, verify=True, allow_empty=True) for p in expand_store_paths(src)]
    if not any(len(r) for r in readers):
        for r in readers:
            r.close()
        raise EmptyStoreError(f"{src} holds no samples (a store whose writer was killed before its first sample "
                              f"is empty); run namsa simulate into it first, then stage it")
    report = StageReport()
    start = time.perf_counter()
    plan = _plan(src, dst, rank, world_size, readers)
    total = sum(len(items) for _, items in plan)
    with _progress_bar(total, progress) as bar:
        for target, items in plan:
            if not items and world_size == 1:
                continue
            # an empty shard takes its settings from a store that has some (an empty one may have none)
            sources = (sorted({id(r): r for r, _ in items}.values(), key=lambda r: str(r.path))
                       or [r for r in readers if len(r)][:1])
            with _writer_for(target, sources) as writer:
                copied_here = _copy(items, writer, threads, report, bar)
            report.destinations.append(target)
            if verify and copied_here:
                report.failed_verify += _verify_copied(target, copied_here)
    report.seconds = time.perf_counter() - start
    for r in readers:
        r.close()
    return report


def stage_rank_shard(sources: list[Path], root: str | os.PathLike, data_hash: str, *, rank: int = 0,
                     world_size: int = 1, threads: int = 4) -> StageReport:
    """Stage this rank's shard of every data dir in ``sources`` under node-local ``root``; the
    report's ``destinations`` are the staged stores, the only ones the rank then reads (training's
    ``data.node_local_dir``), its counts summed over the data dirs.

    ``root`` may name environment variables (``$TMPDIR``). Each data dir i goes to
    ``root/namsa-staged-<data_hash[:12]>/data<i>`` (the rank's ``shard-r-of-P`` store there, or a
    mirror with one rank), so another dataset never mixes in and a restarted job finds its copy:
    records already staged are skipped, the rest copied and verified. Raises `UserError` naming
    what is wrong if a source record is corrupt or a copy fails verification."""
    base = expand_path(str(root), "data.node_local_dir") / f"namsa-staged-{data_hash[:12]}"
    total = StageReport()
    for i, src in enumerate(sources):
        report = stage_store(src, base / f"data{i}", threads=threads, rank=rank, world_size=world_size,
                             progress=False)
        if not report.ok:
            bad = report.corrupt + report.failed_verify
            raise UserError(f"rank {rank}: staging {src} into {base / f'data{i}'} found {len(bad)} bad record(s) "
                            f"({', '.join(bad[:3])}); re-simulate or remove them, then rerun (staged records are kept)")
        total.add(report)
    return total


def _copy(items: list[tuple[StoreReader, int]], writer: StoreWriter, threads: int, report: StageReport,
          bar: Any) -> list[str]:
    """Copy the missing records of ``items`` into ``writer``; returns the ids copied."""
    todo = []
    for reader, i in items:
        if writer.has(reader.ids()[i]):
            report.skipped += 1
            bar.update(1)
        else:
            todo.append((reader, i))
    # At most `threads` records in flight: records can be 512 MiB each, memory stays bounded.
    copied: list[str] = []
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="stage-read") as pool:
        pending: deque[tuple[str, Future]] = deque()
        for reader, i in todo:
            pending.append((reader.ids()[i], pool.submit(reader.read_raw, i, True)))
            if len(pending) >= threads:
                copied += _drain_one(pending, writer, report, bar)
        while pending:
            copied += _drain_one(pending, writer, report, bar)
    return copied


def _drain_one(pending: deque, writer: StoreWriter, report: StageReport, bar: Any) -> list[str]:
    """Write the oldest fetched record (in source order); returns [its id] if it was copied."""
    sid, future = pending.popleft()
    bar.update(1)
    try:
        record, entry = future.result()
    except CorruptRecordError as exc:
        report.corrupt.append(f"{exc.store}:{exc.key}")
        return []
    if not writer.put_record(sid, record, entry, _record_arrays(record)):
        return []
    report.copied += 1
    report.bytes_copied += len(record)
    return [sid]


def _record_arrays(record: bytes | bytearray) -> dict[str, dict[str, Any]]:
    """Array names/dtypes/shapes/scales of a sealed record, from its header."""
    return array_layout(decode_record(record, verify=False, names=()).header)


def _verify_copied(target: Path, ids: list[str]) -> list[str]:
    with StoreReader(target, verify=True) as reader:
        wanted = set(ids)
        bad = []
        for i, sid in enumerate(reader.ids()):
            if sid in wanted:
                try:
                    reader.read_raw(i, verify=True)
                except CorruptRecordError:
                    bad.append(f"{target}:{sid}")
        return bad


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="sample", desc="staging", dynamic_ncols=True)
