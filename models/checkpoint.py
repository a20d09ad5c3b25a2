"""Training checkpoints: safetensors + JSON, written atomically, verified, never unpickled.

Layout of ``<out>/checkpoints/step-00000100/``:

    model.safetensors       model state dict (parameters and batch-norm buffers), float32
    optimizer.safetensors   optimiser tensors, keys ``state.<param index>.<name>``
    state.json              everything else (written last): format version, model/train config,
                            step, epoch, data position, schedule positions, RNG states (base64 /
                            lists), loss scale, normaliser, data manifest hash, optimiser scalars and
                            param groups, metrics, and an xxh3-128 digest + size of each file.

A checkpoint is written into ``.step-*.tmp-<pid>`` beside the final name, every file fsynced, then
put in place by `stage.dir_swap` (the one directory swap), so a kill at any point leaves either the
old set or the new one. Loading
verifies sizes and digests; a corrupt or truncated checkpoint is reported and the previous one
used. A file that holds a pickle (or torch.save's zip) is refused outright: loading a checkpoint
never runs ``pickle``.
"""
from __future__ import annotations

import base64
import os
import random
import shutil
import struct
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash
from safetensors.torch import load_file, save_file

from namsa.errors import RunError, UserError
from stage import dir_swap
from stage.jsonfile import fsync_dir, write_json_atomic

from .card import MODEL_FILE
from .errors import ModelDirError
from .safe_files import inside, open_regular, parse_json_bytes

FORMAT_VERSION = 1
OPTIM_FILE, STATE_FILE = "optimizer.safetensors", "state.json"
EXPECTED_FILES = (MODEL_FILE, OPTIM_FILE, STATE_FILE)
PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".bin", ".npy", ".npz")
#: RNG states, optimiser scalars and configs: tens of kB; far more is not a namsa state
MAX_STATE_BYTES = 64 << 20


class CheckpointError(UserError):
    """A checkpoint that cannot be used."""


class CorruptCheckpointError(CheckpointError):
    """Missing, truncated or altered files (the trainer falls back to the previous checkpoint)."""


class PickledCheckpointError(CheckpointError):
    """A checkpoint carrying a pickled payload; refused, never loaded."""


# ----------------------------------------------------------------------------- file helpers

def file_digest(path: Path) -> str:
    """xxh3-128 of a regular file, never read through a link (fast enough for GB-sized weights)."""
    h = xxhash.xxh3_128()
    with open_regular(path, "weights file") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def looks_pickled(path: Path) -> bool:
    """True when a file starts like a pickle (protocol 2-5 marker) or torch.save's zip archive."""
    with open_regular(path) as fh:
        head = fh.read(4)
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or head == b"PK\x03\x04"


def has_safetensors_header(path: Path) -> bool:
    """True when a file starts with a plausible safetensors header (u64 length, then a JSON object).

    Checked before the pickle magic: a safetensors header length can itself begin with the bytes
    0x80 0x02..0x05 (e.g. 640), which alone would look like a pickle protocol marker.
    """
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        raw = fh.read(9)
    if len(raw) < 9:
        return False
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8:9] == b"{" and 8 + n <= size


def refuse_pickles(directory: Path) -> None:
    """Raise PickledCheckpointError if any file in ``directory`` is (or is named like) a pickle; a
    symbolic link or special file among them is refused (`models.safe_files.open_regular`) before it is
    opened: nothing outside a model or checkpoint directory is read for it."""
    for path in sorted(directory.iterdir()):
        if path.is_dir() and not path.is_symlink():
            continue
        if path.suffix in PICKLE_SUFFIXES or (not has_safetensors_header(path) and looks_pickled(path)):
            raise PickledCheckpointError(
                f"checkpoint {directory} contains a pickled payload ({path.name}); pickles can run arbitrary "
                f"code and are never loaded: use a checkpoint written by namsa (safetensors + JSON)")


def check_safetensors_header(path: Path) -> None:
    """Cheap structural check before parsing: 8-byte header length, then a JSON object."""
    if not has_safetensors_header(path):
        raise CorruptCheckpointError(f"{path} has a truncated or malformed safetensors header; the file is damaged")


# ----------------------------------------------------------------------------- RNG state

