"""Binary encoding of one sample record (store format v1), its checksum and optional compression.

Record layout (all integers little-endian; see docs/store-format.md)::

    b"NSR1"                       4 bytes  magic + record version
    header_len                    u32      length of the JSON header
    header                        JSON     {"arrays": [{name, dtype, shape, codec, offset, nbytes}],
                                            "meta": {...}}
    zero padding                           so every array payload starts 64-byte aligned
    array payloads                         at the offsets named in the header
    checksum                      u64      XXH3-64 of every byte before it

The checksum covers the header and every payload, so one flipped bit anywhere in the record is
detected on read. Arrays are C-ordered, axes ``[row = y, col = x]`` as in `namsa.sample`.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash
import zstandard

MAGIC = b"NSR1"
CHECKSUM_NAME = "xxh3_64"
ALIGN = 64
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
#: the largest finite float16 (IEEE 754 binary16).
FLOAT16_MAX = 65504.0
CODECS = ("none", "zstd-shuffle")


class RecordCorrupt(Exception):
    """A record failed its checksum or could not be parsed (the store layer adds store and key)."""


def checksum(data: bytes | memoryview) -> int:
    """XXH3-64 of ``data`` (about 20 GB/s per core, so verifying every read is cheap)."""
    return xxhash.xxh3_64_intdigest(data)


def seal(payload: bytes) -> bytes:
    """``payload`` followed by its 8-byte checksum."""
    return payload + _U64.pack(checksum(payload))


def unseal(buf: bytes | memoryview) -> memoryview:
    """The payload of a sealed buffer; raises RecordCorrupt if the checksum does not match."""
    view = memoryview(buf)
    if len(view) < _U64.size:
        raise RecordCorrupt(f"record of {len(view)} bytes is shorter than its checksum")
    payload = view[: len(view) - _U64.size]
    (stored,) = _U64.unpack(view[len(view) - _U64.size:])
    if checksum(payload) != stored:
        raise RecordCorrupt("checksum mismatch")
    return payload


def check_float16_safe(name: str, array: np.ndarray) -> None:
    """Refuse values float16 cannot hold (|x| > 65504 or NaN) instead of storing inf."""
    if array.size == 0:
        return
    # max and min propagate NaN, so two allocation-free passes cover NaN, inf and overflow
    peak = max(float(array.max()), -float(array.min()))
    if peak <= FLOAT16_MAX:
        return
    bad = ~np.isfinite(array)
    if bad.any():
        raise ValueError(f"{name} holds {int(bad.sum())} NaN/inf values")
    raise ValueError(f"{name} holds |value| {peak:g} > {FLOAT16_MAX:g}, the float16 maximum")


def _byte_planes(array: np.ndarray) -> np.ndarray:
    """Byte shuffle: plane k holds byte k of every value (little-endian), planes concatenated."""
    itemsize = array.dtype.itemsize
    words = np.ascontiguousarray(array).reshape(-1).view(f"<u{itemsize}")
    planes = np.empty((itemsize, words.size), dtype=np.uint8)
    for k in range(itemsize):  # shifts and masks vectorise; a strided byte transpose does not
        np.copyto(planes[k], (words >> np.uint8(8 * k)) & 0xFF, casting="unsafe")
    return planes


def _unshuffle(planes: np.ndarray, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    itemsize = dtype.itemsize
    words = np.zeros(planes.shape[1], dtype=f"<u{itemsize}")
    for k in reversed(range(itemsize)):
        words <<= np.uint8(8) if k < itemsize - 1 else np.uint8(0)
        words |= planes[k]
    return words.view(dtype).reshape(shape)


def _shuffle_compress(array: np.ndarray, level: int) -> bytes:
    # Byte shuffling puts the (slowly varying) exponent bytes of neighbouring values next to each
    # other, which is what makes smooth float data compressible.
    return zstandard.ZstdCompressor(level=level).compress(_byte_planes(array))


def _shuffle_decompress(data: memoryview, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    itemsize = dtype.itemsize
    raw_len = int(np.prod(shape)) * itemsize
    raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_len)
    if len(raw) != raw_len:
        raise RecordCorrupt(f"decompressed {len(raw)} bytes, expected {raw_len}")
    return _unshuffle(np.frombuffer(raw, dtype=np.uint8).reshape(itemsize, -1), dtype, shape)


def encode_record(arrays: dict[str, np.ndarray], meta: dict[str, Any],
                  codecs: dict[str, str] | None = None, level: int = 1,
                  scales: dict[str, float] | None = None) -> bytearray:
    """Encode named arrays + JSON meta into one sealed record.

    ``codecs`` maps an array name to ``none`` (default) or ``zstd-shuffle``; ``scales`` records the
    factor an array was multiplied by before storage (readers divide by it; default 1).
    """
    codecs = codecs or {}
    scales = scales or {}
    blobs: list[bytes | memoryview] = []
    entries = []
    for name, array in arrays.items():
        codec = codecs.get(name, "none")
        if codec not in CODECS:
            raise ValueError(f"unknown codec {codec!r} for {name}; use one of {CODECS}")
        array = np.ascontiguousarray(array)
        blob = _shuffle_compress(array, level) if codec == "zstd-shuffle" else memoryview(array).cast("B")
        blobs.append(blob)
        entries.append({"name": name, "dtype": array.dtype.str, "shape": list(array.shape),
                        "scale": float(scales.get(name, 1.0)), "codec": codec, "nbytes": len(blob)})
    # Offsets depend on the header length, which depends on the offsets' digits: fix by
    # iterating until the layout is stable (two rounds at most in practice).
    header_bytes = b""
    for _ in range(4):
        offset = _aligned(len(MAGIC) + _U32.size + len(header_bytes))
        for entry in entries:
            entry["offset"] = offset
            offset = _aligned(offset + entry["nbytes"])
        new_header = json.dumps({"arrays": entries, "meta": meta}, separators=(",", ":")).encode()
        stable = len(new_header) == len(header_bytes)
        header_bytes = new_header
        if stable:
            break
    # One preallocated buffer, payloads copied in once and sealed in place: a 512 MiB stack is
    # not copied three times on its way into LMDB.
    end = entries[-1]["offset"] + entries[-1]["nbytes"] if entries else _aligned(8 + len(header_bytes))
    out = bytearray(end + _U64.size)
    view = memoryview(out)
    prefix = MAGIC + _U32.pack(len(header_bytes)) + header_bytes
    view[: len(prefix)] = prefix
    for entry, blob in zip(entries, blobs):
        view[entry["offset"]: entry["offset"] + entry["nbytes"]] = blob
    view[end:] = _U64.pack(checksum(view[:end]))
    return out


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def array_layout(header: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{name: {dtype, shape, scale}} of a record header: what a store's manifest must agree with."""
    return {e["name"]: {"dtype": e["dtype"], "shape": e["shape"], "scale": e.get("scale", 1.0)}
            for e in header["arrays"]}


