"""Store format v1: round trips, exactly-once writes, crash safety, corruption and bad input."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import stage
from namsa.errors import UserError
from stage import codec
from stage.transforms import intensity_scale
from stage_helpers import CONFIG_HASH, flip_byte_inside, make_sample, make_samples

HERE = Path(__file__).parent
F32 = stage.DataConfig(cbed_dtype="float32")


def write_store(path, samples, cfg=None, **kw):
    with stage.StoreWriter(path, config_hash=CONFIG_HASH, data_cfg=cfg or stage.DataConfig(), **kw) as w:
        return [w.put(s) for s in samples]


def run_child(code: str, *args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{HERE}:{HERE.parent}")
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


# ------------------------------------------------------------------------------ round trips

@pytest.mark.parametrize("cfg", [F32, stage.DataConfig(cbed_dtype="float32", compression="zstd")],
                         ids=["float32", "float32-zstd"])
def test_round_trip_float32_is_bit_exact(tmp_path, cfg):
    samples = make_samples(3, variants=2)
    write_store(tmp_path / "s", samples, cfg)
    reader = stage.open_store(tmp_path / "s")
    assert len(reader) == len(samples)
    for s in samples:
        got = reader.get(s.id)
        for name in ("cbed", "potential", "density"):
            want = getattr(s, name)
            assert getattr(got, name).dtype == np.float32
            assert getattr(got, name).tobytes() == want.tobytes(), name
        assert got.meta == s.meta
        assert reader.meta(reader.ids().index(s.id)) == s.meta
    assert reader.manifest["compression"] == cfg.compression


def test_round_trip_float16_equals_the_scaled_float16_cast(tmp_path):
    samples = make_samples(2, variants=2)
    write_store(tmp_path / "s", samples, stage.DataConfig(compression="zstd"))
    reader = stage.open_store(tmp_path / "s")
    scale = np.float32(intensity_scale(8))
    assert reader.manifest["arrays"]["cbed"] == {"dtype": "<f2", "shape": [4, 8, 8], "scale": float(scale)}
    for s in samples:
        got = reader.get(s.id)
        assert got.cbed.dtype == np.float32  # physical intensities again
        stored = (s.cbed * scale).astype(np.float16)
        assert got.cbed.tobytes() == (stored.astype(np.float32) / scale).tobytes()
        raw, _ = reader.read_arrays(reader.ids().index(s.id), names=("cbed",), physical=False)
        assert raw["cbed"].dtype == np.float16 and raw["cbed"].tobytes() == stored.tobytes()
        assert got.potential.tobytes() == s.potential.tobytes()
        assert got.density.tobytes() == s.density.tobytes()
        assert got.meta == s.meta


def test_float16_scaling_keeps_paper_sized_intensities_precise():
    """At P = 256 a mean pixel holds 1/65536 of the intensity: a float16 subnormal. Scaled by
    intensity_scale(256) = 4096 it is a normal float16 with 11 significant bits."""
    rng = np.random.default_rng(0)
    pattern = rng.gamma(0.5, size=(256, 256)).astype(np.float32)
    pattern /= pattern.sum()
    scale = np.float32(intensity_scale(256))
    assert scale == 4096.0
    scaled = (pattern * scale).astype(np.float16).astype(np.float32) / scale
    plain = pattern.astype(np.float16).astype(np.float32)
    big = pattern > 1e-6
    rel = lambda x: float(np.abs(x[big] / pattern[big] - 1).max())  # noqa: E731
    assert rel(scaled) < 1e-3 and rel(plain) > 0.02  # 2% error at 1e-6 without the scale
    assert intensity_scale(16 * 1024) * 1.0 <= 65504  # a pixel <= 1 never overflows float16


def test_zstd_shuffle_compresses_smooth_float16(tmp_path):
    s = make_sample("mp-1", scan=(4, 4), px=32)
    cbed = s.cbed.astype(np.float16)
    plain = codec.encode_record({"cbed": cbed}, {})
    packed = codec.encode_record({"cbed": cbed}, {}, {"cbed": "zstd-shuffle"})
    assert len(packed) < len(plain)
    assert codec.decode_record(packed).arrays["cbed"].tobytes() == cbed.tobytes()


def test_put_is_exactly_once_and_resume_skips(tmp_path):
    samples = make_samples(4)
    assert write_store(tmp_path / "s", samples[:2]) == [True, True]
    with stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH) as w:
        assert w.has(samples[0].id) and not w.has(samples[3].id)
        assert [w.put(s) for s in samples] == [False, False, True, True]
        assert w.put(samples[0]) is False
    reader = stage.open_store(tmp_path / "s")
    assert sorted(reader.ids()) == sorted(s.id for s in samples)
    with pytest.raises(stage.StoreError, match="resume=False"):
        stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH, resume=False)


def test_manifest_describes_the_store(tmp_path):
    samples = make_samples(6)
    write_store(tmp_path / "s", samples)
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["schema_version"] == stage.SCHEMA_VERSION
    assert manifest["count"] == 6 and manifest["config_hash"] == CONFIG_HASH
    assert manifest["checksum"] == "xxh3_64"
    assert set(manifest["arrays"]) == {"cbed", "potential", "density"}
    assert {s["material_id"] for s in manifest["samples"]} == {s.meta["material_id"] for s in samples}
    for entry in manifest["samples"]:
        assert entry["split"] == stage.split_of(entry["material_id"], (0.9, 0.05, 0.05), 0)
    assert sum(manifest["counts"].values()) == 6


def test_map_grows_automatically(tmp_path):
    cfg = stage.DataConfig(cbed_dtype="float32", map_size_mb=1)
    samples = make_samples(16, scan=(4, 4), px=48)  # 144 KiB cbed each: 16 samples outgrow 1 MiB
    write_store(tmp_path / "s", samples, cfg)
    reader = stage.open_store(tmp_path / "s")
    assert len(reader) == 16 and reader.verify_all() == []
    assert (tmp_path / "s" / "data.mdb").stat().st_size > 1 << 20


def test_manifest_behind_the_records_is_reconciled(tmp_path):
    """A kill between a commit and the manifest refresh loses nothing: LMDB is the truth."""
    samples = make_samples(5)
    write_store(tmp_path / "s", samples[:2])
    stale = (tmp_path / "s" / "manifest.json").read_text()
    write_store(tmp_path / "s", samples)
    (tmp_path / "s" / "manifest.json").write_text(stale)
    reader = stage.open_store(tmp_path / "s")
    assert reader.reconciled and len(reader) == 5
    (tmp_path / "s" / "manifest.json").unlink()
    assert len(stage.open_store(tmp_path / "s")) == 5
    with stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH):
        pass  # a writer rewrites the manifest on open
    assert json.loads((tmp_path / "s" / "manifest.json").read_text())["count"] == 5


def test_reader_and_writer_share_a_process(tmp_path):
    samples = make_samples(3)
    with stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH) as w:
        w.put(samples[0])
        reader = stage.open_store(tmp_path / "s")
        assert len(reader) == 1 and reader[0].id == samples[0].id
        reader.close()


def test_open_stores_concatenates_and_find_stores_finds_them(tmp_path):
    write_store(tmp_path / "data" / "w0", make_samples(2))
    write_store(tmp_path / "data" / "w1", [make_sample("mp-900"), make_sample("mp-901")])
    stores = stage.find_stores(tmp_path / "data")
    assert [p.name for p in stores] == ["w0", "w1"]
    both = stage.open_stores(tmp_path / "data")
    assert len(both) == 4
    assert [s.id for s in both] == both.ids()
    assert both[3].meta["material_id"] == "mp-901"
    assert both.manifest["count"] == 4 and len(both.manifests) == 2
    assert stage.find_stores(tmp_path / "data" / "w0") == [tmp_path / "data" / "w0"]


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


def test_max_map_size_is_a_clear_error_and_the_store_stays_valid(tmp_path):
    cfg = stage.DataConfig(cbed_dtype="float32", map_size_mb=1, max_map_size_gb=1 / 1024)
    written = 0
    with pytest.raises(stage.StoreFullError, match="max_map_size_gb"):
        with stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH, data_cfg=cfg) as w:
            for s in make_samples(40, scan=(4, 4), px=32):
                w.put(s)
                written += 1
    reader = stage.open_store(tmp_path / "s")
    assert len(reader) == written > 0 and reader.verify_all() == []


# ------------------------------------------------------------------------------ corruption

def test_flipped_byte_is_detected_named_and_skippable(tmp_path):
    samples = make_samples(4, px=16)
    write_store(tmp_path / "s", samples, F32)
    victim = samples[2]
    flip_byte_inside(tmp_path / "s", victim.potential.tobytes()[:64])
    reader = stage.open_store(tmp_path / "s")
    with pytest.raises(stage.CorruptRecordError) as info:
        reader.get(victim.id)
    assert str(tmp_path / "s") in str(info.value) and victim.id in str(info.value)
    assert isinstance(info.value, UserError)
    with pytest.raises(stage.CorruptRecordError):
        list(reader)
    skipping = stage.open_store(tmp_path / "s", skip_corrupt=True)
    assert [s.id for s in skipping] == [s.id for s in sorted(samples, key=lambda s: s.id) if s.id != victim.id]
    assert skipping.skipped == [victim.id]
    assert reader.verify_all() == [victim.id]


# ------------------------------------------------------------------------------ bad input

def test_missing_path_and_not_a_store(tmp_path):
    with pytest.raises(stage.StoreNotFoundError, match="does not exist"):
        stage.open_store(tmp_path / "nope")
    with pytest.raises(stage.StoreNotFoundError):
        stage.find_stores(tmp_path / "nope")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    with pytest.raises(stage.NotAStoreError, match="not a store"):
        stage.open_store(tmp_path / "junk")
    with pytest.raises(stage.NotAStoreError):
        stage.open_stores(tmp_path / "junk")
    with pytest.raises(stage.NotAStoreError, match="not empty"):
        stage.StoreWriter(tmp_path / "junk", config_hash=CONFIG_HASH)
    with pytest.raises(stage.NotAStoreError, match="is a file"):
        stage.StoreWriter(tmp_path / "junk" / "notes.txt", config_hash=CONFIG_HASH)
    write_store(tmp_path / "data" / "w0", make_samples(1))
    with pytest.raises(stage.NotAStoreError, match="open_stores"):
        stage.open_store(tmp_path / "data")


def test_empty_store_is_a_clear_error(tmp_path):
    with stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH):
        pass
    with pytest.raises(stage.EmptyStoreError, match="no samples"):
        stage.open_store(tmp_path / "s")
    with pytest.raises(stage.EmptyStoreError):
        stage.open_stores([tmp_path / "s"])
    assert len(stage.open_store(tmp_path / "s", allow_empty=True)) == 0


def _edit_manifest(path: Path, **changes) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(changes)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_newer_schema_version_is_refused(tmp_path):
    write_store(tmp_path / "s", make_samples(1))
    _edit_manifest(tmp_path / "s", schema_version=stage.SCHEMA_VERSION + 1)
    with pytest.raises(stage.SchemaError, match="upgrade namsa"):
        stage.open_store(tmp_path / "s")
    with pytest.raises(stage.SchemaError, match="upgrade namsa"):
        stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH)


def test_manifest_shape_mismatch_is_refused(tmp_path):
    write_store(tmp_path / "s", make_samples(2))
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    manifest["arrays"]["cbed"]["shape"] = [1024, 8, 8]
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(stage.SchemaError, match="disagree"):
        stage.open_store(tmp_path / "s")


def test_manifest_listing_unknown_samples_is_refused(tmp_path):
    write_store(tmp_path / "s", make_samples(2))
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    manifest["samples"].append({"id": "ghost", "split": "train", "material_id": "mp-0"})
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(stage.SchemaError, match="missing from LMDB"):
        stage.open_store(tmp_path / "s")


def test_samples_of_another_shape_or_config_are_refused(tmp_path):
    with stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH) as w:
        w.put(make_sample("mp-1"))
        with pytest.raises(stage.SchemaError, match="share shapes"):
            w.put(make_sample("mp-2", px=16))
        with pytest.raises(UserError, match="config_hash"):
            w.put(make_sample("mp-3", config_hash="f" * 64))
    with pytest.raises(stage.SchemaError, match="config_hash"):
        stage.StoreWriter(tmp_path / "s", config_hash="e" * 64)
    with pytest.raises(stage.SchemaError, match="cbed_dtype"):
        stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH, data_cfg=F32)


@pytest.mark.parametrize("bad", [np.nan, 1e5, -7e4])
def test_float16_overflow_or_nan_is_an_error(tmp_path, bad):
    s = make_sample("mp-1")
    s.cbed[0, 0, 0] = bad
    with stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH) as w:
        with pytest.raises(UserError, match="float16"):
            w.put(s)
        assert len(w) == 0


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


def test_readahead_follows_the_record_size(tmp_path):
    write_store(tmp_path / "small", make_samples(2))
    write_store(tmp_path / "large", [make_sample("mp-1", scan=(4, 4), px=256)], F32)  # 4 MiB record
    assert stage.open_store(tmp_path / "small").readahead is False
    large = stage.open_store(tmp_path / "large")
    assert large.readahead is True
    assert large[0].cbed.tobytes() == make_sample("mp-1", scan=(4, 4), px=256).cbed.tobytes()
    assert stage.open_store(tmp_path / "large", readahead=False).readahead is False
