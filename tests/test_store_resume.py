"""Stores resume after a kill at any point of their life, and after the repair the messages advise
(issue 32, B): every rerun ends with every planned sample stored once.

Each kill is a real SIGKILL of a real `namsa` process at a chosen point: the child (KILL_CHILD) runs
the CLI with one function of the store's life cycle wrapped so that the process kills itself there
(before or after the real code runs), so the state left behind is exactly the one a kill -9 at that
moment leaves. The reruns are the real commands.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import stage
from stage.claims import CLAIMS_DIR
from stage.jsonfile import TMP_PREFIX
from namsa.errors import UserError
from stage_helpers import CONFIG_HASH, make_sample
from workflow import data_runners
from workflow.cli import main
from workflow.config import load_config

REPO = Path(__file__).resolve().parents[1]
MICRO = str(REPO / "configs" / "micro.yaml")

KILL_CHILD = r"""
import os, signal, sys
from pathlib import Path
import stage.claims, stage.jsonfile, stage.writer

def die(*_args, **_kw):
    os.kill(os.getpid(), signal.SIGKILL)

class KillingOs:  # the os module, but the named rename is never reached
    def __init__(self, target):
        self.target = target
    def __getattr__(self, name):
        return getattr(os, name)
    def replace(self, src, dst):
        if Path(dst).name.startswith(self.target):
            die()
        os.replace(src, dst)

point, argv = sys.argv[1], sys.argv[2:]
Writer = stage.writer.StoreWriter
if point == "before-info":            # the LMDB environment exists, its info record does not
    Writer._load_or_create_info = die
elif point == "after-a-record":       # a sample committed, the manifest not yet refreshed
    real_put = Writer.put_record
    Writer.put_record = lambda self, *a: real_put(self, *a) and die()
elif point == "mid-claim-write":      # a claim's temporary file written, not yet renamed
    stage.claims.os = KillingOs("")
elif point == "mid-manifest-write":   # a manifest's temporary file written, not yet renamed
    real_put = Writer.put_record
    def put_then_arm(self, *a):       # armed after the first sample: a manifest of a non-empty store
        stage.jsonfile.os = KillingOs("manifest.json")
        return real_put(self, *a)
    Writer.put_record = put_then_arm
from workflow.cli import main
sys.exit(main(argv))
"""


def killed_at(point: str, *argv: str) -> None:
    """Run `namsa *argv` in a child that kills itself with SIGKILL at ``point``."""
    done = subprocess.run([sys.executable, "-c", KILL_CHILD, point, *argv], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert done.returncode == -signal.SIGKILL, f"not killed at {point}: {done.returncode} {done.stderr[-2000:]}"


def planned_ids() -> set[str]:
    cfg = load_config(MICRO, [])
    return {spec.sample_id(cfg.simulation) for spec in data_runners.plan(cfg).specs}


def store_counts(data_dir: Path) -> dict[str, int]:
    counts = {}
    for path in stage.find_stores(data_dir):
        with stage.open_store(path, allow_empty=True) as reader:
            counts[path.name] = len(reader)
    return counts


def simulate(out: Path, *flags: str) -> int:
    return main(["simulate", MICRO, "--out", str(out), "--no-progress", *flags])


def assert_complete(data_dir: Path) -> None:
    """Every planned sample stored exactly once, and every store's manifest says so."""
    counts = store_counts(data_dir)
    assert data_runners.stored_ids(data_dir) == planned_ids() and sum(counts.values()) == len(planned_ids()), counts
    for path in stage.find_stores(data_dir):
        manifest = json.loads((path / "manifest.json").read_text())
        assert manifest["count"] == counts[path.name]
        assert not list(path.glob(f"{TMP_PREFIX}*")), "a killed writer's temporary manifest was left behind"


# --------------------------------------------------------------------------------------------
# kills


def test_a_run_killed_before_its_stores_info_record_resumes(tmp_path):
    """`namsa run` killed between a store's creation and its info record: the rerun adopts the
    empty store (it held no physics to disagree with) instead of calling it 'other physics'."""
    from workflow.pipeline import Pipeline

    run_dir = tmp_path / "run"
    killed_at("before-info", "run", MICRO, "--out", str(run_dir), "--no-progress")
    store = run_dir / "data" / "store-000"
    with stage.open_store(store, allow_empty=True) as reader:
        assert (store / "data.mdb").is_file() and reader.info == {} and len(reader) == 0  # the reported state
    pipeline = Pipeline(load_config(MICRO, []), run_dir, progress=False, retry_failed=False)
    pipeline.paths.create()
    try:
        pipeline.simulate()
    finally:
        pipeline.close(wait=True)
    assert pipeline.summary.available == len(planned_ids())
    assert_complete(run_dir / "data")


