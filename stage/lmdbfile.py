"""Is an LMDB data file complete? Read from its meta pages, before anything maps it.

LMDB maps data.mdb and touches pages by address: a page beyond the end of a truncated file (a
half-copied store) is a SIGBUS that kills the process with no message. The two meta pages at the
start of the file (read here with plain reads, as LMDB itself does) record the last page in use
and the page size, so ``(last page + 1) * page size`` is the least size a complete file has.

Meta page layout (lmdb's ``MDB_meta`` after a 16-byte page header, 64-bit builds): magic u32 at
16, page size u32 at 40 (``mm_dbs[FREE_DBI].md_pad``), last page u64 at 136, txn id u64 at 144.
The newer meta page (higher txn id) is the one LMDB uses.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

#: LMDB's magic number, native byte order
MDB_MAGIC = 0xBEEFC0DE
_MAGIC_AT, _PSIZE_AT, _LAST_PAGE_AT, _TXNID_AT = 16, 40, 136, 144
_META_BYTES = _TXNID_AT + 8


def _meta(page: bytes) -> tuple[int, int, int] | None:
    """(page size in bytes, last page number, txn id) of one meta page, or None if it is not one."""
    if len(page) < _META_BYTES or struct.unpack_from("=I", page, _MAGIC_AT)[0] != MDB_MAGIC:
        return None
    psize = struct.unpack_from("=I", page, _PSIZE_AT)[0]
    last_page, txnid = struct.unpack_from("=QQ", page, _LAST_PAGE_AT)
    return psize, last_page, txnid


def required_bytes(data_file: str | os.PathLike) -> int | None:
    """The least size in bytes a complete ``data_file`` has, from its newer meta page.

    None when the file does not start with an LMDB meta page (LMDB's own open then reports it).
    """
    with open(data_file, "rb") as fh:
        first = fh.read(_META_BYTES)
        head = _meta(first)
        if head is None:
            return None
        psize = head[0]
        fh.seek(psize)
        second = _meta(fh.read(_META_BYTES))
    # Two meta pages always exist, so a file shorter than two pages is incomplete too.
    newest = max((m for m in (head, second) if m is not None), key=lambda m: m[2])
    return max(newest[1] + 1, 2) * psize


def truncation(data_file: str | os.PathLike) -> str | None:
    """A one-line description of how ``data_file`` is cut short, or None when it is complete."""
    path = Path(data_file)
    if not path.is_file():
        return None
    try:
        need = required_bytes(path)
        have = path.stat().st_size
    except OSError:
        return None  # unreadable: LMDB's own open says why
    if need is None or have >= need:
        return None
    return f"{path.name} is truncated: {have:,} bytes of the {need:,} its LMDB header says it holds"
