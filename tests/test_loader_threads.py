"""The buffer-reusing reader-thread loader (``DataConfig.loader = "threads"``) against the
worker-process DataLoader path: same batches, reused buffers, corruption handling."""
from __future__ import annotations

import gc

import pytest
import torch

import stage
from stage.loader import THREADS_MIN_SAMPLE_BYTES, choose_loader
from stage.threadloader import ThreadLoader
from stage_helpers import (CONFIG_HASH, flip_byte_inside, make_sample, write_store_with_corrupt_density,
                           write_stores)

CFG = stage.DataConfig(split_fractions=(0.6, 0.2, 0.2), num_workers=0, loader="processes")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Two stores (two writers) of 2 variants x 5 materials each."""
    root = tmp_path_factory.mktemp("data")
    write_stores(root, 2, 5, CFG)
    return root


def epochs(loader, epoch_skips):
    """Cloned batches of each (epoch, skip) in turn; clones, because ring buffers are reused."""
    out = []
    for epoch, skip in epoch_skips:
        loader.set_epoch(epoch)
        loader.skip_batches(skip)
        out.append([{k: v.clone() for k, v in b.items()} for b in loader])
    return out


@pytest.mark.parametrize("raw_cbed", [False, True])
@pytest.mark.parametrize("threads", [0, 2])
def test_threads_yield_the_same_batches_as_processes(data_dir, raw_cbed, threads):
    norm = stage.Normalizer.fit(data_dir, "log1p", split="train")
    ds = stage.SampleDataset(data_dir, None, norm, targets=("potential", "density"), raw_cbed=raw_cbed)
    plan = [(0, 0), (1, 0), (1, 2), (3, 1)]

    def run(loader_kind, drop_last):
        cfg = CFG.model_copy(update={"loader": loader_kind, "num_workers": threads if loader_kind == "threads" else 0})
        loader = stage.make_loader(ds, cfg, 3, rank=1, world_size=2, seed=7, drop_last=drop_last)
        assert isinstance(loader, ThreadLoader) == (loader_kind == "threads")
        return epochs(loader, plan)

    for drop_last in (True, False):  # False: a ragged last batch
        expected, got = run("processes", drop_last), run("threads", drop_last)
        assert [len(e) for e in got] == [len(e) for e in expected] and len(expected[0]) >= 2
        assert [[b["index"].tolist() for b in e] for e in got] != [[]] * len(plan)
        for e_exp, e_got in zip(expected, got):
            for b_exp, b_got in zip(e_exp, e_got):
                assert b_exp.keys() == b_got.keys()
                for k in b_exp:
                    assert b_exp[k].dtype == b_got[k].dtype and torch.equal(b_exp[k], b_got[k]), k


def test_ring_buffers_are_reused_and_the_previous_batch_survives_a_fetch(data_dir):
    ds = stage.SampleDataset(data_dir, None, None)
    cfg = CFG.model_copy(update={"loader": "threads", "num_workers": 2, "prefetch_factor": 2})
    loader = stage.make_loader(ds, cfg, 1, shuffle=False)
    assert loader.depth == 4 and len(loader) == len(ds) > 2 * loader.depth
    pointers, previous = [], None
    for _ in range(2):  # two epochs: the ring is allocated once
        for batch in loader:
            pointers.append(batch["cbed"].data_ptr())
            if previous is not None:  # the batch held across this fetch is intact
                index, cbed = previous
                assert torch.equal(cbed, ds[index]["cbed"]), "held batch overwritten"
            previous = (int(batch["index"][0]), batch["cbed"][0])
    assert len(set(pointers)) == loader.depth
    assert pointers[: loader.depth] * 2 == pointers[loader.depth: 3 * loader.depth]


def test_breaking_out_and_restarting_is_exact(data_dir):
    ds = stage.SampleDataset(data_dir, None, None)
    cfg = CFG.model_copy(update={"loader": "threads", "num_workers": 2})
    loader = stage.make_loader(ds, cfg, 2, seed=3)
    loader.set_epoch(1)
    full = [b["index"].tolist() for b in loader]
    for b in loader:  # abandon an epoch midway, with reads in flight
        break
    loader.skip_batches(2)
    assert [b["index"].tolist() for b in loader] == full[2:]
    loader.close()
    del loader
    gc.collect()


def test_corruption_raises_or_is_skipped_in_the_threads(tmp_path):
    samples = write_store_with_corrupt_density(tmp_path / "s", 4)
    cfg = stage.DataConfig(loader="threads", num_workers=2)
    ds = stage.SampleDataset(tmp_path / "s", None, None, targets=("density",))
    with pytest.raises(stage.CorruptRecordError, match=samples[1].id):
        list(stage.make_loader(ds, cfg, 1, shuffle=False))
    skipping = stage.SampleDataset(tmp_path / "s", None, None, targets=("density",), skip_corrupt=True)
    with pytest.warns(RuntimeWarning, match=samples[1].id):
        got = [b["target"][0, 0].clone() for b in stage.make_loader(skipping, cfg, 1, shuffle=False)]
    assert len(got) == 4
    bad = [k for k in range(4) if skipping.sample_id(k) == samples[1].id][0]
    assert torch.equal(got[bad], got[(bad + 1) % 4])  # substituted by the next readable record


def test_auto_picks_threads_for_study_and_paper_sized_samples(data_dir):
    ds = stage.SampleDataset(data_dir, None, None)
    auto = stage.DataConfig()
    assert choose_loader(ds, auto) == "processes"  # 2 x 2 x 8 x 8 float32: tiny
    ds.stores.manifest["arrays"]["cbed"]["shape"] = [1024, 32, 32]   # the study's stacks: 4 MiB of float32
    assert choose_loader(ds, auto) == "threads"   # the ring was 4x a worker process there (RESULTS.md, stage)
    ds.stores.manifest["arrays"]["cbed"]["shape"] = [1024, 256, 256]  # what auto looks at
    assert 1024 * 256 * 256 * 4 >= THREADS_MIN_SAMPLE_BYTES
    assert choose_loader(ds, auto) == "threads"
    assert choose_loader(ds, stage.DataConfig(loader="processes")) == "processes"


@pytest.mark.parametrize("where", ["cbed", "meta"])
def test_checksum_verified_while_copying_catches_any_flipped_byte(tmp_path, where):
    """read_into verifies the checksum during the copy (one pass): a flip in the bulk array
    region or in the bytes between arrays must still fail, naming store and key."""
    # 64 KiB records live in LMDB overflow pages, so their bytes occur exactly once in data.mdb
    samples = [make_sample(f"mp-{i}", px=64) for i in range(2)]
    with stage.StoreWriter(tmp_path / "s", config_hash=CONFIG_HASH,
                           data_cfg=stage.DataConfig(cbed_dtype="float32")) as w:
        for s in samples:
            w.put(s)
    if where == "cbed":
        flip_byte_inside(tmp_path / "s", samples[1].cbed.tobytes()[40_000:40_064])
    else:  # a letter of the sample id inside the record's JSON header: still parseable
        with stage.open_store(tmp_path / "s") as reader:
            record, _ = reader.read_raw(reader.ids().index(samples[1].id))
        at = bytes(record).find(samples[1].id.encode())
        flip_byte_inside(tmp_path / "s", bytes(record[at - 12: at + len(samples[1].id)]), offset=12 + 1)
    ds = stage.SampleDataset(tmp_path / "s", None, None)
    bad = [k for k in range(2) if ds.sample_id(k) == samples[1].id][0]
    cbed, target = torch.empty((1, *ds.cbed_shape)), torch.empty((1, *ds.target_shape))
    ds.read_into(1 - bad, cbed[0].numpy(), target[0].numpy())  # the intact record reads fine
    with pytest.raises(stage.CorruptRecordError, match=samples[1].id):
        ds.read_into(bad, cbed[0].numpy(), target[0].numpy())
