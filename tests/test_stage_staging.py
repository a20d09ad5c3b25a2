"""Staging (copy / re-shard with verification and skip-if-present) and inspect_store."""
from __future__ import annotations

import json
from pathlib import Path
import pytest

import stage
from namsa.errors import UserError
from stage_helpers import CONFIG_HASH, flip_byte_inside, make_sample, make_samples

F32 = stage.DataConfig(cbed_dtype="float32", split_fractions=(0.5, 0.25, 0.25))


def write_store(path, samples, cfg=F32):
    with stage.StoreWriter(path, config_hash=CONFIG_HASH, data_cfg=cfg) as w:
        for s in samples:
            w.put(s)


def raw_records(path) -> dict[str, bytes]:
    with stage.open_store(path) as r:
        return {sid: bytes(r.read_raw(i)[0]) for i, sid in enumerate(r.ids())}


@pytest.fixture()
def src(tmp_path):
    samples = make_samples(8, px=16)
    write_store(tmp_path / "src" / "w0", samples[:5])
    write_store(tmp_path / "src" / "w1", samples[5:])
    return tmp_path / "src", samples


def test_stage_copies_verifies_and_skips_present(src, tmp_path):
    root, samples = src
    report = stage.stage_store(root / "w0", tmp_path / "dst", threads=3, progress=False)
    assert report.ok and report.copied == 5 and report.skipped == 0
    assert raw_records(tmp_path / "dst") == raw_records(root / "w0")
    copy = stage.open_store(tmp_path / "dst")
    assert copy.manifest["samples"] == stage.open_store(root / "w0").manifest["samples"]
    assert copy.manifest["statistics"] == stage.open_store(root / "w0").manifest["statistics"]
    again = stage.stage_store(root / "w0", tmp_path / "dst", progress=True)
    assert again.ok and again.copied == 0 and again.skipped == 5
    assert "skipped 5" in again.text()


def test_stage_mirrors_a_data_dir_and_resumes_a_partial_copy(src, tmp_path):
    root, samples = src
    write_store(tmp_path / "dst" / "w1", samples[5:6])  # an interrupted earlier staging run
    report = stage.stage_store(root, tmp_path / "dst", threads=2, progress=False)
    assert report.ok and report.copied == 7 and report.skipped == 1
    assert [p.name for p in stage.find_stores(tmp_path / "dst")] == ["w0", "w1"]
    assert raw_records(tmp_path / "dst" / "w1") == raw_records(root / "w1")


def test_reshard_two_ranks_disjoint_union_is_everything(src, tmp_path):
    root, samples = src
    for rank in range(2):
        assert stage.stage_store(root, tmp_path / "dst", rank=rank, world_size=2, progress=False).ok
    shards = stage.find_stores(tmp_path / "dst")
    assert [p.name for p in shards] == ["shard-00000-of-00002", "shard-00001-of-00002"]
    ids = [set(stage.open_store(p).ids()) for p in shards]
    assert not ids[0] & ids[1] and ids[0] | ids[1] == {s.id for s in samples}
    for split in ("train", "dev", "test"):  # balanced per split, so training truncates at most one sample per rank
        counts = [len(stage.open_store(p).ids(split)) for p in shards]
        assert abs(counts[0] - counts[1]) <= 1, (split, counts)
    merged = {**raw_records(shards[0]), **raw_records(shards[1])}
    assert merged == {**raw_records(root / "w0"), **raw_records(root / "w1")}


def test_stage_rank_shard_sums_its_data_dirs_and_keeps_what_is_staged(src, tmp_path):
    root, samples = src
    dirs = [root / "w0", root / "w1"]  # two data dirs (each a store), 5 + 3 samples
    first = stage.stage_rank_shard(dirs, tmp_path / "local", "abcdef0123456789", rank=1, world_size=2)
    assert first.ok and first.skipped == 0 and first.copied == 5 // 2 + 3 // 2  # every 2nd sample, from the 2nd
    assert [p.relative_to(tmp_path / "local") for p in first.destinations] == [
        Path("namsa-staged-abcdef012345") / f"data{i}" / "shard-00001-of-00002" for i in (0, 1)]
    assert first.bytes_copied == sum(len(b) for d in first.destinations for b in raw_records(d).values())
    again = stage.stage_rank_shard(dirs, tmp_path / "local", "abcdef0123456789", rank=1, world_size=2)
    assert again.copied == 0 and again.skipped == first.copied and again.destinations == first.destinations


def test_corrupt_source_records_are_reported_not_copied(src, tmp_path):
    root, samples = src
    victim = sorted(samples[:5], key=lambda s: s.id)[1]
    flip_byte_inside(root / "w0", victim.potential.tobytes()[:64])
    report = stage.stage_store(root / "w0", tmp_path / "dst", progress=False)
    assert not report.ok and report.copied == 4
    assert report.corrupt == [f"{root / 'w0'}:{victim.id}"] and victim.id in report.text()
    assert victim.id not in stage.open_store(tmp_path / "dst").ids()


def test_stage_bad_arguments(src, tmp_path):
    root, _ = src
    with pytest.raises(UserError, match="inside the source"):
        stage.stage_store(root, root / "copy", progress=False)
    with pytest.raises(UserError, match="rank"):
        stage.stage_store(root, tmp_path / "d", rank=2, world_size=2, progress=False)
    with pytest.raises(stage.StoreNotFoundError):
        stage.stage_store(tmp_path / "missing", tmp_path / "d", progress=False)


def test_inspect_reports_counts_shapes_and_hash(src):
    root, samples = src
    report = stage.inspect_store(root)
    assert report.ok and len(report.stores) == 2
    text = report.text()
    assert CONFIG_HASH in text and "samples 5" in text and "(4, 16, 16)" in text and text.endswith("OK")
    assert sum(s.count for s in report.stores) == len(samples)


def test_inspect_verify_reports_corrupt_keys(src):
    root, samples = src
    victim = sorted(samples[5:], key=lambda s: s.id)[0]
    flip_byte_inside(root / "w1", victim.density.tobytes()[:64])
    assert stage.inspect_store(root).ok  # without verify the flip is not seen
    report = stage.inspect_store(root, verify=True)
    assert not report.ok and report.corrupt == [f"{root / 'w1'}:{victim.id}"]
    assert victim.id in report.text() and "PROBLEMS" in report.text()


def test_inspect_flags_empty_newer_and_missing(tmp_path):
    with stage.StoreWriter(tmp_path / "d" / "empty", config_hash=CONFIG_HASH):
        pass
    write_store(tmp_path / "d" / "newer", [make_sample("mp-1")])
    manifest = json.loads((tmp_path / "d" / "newer" / "manifest.json").read_text())
    manifest["schema_version"] = 99
    (tmp_path / "d" / "newer" / "manifest.json").write_text(json.dumps(manifest))
    report = stage.inspect_store(tmp_path / "d")
    assert not report.ok
    text = report.text()
    assert "EMPTY" in text and "upgrade namsa" in text
    with pytest.raises(stage.StoreNotFoundError):
        stage.inspect_store(tmp_path / "nothing")
    (tmp_path / "plain").mkdir()
    assert not stage.inspect_store(tmp_path / "plain").ok
