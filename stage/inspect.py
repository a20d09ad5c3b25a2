"""`inspect_store`: what a store (or a data dir of stores) holds, and optionally a full checksum pass."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import NotAStoreError, StoreError, StoreNotFoundError
from .layout import DATA_NAME, find_stores
from .reader import StoreReader
from .writerlock import writer_active


@dataclass
class StoreSummary:
    path: Path
    count: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    materials: int = 0
    arrays: dict[str, Any] = field(default_factory=dict)
    compression: str | None = None
    config_hash: str | None = None
    schema_version: int | None = None
    code_version: str | None = None
    record_bytes: int = 0
    file_bytes: int = 0
    reconciled: bool = False
    verified: bool = False
    corrupt: list[str] = field(default_factory=list)
    error: str | None = None
    ids: list[str] = field(default_factory=list, repr=False)
    #: "pid N on HOST" when a writer has the store open (`stage.writerlock.writer_active`): its samples
    #: are still coming, so an empty store is one being filled, not a killed writer's
    writer: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.corrupt and (self.count > 0 or self.writer is not None)


@dataclass
class InspectReport:
    """Per-store summaries; ``ok`` is True when every store opens, holds samples (or is still being
    written by a live writer) and (when verified) every checksum matches."""

    root: Path
    stores: list[StoreSummary]
    verified: bool

    @property
    def duplicates(self) -> dict[str, list[Path]]:
        """Sample ids stored in more than one store here, each with its stores (training counts
        each once, from the first; a data directory should hold each id once)."""
        where: dict[str, list[Path]] = {}
        for s in self.stores:
            for sid in s.ids:
                where.setdefault(sid, []).append(s.path)
        return {sid: paths for sid, paths in where.items() if len(paths) > 1}

    @property
    def ok(self) -> bool:
        return bool(self.stores) and all(s.ok for s in self.stores) and not self.duplicates

    @property
    def corrupt(self) -> list[str]:
        return [f"{s.path}:{k}" for s in self.stores for k in s.corrupt]

    def require_readable(self) -> None:
        """Raise a one-line `StoreError` when nothing here could be read: no store at all, or
        every store failed to open (the report would hold nothing of what was asked)."""
        if not self.stores:
            raise NotAStoreError(f"{self.root} holds no store (no {DATA_NAME} in it or below it); point at a "
                                 f"store or a data directory written by namsa simulate")
        errors = [s.error for s in self.stores if s.error]
        if len(errors) == len(self.stores):
            raise StoreError(errors[0] if len(errors) == 1 else
                             f"none of the {len(errors)} stores under {self.root} can be read; the first: {errors[0]}")

    def problems(self) -> str:
        """One line naming what is wrong ('' when `ok`)."""
        bad = [s for s in self.stores if not s.ok]
        duplicates = self.duplicates
        if duplicates and not bad:
            sid, paths = next(iter(duplicates.items()))
            return (f"{len(duplicates)} sample id(s) under {self.root} are stored in more than one store (e.g. "
                    f"{sid!r} in {', '.join(p.name for p in paths)}); training counts each once, but delete the "
                    f"extra stores or re-simulate into a fresh directory to keep every id in one store")
        if not bad:
            return ""
        corrupt = sum(len(s.corrupt) for s in bad)
        detail = f"{corrupt} corrupt record(s); " if corrupt else ""
        return (f"problems in {len(bad)} of {len(self.stores)} store(s) under {self.root} ({detail}the first: "
                f"{bad[0].path}); see the report above for each")

    def text(self) -> str:
        lines = [f"{len(self.stores)} store(s) under {self.root}"]
        if not self.stores:
            lines.append("  no store found (a store is a directory holding data.mdb)")
        for s in self.stores:
            lines.append(f"store {s.path}")
            if s.error:
                lines.append(f"  ERROR: {s.error}")
                continue
            split_text = ", ".join(f"{k} {v}" for k, v in s.counts.items())
            lines.append(f"  samples {s.count} ({split_text}) from {s.materials} materials")
            for name, a in sorted(s.arrays.items()):
                lines.append(f"  {name:<9} {a['dtype']:<4} {tuple(a['shape'])}")
            lines.append(f"  records {s.record_bytes / 1e6:.2f} MB, data.mdb {s.file_bytes / 1e6:.2f} MB, "
                         f"compression {s.compression}, schema v{s.schema_version}, code {s.code_version}")
            lines.append(f"  config hash {s.config_hash}")
            if s.reconciled:
                lines.append("  note: manifest.json was behind the LMDB records (rebuilt from them on read)")
            if s.writer is not None:
                lines.append(f"  being written by a live writer ({s.writer}): it may hold more samples when that "
                             "finishes; inspect it again then")
            elif s.count == 0:
                lines.append("  EMPTY: no samples (as a writer killed before its first sample leaves a store; "
                             "namsa simulate on its data directory fills it)")
            if s.verified:
                lines.append(f"  verify: {len(s.corrupt)} corrupt record(s)" +
                             (": " + ", ".join(s.corrupt) if s.corrupt else ", every checksum matches"))
        duplicates = self.duplicates
        if duplicates:
            lines.append(f"duplicates: {len(duplicates)} sample id(s) stored in more than one store")
            lines += [f"  {sid}: {', '.join(str(p) for p in paths)}" for sid, paths in list(duplicates.items())[:10]]
            if len(duplicates) > 10:
                lines.append(f"  ... {len(duplicates) - 10} more")
        lines.append("OK" if self.ok else "PROBLEMS FOUND")
        return "\n".join(lines)


def _summarise(path: Path, verify: bool) -> StoreSummary:
    summary = StoreSummary(path=path, writer=writer_active(path))
    try:
        with StoreReader(path, verify=True, allow_empty=True) as reader:
            m = reader.manifest
            summary.count, summary.counts = m["count"], m["counts"]
            summary.materials = len({s["material_id"] for s in m["samples"]})
            summary.arrays, summary.compression = m["arrays"], m["compression"]
            summary.config_hash, summary.schema_version = m["config_hash"], m["schema_version"]
            summary.code_version, summary.record_bytes = m["code_version"], m["bytes"]
            summary.file_bytes = (path / DATA_NAME).stat().st_size
            summary.reconciled = reader.reconciled
            summary.ids = reader.ids()
            if verify:
                summary.corrupt = reader.verify_all()
                summary.verified = True
    except StoreError as exc:
        summary.error = str(exc)
    return summary


def inspect_store(path: str | os.PathLike, verify: bool = False) -> InspectReport:
    """Summarise every store at or below ``path``; ``verify`` checks every record's checksum.

    Problems inside a store (corrupt records, schema errors, emptiness) are reported, not raised;
    a path that does not exist raises `StoreNotFoundError`.
    """
    root = Path(path)
    if not root.exists():
        raise StoreNotFoundError(f"no store at {root}: the path does not exist; check it")
    return InspectReport(root=root, stores=[_summarise(p, verify) for p in find_stores(root)], verified=verify)
