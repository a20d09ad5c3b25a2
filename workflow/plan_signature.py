"""The signature of a stored plan (`workflow.plan_cache`): HMAC-SHA256 with a per-user secret key that
never lives in the cache folder, so that a plan is believed only when its owner's own process stored it.

The key is 32 random bytes in the file that ``NAMSA_PLAN_KEY`` names, by default
``~/.cache/namsa/plan-cache.key``, made on first use: written to a new file (O_CREAT | O_EXCL |
O_NOFOLLOW, mode 0600; its folder made 0700 when missing) and published whole by a hard link, so two
processes starting together agree on one key and none reads half of it. A key file is used only when
it is a regular file (not a link, FIFO or device) of exactly 32 bytes, owned by this user and neither
readable nor writable by group or others; otherwise `PlanKeyRefused` says why and what to do.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any, Mapping

#: the environment variable naming the key file (scripts/gpu_wheels.sh ships one with the study's plan)
KEY_ENV = "NAMSA_PLAN_KEY"
KEY_BYTES = 32
#: the field of a stored plan that holds its signature
MAC_FIELD = "mac"
# a key signs nothing but plans: another use of the same key can never produce a plan's signature
_PLAN_CONTEXT = b"namsa plan cache v1\0"
_SIGNER_CONTEXT = b"namsa plan cache signer v1\0"
_ADVICE = ("make it a regular file of yours with mode 600 (or delete it: the next run makes a new one), "
           f"or set {KEY_ENV} to another key file")


class PlanKeyRefused(Exception):
    """The key file cannot be trusted or made: why (the message), and what to do (``advice``)."""

    def __init__(self, why: str, advice: str = _ADVICE) -> None:
        super().__init__(why)
        self.advice = advice


def key_path() -> Path:
    """The key file: ``NAMSA_PLAN_KEY`` when set, else ``~/.cache/namsa/plan-cache.key``."""
    named = os.environ.get(KEY_ENV)
    # read at every call, not at import: a test or a script sets it for one run
    return Path(named).expanduser() if named else Path.home() / ".cache" / "namsa" / "plan-cache.key"


def plan_secret() -> bytes:
    """This user's key, made when missing; `PlanKeyRefused` when it cannot be trusted or made."""
    try:
        path = key_path()
    except RuntimeError:   # Path.home() without HOME or a passwd entry
        raise PlanKeyRefused("there is no home folder for the plan cache key", f"set {KEY_ENV} to a key file") from None
    key = _read_key(path)
    if key is None:
        try:
            _make_key(path)
        except OSError as exc:
            raise PlanKeyRefused(f"plan cache key {path} cannot be made ({exc.strerror or exc})",
                                 f"set {KEY_ENV} to a file in a writable folder of yours") from None
        key = _read_key(path)
    if key is None:
        raise PlanKeyRefused(f"plan cache key {path} vanished as it was made")
    return key


def _read_key(path: Path) -> bytes | None:
    """The key in ``path``, None when there is no such file; `PlanKeyRefused` when it is not trusted."""
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _refused(path, f"cannot be read ({exc.strerror or exc})") from None
    _check_key_stat(path, before)   # before opening: a FIFO would block, a device would be read
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _refused(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        after = os.fstat(fd)
        if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            raise _refused(path, "was replaced while it was read")
        _check_key_stat(path, after)
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise _refused(path, f"holds {len(key)}{'+' if len(key) > KEY_BYTES else ''} bytes, not a key's {KEY_BYTES}")
    return key


def _check_key_stat(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise _refused(path, "is a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise _refused(path, "is not a regular file")
    if st.st_uid != os.geteuid():
        raise _refused(path, f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})")
    if st.st_mode & 0o077:
        raise _refused(path, f"is open to group or others (mode {stat.S_IMODE(st.st_mode):03o})")


def _refused(path: Path, why: str) -> PlanKeyRefused:
    return PlanKeyRefused(f"plan cache key {path} {why}")


def _make_key(path: Path) -> None:
    """A fresh key at ``path`` unless another process made one first (then that one stays)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(KEY_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(draft, path)   # appears whole, and never over a key another process published
        except FileExistsError:
            pass
    finally:
        draft.unlink(missing_ok=True)


def signer_id(secret: bytes) -> str:
    """A short public name of ``secret`` (it reveals nothing of it): two users' plans in one shared
    folder live side by side instead of replacing each other's on every run."""
    return hmac.new(secret, _SIGNER_CONTEXT, hashlib.sha256).hexdigest()[:12]


def signed(content: Mapping[str, Any], secret: bytes) -> dict[str, Any]:
    """``content`` with its signature under `MAC_FIELD`."""
    return {**content, MAC_FIELD: _mac(content, secret)}


def verified(stored: Mapping[str, Any], secret: bytes) -> dict[str, Any] | None:
    """``stored`` less its signature when the signature is ``secret``'s over the rest, else None."""
    content = {name: value for name, value in stored.items() if name != MAC_FIELD}
    mac = stored.get(MAC_FIELD)
    try:
        expected = _mac(content, secret)
    except ValueError:   # infinities from a huge number in the file: JSON cannot spell them, nobody signed them
        return None
    return content if isinstance(mac, str) and hmac.compare_digest(mac.encode(), expected.encode()) else None


def _mac(content: Mapping[str, Any], secret: bytes) -> str:
    # canonical JSON: the parsed file, written the one way, whatever spacing or key order it had
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hmac.new(secret, _PLAN_CONTEXT + canonical.encode(), hashlib.sha256).hexdigest()


__all__ = ["KEY_ENV", "KEY_BYTES", "MAC_FIELD", "PlanKeyRefused", "key_path", "plan_secret", "signer_id",
           "signed", "verified"]
