"""The torch pipeline: Normalizer, SampleDataset, make_loader (workers, sharding, determinism)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import stage
from namsa.errors import UserError
from stage.dataset import batch_to_device, collate_samples
from stage.sampler import ShardedBatchSampler
from stage.transforms import intensity_scale
from stage_helpers import CONFIG_HASH, make_sample, write_store_with_corrupt_density, write_stores

CFG = stage.DataConfig(split_fractions=(0.6, 0.2, 0.2), num_workers=0)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Three stores (three writers) of 2 variants x 6 materials each."""
    root = tmp_path_factory.mktemp("data")
    write_stores(root, 3, 6, CFG)
    return root


def test_normalizer_matches_statistics_of_the_train_split(data_dir):
    norm = stage.Normalizer.fit(data_dir, "sqrt")
    stores = stage.open_stores(data_dir)
    train = [stores[i] for i in stores.indices("train")]
    assert norm.intensity_scale == intensity_scale(8)
    cbed = np.stack([s.cbed.astype(np.float64) for s in train]) * norm.intensity_scale
    cbed = np.sqrt(cbed - cbed.min(axis=(-2, -1), keepdims=True))
    assert norm.cbed_mean == pytest.approx(cbed.mean(), rel=1e-6)
    assert norm.cbed_std == pytest.approx(cbed.std(), rel=1e-6)
    pot = np.stack([s.potential for s in train]).astype(np.float64)
    assert norm.targets["potential"] == pytest.approx((pot.mean(), pot.std()), rel=1e-6)
    out = norm.cbed(np.stack([s.cbed for s in train]))
    assert out.dtype == np.float32
    assert abs(float(out.mean())) < 1e-4 and float(out.std()) == pytest.approx(1.0, rel=1e-4)


