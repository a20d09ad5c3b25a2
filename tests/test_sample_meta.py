"""`namsa.sample_meta.SampleMeta`, the typed record of ``Sample.meta``: JSON only at the stores' boundary,
exactly as stored (new and old stores), its derived numbers, a microscope scan's unknown fields, and no
keyed read of a meta anywhere else in the rooms."""
from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest

import stage
from namsa.config import SimulationConfig
from namsa.constants import wavelength_A
from namsa.errors import UserError
from namsa.icom import ScanCalibration
from namsa.sample import REQUIRED_META_KEYS, Sample
from namsa.sample_meta import SampleMeta, SampleMetaError
from namsa.simulate import simulate_sample
from stage_helpers import make_sample

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("namsa", "stage", "models", "evaluation", "workflow")
#: the one module that reads a meta by its JSON keys
OWNERS = {"namsa/sample_meta.py"}
#: ``meta["key"]``, ``x.meta["key"]``, ``reader.meta(i)["key"]`` and the same with ``.get("key"``
KEYED_READ = re.compile(r"""meta(\([^()]*\))?\s*(\[|\.get\()\s*["']""")

#: the keys of a meta as namsa wrote it before the targets' resolution, structure types, noise as simulated
#: and phonon averaging were recorded (namsa 7199464), plus one no namsa ever wrote
OLD_META = {
    "sample_id": "Si-diamond__1_1_0__v0__0123456789ab", "material_id": "Si-diamond", "formula": "Si",
    "elements": ["Si"], "zone_axis": [1, 1, 0], "variant": 0, "thickness_A": 40, "energy_kv": 200.0,
    "semiangle_mrad": 20.0, "aberrations": {"C1_A": 0.0, "C3_mm": 0.0}, "sampling_A": [0.12, 0.12],
    "scan_shape": [2, 2], "scan_positions_A": [[0.5, 0.25], [0.5, 2.25], [2.5, 0.25], [2.5, 2.25]],
    "fov_A": [0.0, 0.0, 4.0, 4.0], "seed": 7, "code_version": "0.1.0", "config_hash": "ab" * 32,
    "cell_A": [4.0, 4.0, 40.0], "gpts": [36, 36], "n_slices": 20, "slice_thickness_A": 2.0,
    "tilt_mrad": [0.0, 0.0], "frozen_phonon": False, "pattern_dk_inv_A": 0.2, "pattern_mrad_per_px": 5.0,
    "target_sampling_A": [0.5, 0.5], "intensity_kept_min": 0.99, "transmission_bandlimit_loss": 0.0,
    "strain": 0.0, "detector": {"name": "a later key", "px": [1, 2]},
}


@pytest.fixture(scope="module")
def simulated():
    cfg = SimulationConfig(scan_shape=(4, 4), pattern_px=16, target_px=8, thickness_A=10.0, cell_lateral_A=6.0,
                           variations={"dose_e_per_A2": 1000.0, "tilt_mrad": 2.0})
    return simulate_sample("Si-diamond", (1, 1, 0), cfg, variant=1)


def _stored(data: dict) -> str:
    """The meta's bytes in a store record (`stage.codec`: compact JSON, insertion order)."""
    return json.dumps(data, separators=(",", ":"))


def test_a_simulated_meta_is_stored_in_the_simulators_key_order_and_reads_back_equal(simulated):
    data = simulated.meta.to_json()
    assert list(data) == [
        "sample_id", "material_id", "formula", "prototype", "elements", "zone_axis", "variant", "thickness_A",
        "energy_kv", "semiangle_mrad", "aberrations", "sampling_A", "scan_shape", "scan_positions_A", "fov_A",
        "seed", "code_version", "config_hash", "cell_A", "gpts", "n_slices", "slice_thickness_A", "tilt_mrad",
        "frozen_phonon", "dose_e_per_A2", "pattern_dk_inv_A", "pattern_mrad_per_px", "target_sampling_A",
        "target_fwhm_A", "phonon_configs", "intensity_kept_min", "transmission_bandlimit_loss", "method", "strain"]
    assert isinstance(data["scan_positions_A"][0], list) and isinstance(data["zone_axis"], list)
    back = SampleMeta.from_json(json.loads(_stored(data)))
    assert back == simulated.meta and _stored(back.to_json()) == _stored(data)


def test_an_old_store_meta_reads_and_writes_back_byte_for_byte(tmp_path):
    meta = SampleMeta.from_json(OLD_META)
    assert _stored(meta.to_json()) == _stored(OLD_META)   # no key added (target_fwhm_A, prototype, ...), none lost
    assert meta.extra == {"detector": {"name": "a later key", "px": (1, 2)}} and meta.target_fwhm_A is None
    assert meta.thickness_A == 40 and meta.zone_axis == (1, 1, 0)
    sample = make_sample("mp-1", scan=(2, 2))
    old = Sample(cbed=sample.cbed, potential=sample.potential, density=sample.density, meta=meta)
    with stage.StoreWriter(tmp_path / "s", config_hash=OLD_META["config_hash"]) as writer:
        writer.put(old)
    read = stage.open_store(tmp_path / "s").meta(0)
    assert read == meta and _stored(read.to_json()) == _stored(OLD_META)


