"""The registry of microscope file formats (stage.microscope.formats): each format is one module
registered once, claims its own suffixes and no other format's, and the refusals that list the
readable types are built from it, so a format added there is read and listed with nothing else changed."""
from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from stage.microscope import ExperimentalInputError, LazyScan, read_scan
from stage.microscope import formats
from stage.microscope.formats import FORMATS, MODULES, FileFormat, format_of

FORMATS_DIR = Path(formats.__file__).parent
#: the readable types as `namsa reconstruct` has always listed them (docs/experimental-data.md's table)
LISTED = ".blo, .dm3, .dm4, .emd, .emi, .h5, .hdf5, .hspy, .mib, .ser, .xml, .zspy and Arina *_master.h5"


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_every_format_names_the_module_that_defines_it(fmt):
    module = importlib.import_module(fmt.module)
    assert module.FORMAT is fmt and fmt.module == f"{formats.__name__}.{fmt.module.rsplit('.', 1)[-1]}"
    assert (FORMATS_DIR / f"{fmt.module.rsplit('.', 1)[-1]}.py").is_file()


def test_every_format_module_is_registered_once():
    """A module in formats/ that is not in MODULES would never be read (base.py is the dataclass)."""
    on_disk = {p.stem for p in FORMATS_DIR.glob("*.py")} - {"__init__", "base"}
    assert sorted(MODULES) == sorted(on_disk) and len(set(MODULES)) == len(MODULES)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.reader is not None], ids=lambda f: f.name)
def test_every_rosettasciio_reader_a_format_names_exists(fmt):
    pytest.importorskip("rsciio")
    assert callable(importlib.import_module(fmt.reader).file_reader)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_every_format_claims_its_own_suffixes_and_name_rule(fmt):
    assert fmt.suffixes or fmt.name_ends, f"{fmt.name} claims no file"
    assert fmt.read is not None or fmt.reader is not None, f"{fmt.name} has no reader"
    for suffix in fmt.suffixes:
        assert suffix == suffix.lower() and suffix.startswith(".")
        assert format_of(Path(f"scan{suffix}")) is fmt and format_of(Path(f"SCAN{suffix.upper()}")) is fmt
    if fmt.name_ends is not None:
        assert format_of(Path(f"scan{fmt.name_ends}")) is fmt and format_of(Path(f"SCAN{fmt.name_ends.upper()}")) is fmt


def test_no_two_formats_claim_one_suffix_and_no_refused_suffix_is_claimed():
    claimed = [s for f in FORMATS for s in f.suffixes]
    assert len(claimed) == len(set(claimed)), sorted(s for s in claimed if claimed.count(s) > 1)
    refused = [s for f in FORMATS for s, _ in f.refused]
    assert not set(refused) & set(claimed) and len(refused) == len(set(refused))
    rules = [f.name_ends for f in FORMATS if f.name_ends is not None]
    assert len(rules) == len(set(rules))
    assert format_of(Path("scan.h5")).name == "HyperSpy HDF5"  # the Arina name rule takes only its own


def test_the_readable_types_are_listed_from_the_registry(tmp_path):
    assert formats.readable() == LISTED
    (tmp_path / "scan.tif").write_bytes(b"II*\0")
    with pytest.raises(ExperimentalInputError) as unknown:
        read_scan(tmp_path / "scan.tif")
    assert str(unknown.value) == (f"{tmp_path / 'scan.tif'}: unknown file type '.tif'; namsa reconstruct reads "
                                  f"{LISTED} (convert other formats to .hspy)")
    with pytest.raises(ExperimentalInputError, match=r"does not exist .*\(\.blo, .*, \.zspy\)$"):
        read_scan(tmp_path / "absent.hspy")
    with pytest.raises(ExperimentalInputError, match=r"EMPAD \.raw file is read through its XML header"):
        (tmp_path / "scan.raw").write_bytes(b"\0" * 16)
        read_scan(tmp_path / "scan.raw")


def _read_npy(path: Path) -> list[dict]:
    return [{"data": np.load(path, mmap_mode="r"), "axes": [], "metadata": {}, "original_metadata": {}}]


def test_a_format_added_to_the_registry_is_read_and_listed(tmp_path, monkeypatch):
    """One FileFormat more in the registry: read_scan reads its files, and the lists name it."""
    npy = FileFormat(name="NumPy", module=__name__, suffixes=(".npy",), read=_read_npy)
    monkeypatch.setattr(formats, "FORMATS", (*FORMATS, npy))
    data = np.arange(2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4)
    np.save(tmp_path / "scan.npy", data)
    scan = read_scan(tmp_path / "scan.npy")
    assert isinstance(scan.data, LazyScan) and scan.data.shape == data.shape
    np.testing.assert_array_equal(scan.data[1:, 1:2], data[1:, 1:2])
    assert ".npy" in formats.suffixes() and ".mib, .npy, .ser" in formats.readable()
    with pytest.raises(ExperimentalInputError, match=r"\.mib, \.npy, \.ser"):
        read_scan(tmp_path / "absent.npy")
