"""A half-copied store (data.mdb cut short) is refused with one line before LMDB maps it.

Mapping such a file and touching a page past its end kills the process with SIGBUS (exit 135 from
a shell, -7 here) and no message. Every command that opens stores runs here as the real `namsa`
CLI in a subprocess on a truncated copy, so a SIGBUS shows as a return code, not a dead pytest.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import stage
from stage.lmdbfile import required_bytes, truncation
from stage_helpers import CONFIG_HASH, make_samples

REPO = Path(__file__).resolve().parents[1]
MICRO = REPO / "configs" / "micro.yaml"


@pytest.fixture(scope="module")
def good_store(tmp_path_factory) -> Path:
    """A store of 12 samples whose records live in overflow pages (most of data.mdb)."""
    path = tmp_path_factory.mktemp("good") / "store-000"
    with stage.StoreWriter(path, config_hash=CONFIG_HASH) as writer:
        for sample in make_samples(6, variants=2, scan=(4, 4), px=32):
            writer.put(sample)
    return path


@pytest.fixture
def truncated(good_store, tmp_path) -> Path:
    """A data directory holding a copy of the store whose data.mdb stops halfway (a half copy)."""
    copy = tmp_path / "data" / "store-000"
    shutil.copytree(good_store, copy)
    data = copy / "data.mdb"
    with open(data, "r+b") as fh:
        fh.truncate(data.stat().st_size // 2)
    return copy


def namsa(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workflow.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def assert_one_line_truncation_error(done: subprocess.CompletedProcess, store: Path) -> None:
    assert done.returncode == 2, f"exit {done.returncode}: {done.stderr[-2000:]}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("namsa: error: store "), done.stderr
    assert str(store) in lines[0] and "data.mdb is truncated" in lines[0] and "copy the store again" in lines[0]


def test_required_bytes_is_the_size_lmdb_reports(good_store):
    import lmdb

    env = lmdb.open(str(good_store), readonly=True, lock=False, max_dbs=3)
    info, psize = env.info(), env.stat()["psize"]
    env.close()
    data = good_store / "data.mdb"
    assert required_bytes(data) == (info["last_pgno"] + 1) * psize <= data.stat().st_size
    assert truncation(data) is None


def test_a_file_that_is_not_lmdb_is_left_to_lmdb(tmp_path):
    (tmp_path / "data.mdb").write_bytes(b"not an lmdb file at all" * 10)
    assert required_bytes(tmp_path / "data.mdb") is None and truncation(tmp_path / "data.mdb") is None


def test_the_python_api_refuses_a_truncated_store(truncated):
    with pytest.raises(stage.TruncatedStoreError, match="data.mdb is truncated"):
        stage.open_store(truncated)
    with pytest.raises(stage.TruncatedStoreError, match="data.mdb is truncated"):
        stage.StoreWriter(truncated, config_hash=CONFIG_HASH)
    assert (truncated / "data.mdb").stat().st_size > 0  # nothing was changed or removed


@pytest.mark.parametrize("command", [["inspect"], ["inspect", "--verify"], ["stage"]], ids=" ".join)
def test_store_commands_on_a_truncated_store(command, truncated, tmp_path):
    extra = [str(tmp_path / "staged")] if command == ["stage"] else []
    assert_one_line_truncation_error(namsa(*command, str(truncated), *extra), truncated)


def test_simulate_resuming_into_a_truncated_store(truncated):
    done = namsa("simulate", str(MICRO), "--out", str(truncated.parent), "--no-progress")
    assert_one_line_truncation_error(done, truncated)


def test_train_on_a_truncated_store(truncated, tmp_path):
    done = namsa("train", str(MICRO), "--data", str(truncated.parent), "--out", str(tmp_path / "train"),
                 "--no-progress")
    assert_one_line_truncation_error(done, truncated)


def test_run_with_a_truncated_store_in_its_data(truncated, tmp_path):
    run_dir = tmp_path / "run"
    done = namsa("run", str(MICRO), "--out", str(run_dir), "--no-progress",
                 "--set", f"execution.data_dir={truncated.parent}")
    assert_one_line_truncation_error(done, truncated)