def test_simulate_killed_after_a_record_before_its_manifest_resumes(tmp_path, capsys):
    out = tmp_path / "data"
    killed_at("after-a-record", "simulate", MICRO, "--out", str(out), "--no-progress")
    assert store_counts(out) == {"store-000": 1}
    assert json.loads((out / "store-000" / "manifest.json").read_text())["count"] == 0  # behind the records
    assert simulate(out, "--of", "2") == 0 and simulate(out, "--worker", "1", "--of", "2") == 0
    assert_complete(out)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(str(out))]
    assert lines[0].startswith(f"{out / 'store-000'}: 3 written, 1 already stored, 0 failed"), lines
    assert lines[1].startswith(f"{out / 'store-001'}: 4 written, 0 already stored, 0 failed"), lines


def test_simulate_killed_mid_claim_write_resumes_and_leaves_no_temporary_claim(tmp_path):
    out = tmp_path / "data"
    killed_at("mid-claim-write", "simulate", MICRO, "--out", str(out), "--no-progress")
    assert list((out / CLAIMS_DIR).glob(".*.tmp")), "the kill should leave a half-written claim"
    assert simulate(out, "--of", "1") == 0
    assert_complete(out)
    assert not list((out / CLAIMS_DIR).glob(".*.tmp"))


def test_simulate_killed_mid_manifest_write_resumes_and_leaves_no_temporary_manifest(tmp_path):
    out = tmp_path / "data"
    killed_at("mid-manifest-write", "simulate", MICRO, "--out", str(out), "--no-progress",
              "--set", "data.manifest_every_s=0.000001")
    assert list((out / "store-000").glob(f"{TMP_PREFIX}manifest.json.*")), "the kill should leave a temp manifest"
    assert main(["inspect", "--verify", str(out)]) == 0  # readable meanwhile: the records are the truth
    assert simulate(out) == 0
    assert_complete(out)


# --------------------------------------------------------------------------------------------
# repairs


def test_following_the_truncated_store_advice_completes_with_another_split(tmp_path, capsys):
    """Two workers, one store cut short, its directory deleted as the message says, then a rerun
    with three workers: the deleted store's claims are not trusted, every planned sample is stored
    and each worker's 'already stored' count is what the stores held."""
    out = tmp_path / "data"
    assert simulate(out, "--worker", "0", "--of", "2") == 0 and simulate(out, "--worker", "1", "--of", "2") == 0
    damaged = out / "store-001"
    with open(damaged / "data.mdb", "r+b") as fh:
        fh.truncate((damaged / "data.mdb").stat().st_size // 2)
    capsys.readouterr()
    assert simulate(out, "--of", "3") == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and f"store {damaged}: data.mdb is truncated" in line
    assert f"delete the directory {damaged} and run namsa simulate (or namsa run) again" in line
    shutil.rmtree(damaged)
    kept = data_runners.stored_ids(out)
    cfg = load_config(MICRO, [])
    specs = data_runners.plan(cfg).specs
    for worker in range(3):
        assert simulate(out, "--worker", str(worker), "--of", "3") == 0
        summary = json.loads((out / f"simulate-{worker:03d}.json").read_text())
        mine = {spec.sample_id(cfg.simulation) for spec in data_runners.worker_share(specs, worker, 3)}
        assert (summary["written"], summary["skipped"]) == (len(mine - kept), len(mine & kept))
    assert_complete(out)


def test_an_empty_store_of_other_settings_is_adopted(tmp_path):
    """A store killed after its info record but before its first sample holds no physics: a writer
    of another configuration adopts it, and a run does not call the data directory other physics."""
    store = tmp_path / "data" / "store-000"
    with stage.StoreWriter(store, config_hash="e" * 64):
        pass
    data_runners.check_same_physics(tmp_path / "data", CONFIG_HASH)
    with stage.StoreWriter(store, config_hash=CONFIG_HASH, data_cfg=stage.DataConfig(split_seed=5)) as writer:
        assert writer.info["config_hash"] == CONFIG_HASH and writer.info["split_seed"] == 5


def test_a_store_with_samples_of_other_settings_is_still_refused(tmp_path):
    store = tmp_path / "store-000"
    with stage.StoreWriter(store, config_hash=CONFIG_HASH) as writer:
        writer.put(make_sample("mp-1"))
    with pytest.raises(stage.SchemaError, match="written with split_seed=.*, not 5; resume with the same"):
        stage.StoreWriter(store, config_hash=CONFIG_HASH, data_cfg=stage.DataConfig(split_seed=5))
    with pytest.raises(UserError, match="holds samples of other physics"):
        data_runners.check_same_physics(tmp_path, "e" * 64)


def test_a_store_planted_as_a_link_in_a_received_out_is_refused_and_its_target_untouched(tmp_path, capsys):
    """`namsa simulate --out DIR` where DIR came from someone else: DIR/store-000 linked to a folder outside
    is not written through (issue 32: nothing written outside the output, whatever links it holds)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "received"
    out.mkdir()
    (out / "store-000").symlink_to(outside)
    rc = main(["simulate", MICRO, "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "store-000 is a symbolic link" in err[0], err
    assert list(outside.iterdir()) == []
