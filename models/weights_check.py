"""Check a model's weights file against the architecture its card describes, before building it.

Two checks that allocate nothing big: `check_size` counts the parameters of an `Architecture` in
closed form (a card asking for a network above `MAX_PARAMETERS` is refused in microseconds), and
`check_header` reads only the safetensors header (8-byte little-endian length, then JSON, capped
at `MAX_HEADER_BYTES`) and compares every tensor's name, dtype, shape and byte range with what the
network would hold. `expected_tensors` builds the network on torch's ``meta`` device, which has
shapes but no storage. Every failure is one line (`ModelDirError`) naming the tensor.
"""
from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import torch

from .errors import ModelDirError
from .safe_files import open_regular, parse_json_bytes
from .config import Architecture

#: the paper preset has 220,399,104 parameters; a card may ask for at most 4x that
PAPER_PARAMETERS = 220_399_104
MAX_PARAMETERS = 4 * PAPER_PARAMETERS
#: safetensors' own limit is 100 MB; a header for ~200 tensors needs a few kB
MAX_HEADER_BYTES = 16 << 20
_DTYPES = {torch.float32: ("F32", 4), torch.float16: ("F16", 2), torch.bfloat16: ("BF16", 2),
           torch.float64: ("F64", 8), torch.int64: ("I64", 8), torch.int32: ("I32", 4)}


def _block(width: int, layers: int, arch: Architecture) -> tuple[int, int, int]:
    """(parameters, output width, new features) of a dense block, in closed form."""
    g, k = arch.growth_rate, arch.kernel_size
    inputs = layers * width + g * layers * (layers - 1) // 2       # sum of each layer's input width
    params = inputs * g * k * k + (2 * inputs if arch.dense_bn and arch.bn_affine else 0)
    return params, width + layers * g, layers * g


def estimate_parameters(arch: Architecture) -> int:
    """Learnable parameters of `FCDenseNet(arch)` without building it (equal to count_parameters)."""
    ks = arch.stem_kernel or arch.kernel_size
    total = arch.stem_channels * arch.init_channels * ks * ks + (arch.init_channels if arch.init_bias else 0)
    width, skips = arch.init_channels, []
    for level in range(arch.levels):
        params, out, _ = _block(width, arch.layers_per_block[level], arch)
        td_out = out if arch.td_channels is None else arch.td_channels[level]
        total += params + out * td_out + (2 * out if arch.td_bn and arch.bn_affine else 0)
        skips.append(out if arch.skip else 0)
        width = td_out
    params, out, new = _block(width, arch.layers_per_block[arch.levels], arch)
    total += params
    new = new if arch.levels else out
    for level, layers in enumerate(arch.layers_per_block[arch.levels + 1:]):
        total += new * new * arch.tu_kernel ** 2
        params, out, new = _block(new + skips[-1 - level], layers, arch)
        total += params
    head_in = out if arch.head_input == "all" else new
    return total + head_in * arch.head_channels + (1 if arch.icom_residual >= 0 else 0)


def check_size(arch: Architecture, where: str) -> int:
    """The parameter count of ``arch``; refused above `MAX_PARAMETERS` before anything is allocated."""
    n = estimate_parameters(arch)
    if n > MAX_PARAMETERS:
        raise ModelDirError(f"{where} describes a network of {n:,} parameters ({4 * n / 1e9:,.1f} GB), more than the "
                            f"{MAX_PARAMETERS:,} this code loads (4x the paper's); the card is damaged or not ours")
    return n