@dataclass
class DecodedRecord:
    """Arrays of a record as numpy arrays (views into the LMDB buffer when uncompressed: copy them
    before the read transaction ends) and its meta dict."""

    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    header: dict[str, Any]


def decode_record(buf: bytes | memoryview, *, verify: bool = True,
                  names: tuple[str, ...] | None = None) -> DecodedRecord:
    """Parse a sealed record; ``verify`` checks its checksum first; ``names`` selects arrays."""
    view = unseal(buf) if verify else memoryview(buf)[: len(buf) - _U64.size]
    try:
        if bytes(view[:4]) != MAGIC:
            raise RecordCorrupt(f"bad magic {bytes(view[:4])!r}, expected {MAGIC!r}")
        (hlen,) = _U32.unpack(view[4:8])
        header = json.loads(bytes(view[8: 8 + hlen]))
        arrays = {}
        for entry in header["arrays"]:
            if names is not None and entry["name"] not in names:
                continue
            dtype = np.dtype(entry["dtype"])
            shape = tuple(entry["shape"])
            data = view[entry["offset"]: entry["offset"] + entry["nbytes"]]
            if entry["codec"] == "zstd-shuffle":
                arrays[entry["name"]] = _shuffle_decompress(data, dtype, shape)
            else:
                arrays[entry["name"]] = np.frombuffer(data, dtype=dtype).reshape(shape)
    except RecordCorrupt:
        raise
    except (ValueError, KeyError, TypeError, zstandard.ZstdError, UnicodeDecodeError) as exc:
        raise RecordCorrupt(f"unparseable record: {exc}") from exc
    return DecodedRecord(arrays=arrays, meta=header["meta"], header=header)
