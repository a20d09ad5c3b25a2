"""Test data for the stage tests: Samples built from numpy arrays with complete, valid meta.

These are real Samples (the contract type), not mocks: the stage code under test stores and reads
them exactly as it would simulated ones.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np

from namsa.material_id import sample_id
from namsa.sample import Sample, SampleMeta

CONFIG_HASH = "c0ffee" * 10 + "abcd"
#: the tests folder: a child process started by `run_child` imports this module from it
HERE = Path(__file__).parent


def make_sample(material_id: str, variant: int = 0, *, scan: tuple[int, int] = (2, 2), px: int = 8,
                seed: int | None = None, config_hash: str = CONFIG_HASH) -> Sample:
    """A Sample with smooth positive cbed (<= 1, like normalised intensities) and float32 targets."""
    # crc32, not hash(): str hashing is salted per process and subprocess tests rebuild the same data
    rng = np.random.default_rng(seed if seed is not None else zlib.crc32(f"{material_id}/{variant}".encode()))
    s = scan[0] * scan[1]
    yy, xx = np.mgrid[:px, :px] - px // 2
    disc = np.exp(-(yy**2 + xx**2) / (0.1 * px * px))
    cbed = (disc[None] * rng.uniform(0.2, 1.0, (s, 1, 1)) + rng.uniform(0, 1e-3, (s, px, px)))
    cbed /= cbed.sum(axis=(1, 2), keepdims=True)
    zone = [1, 1, 0]
    meta = SampleMeta.from_json({   # the JSON form a store holds, read as a store's reader reads it
        "sample_id": sample_id(material_id, zone, variant, config_hash),
        "material_id": material_id, "formula": "Si", "elements": ["Si"], "zone_axis": zone,
        "variant": variant, "thickness_A": 100.0, "energy_kv": 200.0, "semiangle_mrad": 20.0,
        "aberrations": {"C1_A": 0.0, "C3_mm": 0.0}, "sampling_A": [0.1, 0.1], "scan_shape": list(scan),
        "scan_positions_A": [[float(y), float(x)] for y in range(scan[0]) for x in range(scan[1])],
        "fov_A": [0.0, 0.0, 4.0, 4.0], "seed": int(variant), "code_version": "0.1.0",
        "config_hash": config_hash,
    })
    potential = rng.normal(10.0, 3.0, (px, px)).astype(np.float32)
    density = rng.gamma(2.0, 1.0, (px, px)).astype(np.float32)
    return Sample(cbed=cbed.astype(np.float32), potential=potential, density=density, meta=meta)


def check_poisson(noisy: np.ndarray, clean: np.ndarray, electrons: float) -> None:
    """Shot-noise draws against their law (stage.dose, stage.device_noise, stage.resident): ``noisy``
    (K, ...) draws of counts / electrons with counts ~ Poisson(electrons * clean), K large (~400)."""
    k = noisy.shape[0]
    lit = clean > 0
    np.testing.assert_array_equal(noisy[:, ~lit], 0.0)  # zero intensity: no electron ever lands there
    var = clean[lit] / electrons  # the Poisson variance of counts / N
    z = (noisy.mean(axis=0)[lit] - clean[lit]) / np.sqrt(var / k)
    assert abs(z.mean()) < 5 / np.sqrt(z.size) and np.abs(z).max() < 6, "mean of the noisy pattern != clean"
    ratio = noisy.var(axis=0, ddof=1)[lit] / var
    assert abs(ratio.mean() - 1.0) <= 5 * np.sqrt(2 / k / ratio.size), "mean variance != I / N"
    assert np.all(np.abs(ratio - 1) < 6 * np.sqrt(2 / k)), "per-pixel variance != I / N"
    # the counts are integers: noisy * N lies on the integers
    np.testing.assert_allclose(noisy * electrons, np.round(noisy * electrons), atol=1e-6)


def make_samples(n_materials: int, variants: int = 1, **kw) -> list[Sample]:
    return [make_sample(f"mp-{100 + m}", v, **kw) for m in range(n_materials) for v in range(variants)]


def flip_byte_inside(store, needle: bytes, offset: int = 5) -> None:
    """Flip one bit of the on-disk record bytes that contain ``needle`` (unique in data.mdb).

    Records above ~2 KiB live in LMDB overflow pages that are never copied, so their bytes occur
    exactly once in the file; small records can leave stale copies in freed pages, hence the check.
    """
    from pathlib import Path

    data_file = Path(store) / "data.mdb"
    raw = bytearray(data_file.read_bytes())
    at = raw.find(needle)
    assert at >= 0 and raw.find(needle, at + 1) < 0, "needle must occur exactly once in data.mdb"
    raw[at + offset] ^= 0x40
    data_file.write_bytes(bytes(raw))


def write_stores(root, n_stores: int, n_materials: int, data_cfg, variants: int = 2) -> None:
    """``n_stores`` stores (one per writer) under ``root`` named w0, w1, ..., each holding
    ``variants`` variants of ``n_materials`` materials named ``mp-<store><material>``."""
    import stage

    for w in range(n_stores):
        with stage.StoreWriter(root / f"w{w}", config_hash=CONFIG_HASH, data_cfg=data_cfg) as writer:
            for m in range(n_materials):
                for v in range(variants):
                    writer.put(make_sample(f"mp-{w}{m}", v))


def write_store_with_corrupt_density(path, n: int) -> list[Sample]:
    """A float32 store at ``path`` of ``n`` 16 px samples whose second record has one flipped
    byte inside its density array; returns the samples as written (the corrupt one is [1])."""
    import stage

    samples = [make_sample(f"mp-{i}", px=16) for i in range(n)]
    with stage.StoreWriter(path, config_hash=CONFIG_HASH,
                           data_cfg=stage.DataConfig(cbed_dtype="float32")) as writer:
        for sample in samples:
            writer.put(sample)
    flip_byte_inside(path, samples[1].density.tobytes()[:64])
    return samples


def write_store(path, samples, cfg=None, **kw) -> list[bool]:
    """``samples`` put into the store at ``path`` (``cfg``: its DataConfig); whether each was new."""
    import stage

    with stage.StoreWriter(path, config_hash=CONFIG_HASH, data_cfg=cfg or stage.DataConfig(), **kw) as w:
        return [w.put(s) for s in samples]


def run_child(code: str, *args: str, **kw) -> subprocess.Popen:
    """``python -c code args`` with stdout and stderr piped as text; it may import stage and stage_helpers."""
    env = dict(os.environ, PYTHONPATH=f"{HERE}:{HERE.parent}")
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)
