"""A store among processes: a writer killed with -9 mid-run and resumed, a full disk in a writer,
one writer at a time across processes, readers of a store a live writer grows, a reader that
cannot join the writer's lock table, and another user denied (the in-process format: test_store.py)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import stage
from stage_helpers import CONFIG_HASH, make_samples, run_child, write_store


# ------------------------------------------------------------------------------ crash safety

KILL_CHILD = """
import sys, time
import stage
from stage_helpers import CONFIG_HASH, make_samples
cfg = stage.DataConfig(cbed_dtype="float32", map_size_mb=1, manifest_every_s=0.05)
with stage.StoreWriter(sys.argv[1], config_hash=CONFIG_HASH, data_cfg=cfg) as w:
    for s in make_samples(30, scan=(8, 8), px=48):
        if w.put(s):
            print(s.id, flush=True)
"""


def test_kill_9_mid_run_then_resume_holds_every_sample_once(tmp_path):
    path = tmp_path / "s"
    samples = make_samples(30, scan=(8, 8), px=48)
    committed: list[str] = []
    for kill_after in (3, 9):  # kill twice, later each time, so resume itself is also interrupted
        child = run_child(KILL_CHILD, str(path))
        for _ in range(kill_after):
            committed.append(child.stdout.readline().strip())
        time.sleep(0.01)  # land the kill inside a later put (map growth, commit or manifest write)
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert child.returncode == -signal.SIGKILL
    reader = stage.open_store(path)
    assert set(committed) <= set(reader.ids()), "a committed sample was lost"
    assert reader.verify_all() == []
    reader.close()
    added = write_store(path, samples, stage.DataConfig(cbed_dtype="float32", map_size_mb=1))
    assert sum(added) == 30 - len(reader)
    final = stage.open_store(path)
    assert sorted(final.ids()) == sorted(s.id for s in samples)
    assert len(final.ids()) == len(set(final.ids())) == 30
    assert final.verify_all() == []
    for s in samples[::7]:
        assert final.get(s.id).cbed.tobytes() == s.cbed.tobytes()


FULL_CHILD = """
import resource, signal, sys
import stage
from stage_helpers import CONFIG_HASH, make_samples
# A hard file-size limit (ulimit -f) makes the data file unable to grow: the same failure as a
# full disk, without root and without touching a real filesystem.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))
n = 0
try:
    with stage.StoreWriter(sys.argv[1], config_hash=CONFIG_HASH,
                           data_cfg=stage.DataConfig(cbed_dtype="float32")) as w:
        for s in make_samples(60, scan=(4, 4), px=32):
            w.put(s)
            n += 1
except stage.StoreFullError as exc:
    print(n)
    print(exc)
"""


def test_disk_full_is_a_clear_error_and_the_store_stays_valid(tmp_path):
    child = run_child(FULL_CHILD, str(tmp_path / "s"))
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    n_written, message = out.strip().splitlines()
    assert "file size limit" in message and "intact" in message
    reader = stage.open_store(tmp_path / "s")
    assert len(reader) == int(n_written) > 0
    assert reader.verify_all() == []


# ------------------------------------------------------------------------------ one writer, live readers

def test_two_writers_are_refused(tmp_path):
    with stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH):
        with pytest.raises(stage.StoreLockedError, match="another writer"):
            stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH)


HOLD_CHILD = """
import sys
import stage
from stage_helpers import CONFIG_HASH
with stage.StoreWriter(sys.argv[1], config_hash=CONFIG_HASH):
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_a_writer_in_another_process_is_refused(tmp_path):
    child = run_child(HOLD_CHILD, str(tmp_path / "s"), stdin=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(stage.StoreLockedError, match=f"pid {child.pid}"):
            stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH)
    finally:
        child.communicate("\n", timeout=60)
    with stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH):
        pass  # the lock is released with its holder


WRITING_CHILD = """
import sys
import stage
from stage_helpers import CONFIG_HASH, make_samples
first, total, px, map_mb = (int(a) for a in sys.argv[2:6])
samples = make_samples(total, px=px)
with stage.StoreWriter(sys.argv[1], config_hash=CONFIG_HASH,
                       data_cfg=stage.DataConfig(cbed_dtype="float32", map_size_mb=map_mb)) as w:
    for s in samples[:first]:
        w.put(s)
    w.commit()
    print("written", flush=True)
    sys.stdin.readline()
    for s in samples[first:]:
        w.put(s)
    w.commit()
    print("more", flush=True)
    sys.stdin.readline()
"""
SMALL_WRITES = ("3", "6", "8", "256")  # 3 samples, then 3 more; 8 px; a 256 MiB map that never grows