@pytest.mark.parametrize("transform", ["none", "log1p", "sqrt"])
def test_normalizer_numpy_torch_and_round_trips_agree(data_dir, transform):
    norm = stage.Normalizer.fit(data_dir, transform)
    again = stage.Normalizer.from_dict(json.loads(json.dumps(norm.to_dict())))
    assert again == norm
    x = stage.open_store(data_dir / "w0")[0].cbed
    batch = np.stack([x, x])
    np.testing.assert_allclose(norm.cbed(torch.from_numpy(batch)).numpy(), norm.cbed(batch), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(norm.cbed(x), norm.cbed(batch)[1], rtol=1e-6)
    y = np.linspace(-3, 30, 16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_allclose(norm.target_inverse(norm.target(y, "density"), "density"), y, rtol=1e-5)
    with pytest.raises(UserError, match="known"):
        norm.target(y, "charge")


def test_dataset_items_and_normalisation(data_dir):
    norm = stage.Normalizer.fit(data_dir, "log1p")
    ds = stage.SampleDataset(data_dir, "train", norm, targets=("potential", "density"))
    assert len(ds) == len(stage.open_stores(data_dir).indices("train"))
    item = ds[1]
    assert item["cbed"].dtype == torch.float32 and item["cbed"].shape == (4, 8, 8)
    assert item["target"].dtype == torch.float32 and item["target"].shape == (2, 8, 8)
    assert item["index"] == 1
    raw = next(s for s in stage.open_stores(data_dir) if s.id == ds.sample_id(1))
    np.testing.assert_allclose(item["cbed"].numpy(), norm.cbed(raw.cbed), rtol=1e-6)
    np.testing.assert_allclose(item["target"][1].numpy(), norm.target(raw.density, "density"), rtol=1e-6)
    assert len(stage.SampleDataset(data_dir, "train", norm, max_samples=3)) == 3
    with pytest.raises(stage.EmptyStoreError):
        stage.SampleDataset(data_dir, "train", norm, max_samples=0)


def test_raw_fp16_cbed_normalised_on_the_device_matches(data_dir):
    norm = stage.Normalizer.fit(data_dir, "log1p")
    ds = stage.SampleDataset(data_dir, "dev", norm)
    raw = stage.SampleDataset(data_dir, "dev", norm, raw_cbed=True)
    assert raw[0]["cbed"].dtype == torch.float16
    moved = batch_to_device(collate_samples([raw[0]]), "cpu", norm)
    assert float(moved["cbed_scale"][0]) == intensity_scale(8)
    np.testing.assert_allclose(moved["cbed"][0].numpy(), ds[0]["cbed"].numpy(), rtol=1e-5, atol=1e-6)


def test_loader_with_two_workers_reads_everything(data_dir):
    norm = stage.Normalizer.fit(data_dir, "log1p")
    ds = stage.SampleDataset(data_dir, None, norm)
    cfg = stage.DataConfig(num_workers=2, prefetch_factor=2)
    loader = stage.make_loader(ds, cfg, batch_size=5, shuffle=False)
    seen, cbeds = [], {}
    for batch in loader:
        assert batch["cbed"].shape[1:] == (4, 8, 8) and batch["target"].shape[1:] == (1, 8, 8)
        seen += batch["index"].tolist()
        cbeds.update(zip(batch["index"].tolist(), batch["cbed"]))
    assert sorted(seen) == list(range(len(ds)))
    for k in (0, len(ds) - 1):
        torch.testing.assert_close(cbeds[k], ds[k]["cbed"])


@pytest.mark.parametrize("n_stores", [3, 1])
@pytest.mark.parametrize("drop_last", [False, True])
def test_unique_shards_are_disjoint_and_cover_the_data(data_dir, n_stores, drop_last):
    paths = stage.find_stores(data_dir)[:n_stores]
    ds = stage.SampleDataset(paths, None, None)
    ranks = [ShardedBatchSampler(ds, 2, rank=r, world_size=2, shuffle=True, seed=3, drop_last=drop_last,
                                 shard_mode="unique") for r in range(2)]
    per_rank = [set(i for b in s for i in b) for s in ranks]
    assert not per_rank[0] & per_rank[1], "unique shards overlap"
    assert len(ranks[0]) == len(ranks[1])
    if not drop_last:
        assert per_rank[0] | per_rank[1] == set(range(len(ds)))
    if n_stores == 3:  # whole stores per rank: rank 0 reads stores 0 and 2, rank 1 store 1
        groups = ds.store_groups()
        assert per_rank[1] <= set(groups[1])


def test_shared_mode_uses_a_distributed_sampler_over_all_samples(data_dir):
    ds = stage.SampleDataset(data_dir, None, None)
    loaders = [stage.make_loader(ds, CFG, 4, rank=r, world_size=2, shuffle=True, seed=1, drop_last=False,
                                 shard_mode="shared") for r in range(2)]
    assert isinstance(loaders[0].batch_sampler.sampler, torch.utils.data.DistributedSampler)
    seen = [[i for b in ld.batch_sampler for i in b] for ld in loaders]
    assert set(seen[0]) | set(seen[1]) == set(range(len(ds)))
    assert len(seen[0]) == len(seen[1]) == -(-len(ds) // 2)
    loaders[0].set_epoch(1)
    assert [i for b in loaders[0].batch_sampler for i in b] != seen[0]


@pytest.mark.parametrize("mode", ["unique", "shared"])
def test_batches_are_deterministic_and_resumable(data_dir, mode):
    ds = stage.SampleDataset(data_dir, None, None)

    def batches(epoch, skip=0):
        loader = stage.make_loader(ds, CFG, 3, rank=1, world_size=2, seed=5, shard_mode=mode)
        loader.set_epoch(epoch)
        loader.skip_batches(skip)
        return [b["index"].tolist() for b in loader]

    first = batches(2)
    assert first == batches(2)
    assert first != batches(3)
    assert batches(2, skip=2) == first[2:]


@pytest.mark.parametrize("drop_last", [True, False])
def test_local_mode_reads_the_whole_private_shard_to_the_agreed_count(data_dir, drop_last):
    """shard_mode='local': the dataset is this rank's staged shard; every sample of it is read,
    reshuffled per epoch and rank, truncated (or wrapped) to the count the ranks agreed on."""
    paths = stage.find_stores(data_dir)
    own = stage.SampleDataset(paths[:1], None, None)  # rank 1's private data
    whole = [i for b in stage.make_loader(own, CFG, 3, rank=1, world_size=2, seed=5, drop_last=drop_last,
                                          shard_mode="local").batch_sampler for i in b]
    assert sorted(whole) == list(range(len(own)))
    agreed = len(own) - 2
    loader = stage.make_loader(own, CFG, 3, rank=1, world_size=2, seed=5, drop_last=drop_last, shard_mode="local",
                               samples_per_rank=agreed)
    assert len(loader) == (agreed // 3 if drop_last else -(-agreed // 3))
    indices = [i for b in loader.batch_sampler for i in b]
    assert indices == whole[:agreed][:len(loader) * 3]
    other_rank = stage.make_loader(own, CFG, 3, rank=0, world_size=2, seed=5, drop_last=drop_last, shard_mode="local")
    assert [i for b in other_rank.batch_sampler for i in b] != whole  # each rank its own shuffle
    longer = stage.make_loader(own, CFG, 3, rank=1, world_size=2, seed=5, drop_last=drop_last, shard_mode="local",
                               samples_per_rank=len(own) + 2)
    assert [i for b in longer.batch_sampler for i in b] == (whole + whole[:2])[:len(longer) * 3]
    with pytest.raises(UserError, match="samples_per_rank"):
        stage.make_loader(own, CFG, 3, shard_mode="unique", samples_per_rank=4)


def test_dataset_skip_corrupt_substitutes_and_warns(tmp_path):
    samples = write_store_with_corrupt_density(tmp_path / "s", 3)
    ds = stage.SampleDataset(tmp_path / "s", None, None, targets=("density",))
    bad = [k for k in range(3) if ds.sample_id(k) == samples[1].id][0]
    with pytest.raises(stage.CorruptRecordError, match=samples[1].id):
        ds[bad]
    skipping = stage.SampleDataset(tmp_path / "s", None, None, targets=("density",), skip_corrupt=True)
    with pytest.warns(RuntimeWarning, match=samples[1].id):
        item = skipping[bad]
    assert item["index"] == bad
    assert not torch.equal(item["target"][0], torch.from_numpy(samples[1].density))


def test_bad_dataset_arguments_are_user_errors(data_dir):
    with pytest.raises(UserError, match="split"):
        stage.SampleDataset(data_dir, "validation", None)
    with pytest.raises(UserError, match="targets"):
        stage.SampleDataset(data_dir, "train", None, targets=("charge",))
    ds = stage.SampleDataset(data_dir, "dev", None)
    with pytest.raises(stage.EmptyStoreError, match="batch"):
        stage.make_loader(ds, CFG, batch_size=1000)


def test_real_simulated_store_feeds_the_loader(tiny_data_dir):
    """The shared store of real multislice samples: fit, normalise, load with workers, batch of 1."""
    norm = stage.Normalizer.fit(tiny_data_dir, "log1p")
    assert norm.intensity_scale == intensity_scale(16)
    ds = stage.SampleDataset(tiny_data_dir, "train", norm, targets=("potential", "density"))
    loader = stage.make_loader(ds, stage.DataConfig(num_workers=2), batch_size=1, shuffle=True, seed=0)
    seen = []
    for batch in loader:
        assert batch["cbed"].shape == (1, 64, 16, 16) and batch["target"].shape == (1, 2, 16, 16)
        assert torch.isfinite(batch["cbed"]).all() and torch.isfinite(batch["target"]).all()
        seen += batch["index"].tolist()
    assert sorted(seen) == list(range(len(ds)))
    cbed = torch.cat([ds[k]["cbed"][None] for k in range(len(ds))])
    assert abs(float(cbed.mean())) < 0.05 and abs(float(cbed.std()) - 1) < 0.05  # fitted on train


def test_statistics_of_large_stacks_use_every_kth_pattern():
    from stage.stats import STATS_MAX_VALUES, sample_statistics

    rng = np.random.default_rng(1)
    cbed = rng.gamma(0.5, size=(64, 64, 64)).astype(np.float32)  # 262144 values
    stride = -(-cbed.size // STATS_MAX_VALUES)
    assert stride == 1
    exact = sample_statistics(cbed, {})["cbed"]["sqrt"]
    shifted = np.sqrt(cbed - cbed.min(axis=(1, 2), keepdims=True)).astype(np.float64)
    assert exact[0] == shifted.size and exact[1] == pytest.approx(shifted.mean(), rel=1e-6)
    big = np.repeat(cbed, 32, axis=0)  # 8.4M values: every 3rd pattern is used
    sub = sample_statistics(big, {})["cbed"]["sqrt"]
    assert sub[0] == big[:: -(-big.size // STATS_MAX_VALUES)].size < big.size
    assert sub[1] == pytest.approx(exact[1], rel=1e-3)


@pytest.mark.gpu
def test_pinned_fp16_batches_normalise_on_the_gpu(data_dir):
    norm = stage.Normalizer.fit(data_dir, "log1p")
    raw = stage.SampleDataset(data_dir, None, norm, raw_cbed=True)
    ref = stage.SampleDataset(data_dir, None, norm)
    loader = stage.make_loader(raw, stage.DataConfig(num_workers=2, pin_memory=True), 2, shuffle=False)
    batch = next(iter(loader))
    assert batch["cbed"].is_pinned() and batch["cbed"].dtype == torch.float16
    on_gpu = batch_to_device(batch, "cuda", norm)
    assert on_gpu["cbed"].is_cuda
    want = torch.stack([ref[int(k)]["cbed"] for k in batch["index"]])
    torch.testing.assert_close(on_gpu["cbed"].cpu(), want, rtol=1e-4, atol=1e-4)


def test_unique_mode_balances_stores_of_different_sizes(tmp_path):
    sizes = [6, 1, 1, 2, 2]
    for w, n in enumerate(sizes):
        with stage.StoreWriter(tmp_path / f"w{w}", config_hash=CONFIG_HASH, data_cfg=CFG) as writer:
            for m in range(n):
                writer.put(make_sample(f"mp-{w}-{m}"))
    ds = stage.SampleDataset(tmp_path, None, None)
    ranks = [ShardedBatchSampler(ds, 1, rank=r, world_size=2, drop_last=True) for r in range(2)]
    groups = ds.store_groups()
    for sampler in ranks:  # each rank holds whole stores
        mine = set(sampler.shards[sampler.rank])
        assert all(set(g) <= mine or not set(g) & mine for g in groups)
    assert sorted(len(s.shards[s.rank]) for s in ranks) == [6, 6]
    assert len(ranks[0]) == len(ranks[1]) == 6
