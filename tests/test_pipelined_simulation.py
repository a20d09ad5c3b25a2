"""Samples prepared ahead on host threads (namsa.pipelined, simulation.host_threads) are the samples
of the sequential path, bit for bit, stored in the same order with failures recorded the same way.

The device path runs on the strict cupy stand-in (tests/strict_cupy.py): it finds host/device
mixing in the threads; it says nothing about overlap on a real GPU (benchmarks/bench_simulate.py
--host-vs-device models that).
"""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

import strict_cupy
from namsa.config import SimulationConfig
from namsa.pipelined import lookahead_threads, prepared_in_order
from namsa.simulate import simulate_sample

SMALL = dict(scan_shape=(4, 4), pattern_px=12, target_px=12, cell_lateral_A=8.0, thickness_A=8.0, sampling_A=0.12)
#: (source, zone axis, variant): the second draws no frozen phonons (frozen_phonon_fraction 0.5)
JOBS = [("Si-diamond", (1, 1, 0), 0), ("Si-diamond", (1, 0, 0), 2), ("NaCl-rocksalt", (1, 0, 0), 0)]


def _config(**kw) -> SimulationConfig:
    return SimulationConfig(**SMALL, variations={"frozen_phonon": True, "frozen_phonon_fraction": 0.5},
                            phonon_configs=2, **kw)