def test_derived_numbers_come_from_the_fields_once():
    meta = SampleMeta.from_json(OLD_META)
    assert meta.scan_step_A == (2.0, 2.0) and meta.scan_step_area_A2 == 4.0
    assert meta.reciprocal_sampling_inv_A == 0.2 and meta.fov_is_one_period is True
    assert meta.calibration == ScanCalibration(scan_shape=(2, 2), k_sampling_invA=(0.2, 0.2), energy_kv=200.0,
                                               scan_step_A=(2.0, 2.0), shift_frac=(-0.125, -0.0625), periodic=True)
    assert meta.calibration is meta.calibration   # computed once per record
    by_mrad = meta.replace(pattern_dk_inv_A=None)
    assert by_mrad.reciprocal_sampling_inv_A == pytest.approx(5.0e-3 / wavelength_A(200.0))
    assert meta.replace(pattern_mrad_per_px=None).angular_sampling_mrad == pytest.approx(0.2 * wavelength_A(200.0) * 1e3)
    assert pickle.loads(pickle.dumps(meta)) == meta


def test_a_microscope_scan_knows_only_its_scan_and_says_what_it_lacks():
    tile = SampleMeta(scan_shape=(4, 4), fov_A=(0.0, 0.0, 2.0, 2.0), energy_kv=300.0, pattern_dk_inv_A=0.1)
    assert tile.missing(("thickness_A", "formula", "seed", "energy_kv")) == ["thickness_A", "formula", "seed"]
    assert tile.fov_is_one_period is None and tile.calibration.periodic and tile.calibration.shift_frac == (0.0, 0.0)
    sample = make_sample("mp-1", scan=(4, 4))
    scan = Sample(cbed=sample.cbed, potential=sample.potential, density=sample.density, meta=tile)
    with pytest.raises(UserError, match="missing keys .*'sample_id'") as info:
        scan.validate()
    assert "\n" not in str(info.value)
    with pytest.raises(UserError, match="no sample_id"):
        scan.id


@pytest.mark.parametrize("data, match", [
    ({"fov_A": [0, 0, 1, 1]}, "lacks scan_shape"), ({"scan_shape": [2, 2]}, "lacks fov_A"),
    ({"scan_shape": [2, 0], "fov_A": [0, 0, 1, 1]}, "scan_shape must be two positive ints"),
    ({"scan_shape": [2, 2], "fov_A": [0, 0, 1]}, "fov_A must be"), ([1, 2], "JSON object"),
])
def test_a_meta_without_its_scan_is_refused_in_one_line(data, match):
    with pytest.raises(SampleMetaError, match=match) as info:
        SampleMeta.from_json(data)
    assert "\n" not in str(info.value) and isinstance(info.value, UserError)


def test_a_sample_with_a_dict_meta_is_refused():
    sample = make_sample("mp-1")
    loose = Sample(cbed=sample.cbed, potential=sample.potential, density=sample.density, meta=sample.meta.to_json())
    with pytest.raises(UserError, match="must be a namsa.sample_meta.SampleMeta"):
        loose.validate()
    assert not sample.meta.missing(REQUIRED_META_KEYS)


def _keyed_reads(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT).as_posix()}:{n}: {line.strip()}"
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if KEYED_READ.search(line)]


def test_no_module_but_the_owner_reads_a_meta_by_key():
    """A meta read by its JSON key outside `namsa.sample_meta` re-derives (or silently defaults) what the
    record owns: read the field, or add a derived property to the record."""
    found = [hit for room in ROOMS for path in sorted((ROOT / room).rglob("*.py"))
             if path.relative_to(ROOT).as_posix() not in OWNERS for hit in _keyed_reads(path)]
    assert not found, "keyed meta reads outside namsa/sample_meta.py:\n" + "\n".join(found)


def test_the_keyed_read_scan_finds_planted_reads(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('a = sample.meta["fov_A"]\nb = meta.get("thickness_A", 0.0)\nc = reader.meta(j)["scan_shape"]\n'
                       "d = meta.fov_A\ne = self._noise_meta[k]\n")
    hits = [line for line in planted.read_text().splitlines() if KEYED_READ.search(line)]
    assert hits == ['a = sample.meta["fov_A"]', 'b = meta.get("thickness_A", 0.0)', 'c = reader.meta(j)["scan_shape"]']