def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype=np.uint8).copy())


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """torch (CPU and, on a GPU, the CUDA generator of ``device`` only), numpy and python RNG states
    as JSON-safe values. ``device`` is the rank's training device (default: the current CUDA device
    once CUDA is in use); the other visible GPUs are not this rank's and are not saved, so the state
    does not depend on how many GPUs the job sees."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state = {"torch": _b64(torch.get_rng_state()),
             "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
             "python": [py_state[0], list(py_state[1]), py_state[2]]}
    cuda = _rank_cuda_device(device)
    if cuda is not None:
        state["cuda_device"] = _b64(torch.cuda.get_rng_state(cuda))
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Restore `rng_state`'s ``state``; its CUDA generator goes onto ``device`` (the rank's
    training device, default as in `rng_state`). A checkpoint written before per-device states
    (``"cuda"``: one state per GPU that job saw) gives the entry of ``device``'s index when it has
    one; otherwise the CUDA stream restarts from its seed."""
    torch.set_rng_state(_unb64(state["torch"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    cuda = _rank_cuda_device(device)
    saved = _saved_cuda_state(state, cuda)
    if cuda is not None and saved is not None:
        torch.cuda.set_rng_state(_unb64(saved), cuda)


def _rank_cuda_device(device: torch.device | None) -> torch.device | None:
    """The CUDA device whose generator this rank uses, or None on the CPU."""
    if device is not None:
        return device if device.type == "cuda" and torch.cuda.is_available() else None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return None


def _saved_cuda_state(state: dict[str, Any], cuda: torch.device | None) -> str | None:
    """The saved CUDA generator state for ``cuda``: the per-device entry, or the old list's entry
    at the device's index (the old format saved every visible GPU, index = device ordinal)."""
    if cuda is None:
        return None
    if "cuda_device" in state:
        return state["cuda_device"]
    per_gpu = state.get("cuda") or []
    index = cuda.index if cuda.index is not None else torch.cuda.current_device()
    return per_gpu[index] if index < len(per_gpu) else None


# ----------------------------------------------------------------------------- optimiser state

def split_optimizer_state(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """torch optimiser state dict -> (tensors for safetensors, JSON-safe rest)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, entry in state_dict["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"state.{idx}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in state_dict["param_groups"]]
    return tensors, {"scalars": scalars, "param_groups": groups}


def join_optimizer_state(tensors: dict[str, torch.Tensor], rest: dict[str, Any]) -> dict[str, Any]:
    """Inverse of `split_optimizer_state` (``rest``: its JSON-safe half)."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    for idx, entry in rest["scalars"].items():
        state.setdefault(int(idx), {}).update(entry)
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in rest["param_groups"]]
    return {"state": state, "param_groups": groups}


# ----------------------------------------------------------------------------- save / load

def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


class CheckpointWriteError(RunError):
    """A checkpoint that could not be written (disk full, file too large, read-only, ...): the run
    failed, not its input, so not a `CheckpointError`; the checkpoints before it stay loadable."""


def save_checkpoint(root: Path, step: int, model_state: dict[str, torch.Tensor],
                    optimizer_state: dict[str, Any], state: dict[str, Any]) -> Path:
    """Write one checkpoint atomically under ``root``; return its directory.

    A failed write (no space, a file-size limit, ...) removes the temporary directory and raises
    `CheckpointWriteError` (one line): the checkpoints written before stay intact and loadable.
    """
    from safetensors import SafetensorError

    root = Path(root)
    final = root / step_dir_name(step)
    tmp = dir_swap.temporary_sibling(final)
    try:
        root.mkdir(parents=True, exist_ok=True)
        recover_checkpoints(root)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write_checkpoint_files(tmp, step, model_state, optimizer_state, state)
    except (OSError, SafetensorError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        kept = list_checkpoints(root)
        raise CheckpointWriteError(
            f"cannot write checkpoint {final} ({reason}); free disk space (or raise the file-size limit) and "
            f"resume with --resume: {kept[-1].name + ' is intact' if kept else 'no earlier checkpoint exists'}"
        ) from None
    dir_swap.swap_into_place(tmp, final)  # the same step written again after a resume: replaced whole
    return final


def _write_checkpoint_files(tmp: Path, step: int, model_state: dict[str, torch.Tensor],
                            optimizer_state: dict[str, Any], state: dict[str, Any]) -> None:
    """The three files of a checkpoint, each fsynced, into the temporary directory ``tmp``."""
    save_file({k: v.detach().contiguous().cpu() for k, v in model_state.items()}, str(tmp / MODEL_FILE))
    opt_tensors, opt_meta = split_optimizer_state(optimizer_state)
    save_file(opt_tensors, str(tmp / OPTIM_FILE))
    files = {}
    for name in (MODEL_FILE, OPTIM_FILE):
        _fsync_file(tmp / name)
        files[name] = {"bytes": (tmp / name).stat().st_size, "xxh3_128": file_digest(tmp / name)}
    payload = {**state, "format_version": FORMAT_VERSION, "step": step, "optimizer": opt_meta, "files": files}
    write_json_atomic(tmp / STATE_FILE, payload, sort_keys=True)
    fsync_dir(tmp)


def recover_checkpoints(root: Path) -> None:
    """Settle what killed writers left under ``root``: a checkpoint set aside by a swap that a kill
    interrupted is put back, temporaries are removed. Called by the one writer (rank 0) only."""
    dir_swap.recover_all(Path(root), stale=lambda pid: True)


def read_state(path: Path) -> dict[str, Any]:
    """The JSON state of checkpoint ``path`` (no verification of the tensor files), read with a
    size and nesting cap (`models.safe_files.parse_json_bytes`)."""
    try:
        with open_regular(_state_file(Path(path), STATE_FILE), "checkpoint state") as fh:
            raw = fh.read(MAX_STATE_BYTES + 1)
    except ModelDirError as exc:
        missing = not os.path.lexists(Path(path) / STATE_FILE)
        raise CorruptCheckpointError(f"checkpoint {path} has no {STATE_FILE}; it is incomplete" if missing
                                     else str(exc)) from None
    try:
        return parse_json_bytes(raw, f"checkpoint {path}: {STATE_FILE}", limit=MAX_STATE_BYTES)
    except ModelDirError as exc:
        raise CorruptCheckpointError(str(exc)) from None


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Refuse pickles, check every file's size and digest; return the JSON state."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist; point at a step-* directory or a model dir")
    refuse_pickles(path)
    state = read_state(path)
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        found = state.get("format_version") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"checkpoint {path} has format {found}, this code reads "
                              f"{FORMAT_VERSION}; retrain or use the matching namsa version")
    for name, info in _file_entries(path, state).items():
        file = _state_file(path, name)
        if not file.is_file():
            raise CorruptCheckpointError(f"checkpoint {path} is missing {name}")
        if file.stat().st_size != info["bytes"]:
            raise CorruptCheckpointError(f"checkpoint {path}: {name} has {file.stat().st_size} bytes, "
                                         f"expected {info['bytes']} (truncated)")
        check_safetensors_header(file)
        if file_digest(file) != info["xxh3_128"]:
            raise CorruptCheckpointError(f"checkpoint {path}: {name} does not match its recorded digest")
    return state


def _file_entries(path: Path, state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``state["files"]``, checked: only the two tensor files, each with an int size and a digest."""
    files = state.get("files", {})
    ok = isinstance(files, dict) and all(
        name in (MODEL_FILE, OPTIM_FILE) and isinstance(info, dict) and type(info.get("bytes")) is int
        and isinstance(info.get("xxh3_128"), str) for name, info in files.items())
    if not ok:
        raise CorruptCheckpointError(f"checkpoint {path}: {STATE_FILE} 'files' must map {MODEL_FILE} / {OPTIM_FILE} "
                                     f"to their bytes and xxh3_128; it is damaged")
    return files


def _state_file(path: Path, name: str) -> Path:
    """``path / name``, refused when a symlink takes it outside the checkpoint directory."""
    try:
        return inside(path, name, "checkpoint file")
    except ModelDirError as exc:
        raise CorruptCheckpointError(str(exc)) from None


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """(model state dict, optimiser state dict, JSON state) of a verified checkpoint, on the CPU."""
    path = Path(path)
    state = verify_checkpoint(path)
    try:
        model_state = load_file(str(path / MODEL_FILE))
        opt_state = join_optimizer_state(load_file(str(path / OPTIM_FILE)), state["optimizer"])
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise CorruptCheckpointError(f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc})") from None
    return model_state, opt_state, state


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint directories under ``root``, oldest first (temporaries ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def load_latest(root: Path, warn: Callable[[str], None] | None = None
                ) -> tuple[Path, dict[str, torch.Tensor], dict[str, Any], dict[str, Any]] | None:
    """Newest loadable checkpoint under ``root``; a corrupt one is reported and skipped."""
    warn = warn or (lambda msg: warnings.warn(msg, RuntimeWarning, stacklevel=3))
    candidates = list_checkpoints(root)
    for i, path in enumerate(reversed(candidates)):
        try:
            return (path, *load_checkpoint(path))
        except CorruptCheckpointError as exc:
            older = candidates[-2 - i].name if i + 1 < len(candidates) else "a fresh start"
            warn(f"{exc}; falling back to {older}")
    return None


def set_aside(root: Path, damaged: list[Path]) -> Path:
    """Move ``damaged`` checkpoints into ``root/damaged-<time>/`` (kept for a post-mortem, out of
    the way of the steps a resumed run writes again); return that directory."""
    aside = Path(root) / f"damaged-{time.strftime('%Y%m%dT%H%M%S')}"
    aside.mkdir(parents=True, exist_ok=True)
    for path in damaged:
        os.replace(path, aside / path.name)
    fsync_dir(Path(root))
    return aside


def prune_checkpoints(root: Path, keep_last: int, keep: set[str] = frozenset()) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints (and those named in ``keep``) and stale
    temporaries (`recover_checkpoints`); return the checkpoints deleted."""
    root = Path(root)
    recover_checkpoints(root)
    ckpts = list_checkpoints(root)
    doomed = [p for p in ckpts[:-keep_last] if p.name not in keep] if keep_last > 0 else []
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return doomed