def expected_tensors(arch: Architecture) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{name: (safetensors dtype, shape)} of the state dict `FCDenseNet(arch)` saves (meta device)."""
    from .fcdensenet import FCDenseNet

    with torch.device("meta"):
        model = FCDenseNet(arch)
    return {name: (_DTYPES[t.dtype][0], tuple(t.shape)) for name, t in model.state_dict().items()}


def read_header(path: Path) -> tuple[dict[str, object], int]:
    """(the safetensors header, bytes of tensor data after it), read with a size cap from a regular
    file (`models.safe_files.open_regular`: never through a link)."""
    with open_regular(path, "weights file") as fh:
        try:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(8)
            if len(head) < 8:
                raise ModelDirError(f"{path} is {size} bytes, too short for a safetensors header; the file is "
                                    f"truncated")
            (n,) = struct.unpack("<Q", head)
            _check_header_length(path, n, size)
            raw = fh.read(n)
        except OSError as exc:
            raise ModelDirError(f"{path} cannot be read ({exc.strerror or exc}); check the model directory") from None
    header = parse_json_bytes(raw, f"{path} header", limit=MAX_HEADER_BYTES)
    if not isinstance(header, dict):
        raise ModelDirError(f"{path} header is a JSON {type(header).__name__}, not an object; the file is damaged")
    return header, size - 8 - n


def _check_header_length(path: Path, n: int, size: int) -> None:
    """A header above the cap is not ours, whatever the file's size; one that runs past the end is a
    truncated file (or a lying length)."""
    if n > MAX_HEADER_BYTES:
        raise ModelDirError(f"{path} says its safetensors header is {n / 2**20:,.1f} MiB, above the "
                            f"{MAX_HEADER_BYTES >> 20} MiB this reader accepts (a namsa model's header is a few KiB), "
                            f"so the file is not a namsa model; use the model.safetensors that namsa train exported")
    if 8 + n > size:
        raise ModelDirError(f"{path} says its header is {n} bytes but the file has {size}; the header lies "
                            f"or the file is truncated")


def check_header(path: Path, expected: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """Refuse a weights file whose header does not hold exactly ``expected`` in one packed buffer."""
    header, data_bytes = read_header(path)
    header.pop("__metadata__", None)
    missing = sorted(set(expected) - set(header))
    extra = sorted(set(header) - set(expected))
    if missing or extra:
        which = f"lacks tensor {missing[0]!r}" if missing else f"holds tensor {extra[0]!r}"
        raise ModelDirError(f"{path} {which}, which the card's architecture "
                            f"{'needs' if missing else 'does not have'} ({len(missing)} missing, {len(extra)} extra); "
                            f"the weights do not belong to this card")
    spans = []
    for name, (dtype, shape) in expected.items():
        spans.append(_check_entry(path, name, header[name], dtype, shape, data_bytes))
    end = 0
    for start, stop, name in sorted(spans):
        if start != end:
            raise ModelDirError(f"{path}: tensor {name!r} starts at byte {start}, expected {end}; the tensors overlap "
                                f"or leave gaps, the file is damaged")
        end = stop
    if end != data_bytes:
        raise ModelDirError(f"{path} holds {data_bytes} bytes of tensor data, the header accounts for {end}; the "
                            f"file is truncated or padded")


def _check_entry(path: Path, name: str, entry: object, dtype: str, shape: tuple[int, ...],
                 data_bytes: int) -> tuple[int, int, str]:
    """(start, stop, name) of one header entry, after checking its dtype, shape and byte range."""
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise ModelDirError(f"{path}: the header entry of tensor {name!r} is malformed "
                            f"({json.dumps(entry)[:80]}); the file is damaged")
    offsets, got_shape = entry["data_offsets"], entry["shape"]
    if entry["dtype"] != dtype:
        raise ModelDirError(f"{path}: tensor {name!r} is {entry['dtype']!r}, the architecture needs {dtype}")
    if not _ints(got_shape) or tuple(got_shape) != shape:
        raise ModelDirError(f"{path}: tensor {name!r} has shape {str(got_shape)[:60]}, the architecture needs "
                            f"{list(shape)}; the weights do not belong to this card")
    if not _ints(offsets) or len(offsets) != 2 or not 0 <= offsets[0] <= offsets[1] <= data_bytes:
        raise ModelDirError(f"{path}: tensor {name!r} has data offsets {str(offsets)[:60]} outside the "
                            f"{data_bytes} bytes of data; the file is truncated or damaged")
    need = math.prod(shape) * _DTYPES_BY_NAME[dtype]
    if offsets[1] - offsets[0] != need:
        raise ModelDirError(f"{path}: tensor {name!r} spans {offsets[1] - offsets[0]} bytes, its shape needs {need}; "
                            f"the file is damaged")
    return offsets[0], offsets[1], name


def _ints(value: object) -> bool:
    return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


_DTYPES_BY_NAME = {name: size for name, size in _DTYPES.values()}

__all__ = ["estimate_parameters", "check_size", "expected_tensors", "check_header", "read_header", "MAX_PARAMETERS"]