def test_readers_of_a_store_being_written_use_lmdbs_reader_table(tmp_path):
    """A lock-free LMDB reader may read pages the writer is reusing; while a writer holds the
    store, readers register in LMDB's reader table instead, and read a consistent snapshot."""
    path = tmp_path / "s"
    child = run_child(WRITING_CHILD, str(path), *SMALL_WRITES, stdin=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == "written"
        assert stage.writerlock.writer_active(path) == f"pid {child.pid} on {os.uname().nodename}"
        with stage.open_store(path) as reader:
            assert reader.env.flags()["lock"] is True
            first = [reader[i].id for i in range(len(reader))]
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "more"
            assert [reader[i].id for i in range(len(reader))] == first  # its snapshot, verified
        with stage.open_store(path) as reader:
            assert len(reader) == 6
    finally:
        child.communicate("\n", timeout=60)
    assert stage.writerlock.writer_active(path) is None  # closed: the lock file is emptied
    with stage.open_store(path) as reader:
        assert reader.env.flags()["lock"] is False and len(reader) == 6


def test_reads_continue_after_a_live_writer_grows_the_map(tmp_path):
    """LMDB refuses new read transactions once a writer has grown the file past the reader's map
    (MapResizedError); every read path adopts the new size and goes on."""
    path = tmp_path / "s"
    child = run_child(WRITING_CHILD, str(path), "1", "40", "128", "1", stdin=subprocess.PIPE)  # 15 MB into 1 MiB
    try:
        assert child.stdout.readline().strip() == "written"
        with stage.open_store(path) as reader:
            before = reader.read_raw(0)[0]
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "more"
            assert (path / "data.mdb").stat().st_size > 10 << 20  # beyond py-lmdb's default 10 MiB map
            assert reader.read_raw(0)[0] == before
            assert reader[0].id == reader.ids()[0]
    finally:
        child.communicate("\n", timeout=60)


def test_a_writer_killed_with_9_does_not_count_as_writing(tmp_path):
    path = tmp_path / "s"
    child = run_child(WRITING_CHILD, str(path), *SMALL_WRITES, stdin=subprocess.PIPE)
    assert child.stdout.readline().strip() == "written"
    child.kill()
    child.wait(timeout=60)
    assert (path / "writer.lock").read_text().split()[0] == str(child.pid)
    assert stage.writerlock.writer_active(path) is None
    with stage.open_store(path) as reader:
        assert reader.env.flags()["lock"] is False and len(reader) == 3


READ_AS_ANOTHER_USER_CHILD = """
import os, sys
import stage
stage.open_store, stage.StoreWriter   # load stage's lazy store classes while the interpreter's files are readable
if os.geteuid() == 0:
    os.setgid(65534)
    os.setuid(65534)  # 'nobody': may read the store but not write its lock.mdb
try:
    stage.open_store(sys.argv[1])
    print("NO ERROR")
except stage.StoreError as exc:
    print(exc)
"""


def test_a_reader_that_cannot_join_a_live_writers_lock_table_is_told_to_wait(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="namsa-live-")) if os.geteuid() == 0 else tmp_path
    os.chmod(base, 0o755)
    path = base / "s"
    writer = run_child(WRITING_CHILD, str(path), *SMALL_WRITES, stdin=subprocess.PIPE)
    try:
        assert writer.stdout.readline().strip() == "written"
        os.chmod(path, 0o755)
        for f in path.iterdir():
            os.chmod(f, 0o644 if os.geteuid() == 0 else 0o444)
        out, err = run_child(READ_AS_ANOTHER_USER_CHILD, str(path)).communicate(timeout=120)
    finally:
        writer.communicate("\n\n", timeout=60)
        for f in path.iterdir():
            os.chmod(f, 0o644)
        if base != tmp_path:
            shutil.rmtree(base)
    assert f"is being written (pid {writer.pid} on " in out and "wait for the writer to finish" in out, out + err


DENIED_CHILD = """
import os, sys
import stage
from stage_helpers import CONFIG_HASH
stage.open_store, stage.StoreWriter   # load stage's lazy store classes while the interpreter's files are readable
if os.geteuid() == 0:
    os.setgid(65534)
    os.setuid(65534)  # root ignores file modes: drop to 'nobody' so the denial is real
for action in ("write", "read"):
    try:
        if action == "write":
            stage.StoreWriter(sys.argv[1] + "/new", config_hash=CONFIG_HASH)
        else:
            stage.open_store(sys.argv[1] + "/s")
        print(action, "NO ERROR")
    except stage.StoreError as exc:
        print(action, exc)
"""


def test_permission_denied_is_a_clear_error(tmp_path):
    if os.geteuid() == 0:
        # pytest's tmp dirs are 0700; give the unprivileged child a world-readable base of its own
        base = Path(tempfile.mkdtemp(prefix="namsa-perm-"))
        os.chmod(base, 0o755)
    else:
        base = tmp_path
    try:
        locked = base / "locked"
        write_store(locked / "s", make_samples(1))
        os.chmod(locked / "s", 0o700 if os.geteuid() == 0 else 0o000)
        os.chmod(locked, 0o755 if os.geteuid() == 0 else 0o555)
        out, err = run_child(DENIED_CHILD, str(locked)).communicate(timeout=120)
        os.chmod(locked, 0o755)
        os.chmod(locked / "s", 0o755)
    finally:
        if base != tmp_path:
            shutil.rmtree(base)
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert "permission denied" in lines.get("write", err), err
    assert "permission denied" in lines.get("read", err), err
    assert str(locked) in lines["write"] and str(locked) in lines["read"]