def _assert_same(a, b) -> None:
    assert a.id == b.id and a.meta == b.meta
    for name in ("cbed", "potential", "density"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name


def _pipelined(cfg: SimulationConfig) -> list:
    samples, ahead = [], []
    for slot in prepared_in_order(JOBS, cfg):
        ahead.append(slot.ahead)
        samples.append(slot.sample())
    return samples, ahead


def test_host_threads_stay_out_of_the_physics_hash_and_must_be_positive():
    from pydantic import ValidationError

    pinned = "4ea27526f8f8206854b1024ec94cbe527119c7a11522c8037edd80faf8e32329"
    assert SimulationConfig(host_threads=4).physics_hash() == SimulationConfig().physics_hash() == pinned
    with pytest.raises(ValidationError, match="host_threads"):
        SimulationConfig(host_threads=0)
    assert lookahead_threads(SimulationConfig()) == 0   # CPU default: one after the other
    assert lookahead_threads(SimulationConfig(host_threads=3)) == 3
    assert lookahead_threads(SimulationConfig(device="cuda")) == 1   # a GPU always prepares one ahead


def test_samples_prepared_ahead_on_cpu_equal_the_sequential_ones():
    sequential = [simulate_sample(source, axis, _config(), variant) for source, axis, variant in JOBS]
    # two frozen-phonon configurations (the next one prepared while one runs) and a perfect crystal
    assert [s.meta.frozen_phonon for s in sequential] == [True, False, True]
    assert [s.meta.phonon_configs for s in sequential] == [2, 1, 2]
    inline, ahead = _pipelined(_config())
    assert ahead == [False] * len(JOBS)   # host_threads=1 on CPU: nothing runs ahead
    threaded, ahead = _pipelined(_config(host_threads=2))
    assert ahead == [True] * len(JOBS)
    for seq, one, two in zip(sequential, inline, threaded):
        _assert_same(one, seq)
        _assert_same(two, seq)


def test_samples_prepared_ahead_on_the_device_path_equal_the_sequential_ones(monkeypatch):
    strict_cupy.install(monkeypatch)
    cfg = _config(device="cuda", host_threads=2)
    sequential = [simulate_sample(source, axis, cfg, variant) for source, axis, variant in JOBS]
    threaded, ahead = _pipelined(cfg)
    assert ahead == [True] * len(JOBS)
    for seq, two in zip(sequential, threaded):
        _assert_same(two, seq)


def test_on_a_second_gpu_every_thread_works_on_that_gpu_and_no_current_device_is_switched(monkeypatch):
    """device: cuda:1 with samples prepared on pool threads (current device 0 when they start): the
    stand-in's kernels refuse an array of another device than the thread's current one, as cupy's do,
    so any step that ran outside the backend's device scope fails here."""
    strict_cupy.install(monkeypatch, device_count=2)
    cfg = _config(device="cuda:1", host_threads=2)
    threaded, ahead = _pipelined(cfg)
    assert ahead == [True] * len(JOBS)
    sequential = [simulate_sample(source, axis, cfg, variant) for source, axis, variant in JOBS]
    for seq, two in zip(sequential, threaded):
        _assert_same(two, seq)
    assert strict_cupy.current_device() == 0   # a with block, not a global switch of the caller's device


def test_the_fft_check_runs_once_per_process_and_device(monkeypatch):
    from namsa import backend

    strict_cupy.install(monkeypatch, device_count=2)
    checks = []
    real_check = backend._check_one_fft
    monkeypatch.setattr(backend, "_check_one_fft", lambda b: checks.append(b.device_index) or real_check(b))
    for _ in range(3):
        backend.get_backend("cuda:0"), backend.get_backend("cuda:1"), backend.get_backend("cuda")
    assert sorted(checks) == [0, 1]


def test_leaving_the_loop_early_leaves_no_preparing_thread():
    cfg = _config(host_threads=2)
    for slot in prepared_in_order(JOBS, cfg):
        slot.discard()
        break
    assert not [t for t in threading.enumerate() if t.name.startswith("namsa-prepare")]


def _store(tmp_path, name: str, host_threads: int):
    """simulate_specs of three specs, one of them a material that fails to load, into a new store."""
    import namsa
    import stage
    from workflow.data_runners import simulate_specs

    cfg = _config(host_threads=host_threads)
    specs = [namsa.SampleSpec(m, axis, v) for m, axis, v in JOBS[:2]] + \
        [namsa.SampleSpec("Not-a-material", (1, 0, 0), 0), namsa.SampleSpec(*JOBS[2])]
    sources = {"Si-diamond": "Si-diamond", "NaCl-rocksalt": "NaCl-rocksalt",
               "Not-a-material": str(tmp_path / "missing.cif")}
    summary = simulate_specs(cfg, stage.DataConfig(), tmp_path / name / "store-000", specs, sources, progress=False)
    with stage.open_store(summary.store) as reader:
        return summary, reader.ids(), [reader.get(sid) for sid in reader.ids()]


def test_the_store_loop_with_host_threads_writes_the_same_samples_in_the_same_order(tmp_path):
    one, ids_one, samples_one = _store(tmp_path, "one", 1)
    two, ids_two, samples_two = _store(tmp_path, "two", 3)
    assert (two.written, two.skipped) == (one.written, one.skipped) == (3, 0)
    assert ids_two == ids_one and len(ids_one) == 3
    assert two.failed == one.failed and len(one.failed) == 1 and "\n" not in one.failed[0][1]
    for a, b in zip(samples_one, samples_two):
        _assert_same(a, b)


def test_the_gil_switch_interval_is_short_while_threads_prepare_ahead_and_restored_after():
    import sys

    from namsa.pipelined import GIL_SWITCH_S

    before = sys.getswitchinterval()
    seen = []
    for slot in prepared_in_order(JOBS[:2], _config(host_threads=2)):
        seen.append(sys.getswitchinterval())
        slot.discard()
    assert seen == [GIL_SWITCH_S] * 2 and sys.getswitchinterval() == before
    for slot in prepared_in_order(JOBS[:1], _config()):   # nothing ahead: nothing changed
        assert sys.getswitchinterval() == before


class _StopAfter(threading.Event):
    """A stop event (the DAG's Ctrl-C) that is set once ``n`` samples have been looked at."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        return self.n < 0


def test_a_stop_with_samples_prepared_ahead_closes_the_store_and_the_pool(tmp_path):
    import namsa
    import stage
    from workflow.data_runners import simulate_specs

    specs = [namsa.SampleSpec(m, axis, v) for m, axis, v in JOBS]
    sources = {"Si-diamond": "Si-diamond", "NaCl-rocksalt": "NaCl-rocksalt"}
    summary = simulate_specs(_config(host_threads=2), stage.DataConfig(), tmp_path / "store-000", specs, sources,
                             progress=False, stop=_StopAfter(1))
    assert summary.stopped and summary.written == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("namsa-prepare")]
    with stage.open_store(summary.store) as reader:
        assert len(reader) == 1
        assert reader.ids() == [simulate_sample(*JOBS[0][:2], _config(), JOBS[0][2]).id]   # the first, whole


@pytest.mark.parametrize("host_threads", [1, 2])
def test_with_samples_prepared_ahead_each_store_write_runs_beside_the_next_sample(tmp_path, monkeypatch, host_threads):
    """With host threads running ahead (a GPU worker) sample n's store write runs on the store thread while the
    loop finishes sample n + 1 (workflow.store_behind); the sequential CPU loop writes in its own thread. Both
    store the same samples, counted once each, and leave no store thread behind."""
    import stage

    writes, real_put = [], stage.StoreWriter.put

    def put(self, sample):   # the real write, its thread noted
        writes.append(threading.current_thread().name)
        return real_put(self, sample)

    monkeypatch.setattr(stage.StoreWriter, "put", put)
    summary, ids, _ = _store(tmp_path, "store", host_threads)
    assert summary.written == 3 and len(ids) == 3 and len(summary.failed) == 1
    assert [name.startswith("namsa-store") for name in writes] == [host_threads > 1] * 3
    assert not [t for t in threading.enumerate() if t.name.startswith("namsa-store")]
    # the samples themselves equal the sequential loop's (test_the_store_loop_with_host_threads_writes_...)
    assert sorted(ids) == sorted(simulate_sample(source, axis, _config(), variant).id for source, axis, variant in JOBS)


def test_a_store_error_of_a_write_behind_is_raised_and_a_bad_sample_is_recorded(tmp_path):
    """The write in flight is settled before the next and on leaving: a store error (here a sample whose
    arrays the store cannot hold) is raised, not counted as a failed sample; a sample the write refuses for its
    own data is recorded as failed and the others are written."""
    import stage
    from workflow.data_runners import SimulateSummary
    from workflow.store_behind import WriteBehind

    cfg = _config(host_threads=2)
    first, second = (simulate_sample(*JOBS[i][:2], cfg, JOBS[i][2]) for i in (0, 2))
    third = simulate_sample(*JOBS[1][:2], cfg, JOBS[1][2])
    other = dataclasses.replace(third, cbed=np.ascontiguousarray(third.cbed[:, :8, :8]))   # patterns of another size
    bad = dataclasses.replace(second, cbed=second.cbed * np.float32(1e12))   # beyond float16: refused
    summary = SimulateSummary(store="s", planned=3)
    with stage.StoreWriter(tmp_path / "store", config_hash=cfg.physics_hash()) as writer:
        with WriteBehind(writer, summary, behind=True) as store:
            store.put(first.id, first)
            store.put(bad.id, bad)
        assert (summary.written, [sid for sid, _ in summary.failed]) == (1, [bad.id])
        with pytest.raises(stage.SchemaError):
            with WriteBehind(writer, summary, behind=True) as store:
                store.put(other.id, other)
        assert summary.written == 1 and len(summary.failed) == 1 and len(writer) == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("namsa-store")]
