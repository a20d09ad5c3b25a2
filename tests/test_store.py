"""Store format v1 in one process: round trips, exactly-once writes, a full store, corruption and bad
input (a store among processes, killed writers and live readers: test_store_processes.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import stage
from namsa.errors import UserError
from stage import codec
from stage.transforms import intensity_scale
from stage_helpers import CONFIG_HASH, flip_byte_inside, make_sample, make_samples, write_store

F32 = stage.DataConfig(cbed_dtype="float32")


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


@pytest.mark.parametrize("scale", [1.0, 64.0, 4096.0])
def test_float16_reads_as_numpys_cast_at_every_value(scale):
    """The reader casts float16 by table look-up (`stage.reader._copy_out`: numpy's cast is ~5x slower on
    the subnormal values that 40% of a study store's cbed are): the same bits as numpy's cast and scale, at
    every float16 value, subnormals, infinities and NaNs included, into a new array or a loader's buffer."""
    from stage.reader import _copy_out

    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(256, 16, 16)
    with np.errstate(invalid="ignore"):
        want = every.astype(np.float32) if scale == 1.0 else np.multiply(every, np.float32(1 / scale))
    assert _copy_out(every, np.float32, None, scale).tobytes() == want.tobytes()
    buffer = np.empty(every.shape, np.float32)
    assert _copy_out(every, None, buffer, scale) is buffer and buffer.tobytes() == want.tobytes()


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
    assert {s["material_id"] for s in manifest["samples"]} == {s.meta.material_id for s in samples}
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
    assert both[3].meta.material_id == "mp-901"
    assert both.manifest["count"] == 4 and len(both.manifests) == 2
    assert stage.find_stores(tmp_path / "data" / "w0") == [tmp_path / "data" / "w0"]


# ------------------------------------------------------------------------------ a full store

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


def test_readahead_follows_the_record_size(tmp_path):
    write_store(tmp_path / "small", make_samples(2))
    write_store(tmp_path / "large", [make_sample("mp-1", scan=(4, 4), px=256)], F32)  # 4 MiB record
    assert stage.open_store(tmp_path / "small").readahead is False
    large = stage.open_store(tmp_path / "large")
    assert large.readahead is True
    assert large[0].cbed.tobytes() == make_sample("mp-1", scan=(4, 4), px=256).cbed.tobytes()
    assert stage.open_store(tmp_path / "large", readahead=False).readahead is False
