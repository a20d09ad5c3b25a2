"""Fuzz: malformed HDF5 / .hspy microscope files fed to `namsa reconstruct` (issue 18).

hypothesis builds files two ways: a real .hspy scan (rosettasciio's writer) of random shape,
dtype and values (NaN, +-inf included), or an HDF5 file of random groups and datasets; then it
may plant an external link, a virtual dataset or external raw storage pointing at a "secret" file
beside it, or cut the file's bytes short. Each goes through `workflow.cli.main(["reconstruct",
...])` with a real trained model. The property: exit 0 with the maps written, or exit 2 with
exactly one ``namsa: error:`` line (always 2 when the file reaches outside itself); never a
traceback, never a file written outside ``--out``.

Issue 32 (D7) adds mutated metadata: the calibrations of a .hspy (beam energy, semi-angle, scan
step, detector pixel, their units, the axes' sizes: right, in another unit, NaN, +-inf, negative,
zero, tiny, huge, text, a list, a boolean) and of an EMPAD header (scan size, field of view,
detector pixel, the raw file's name, one outside the header's folder). The same property, and the
Python heap (numpy's arrays included, traced) below 1 GiB at its peak.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)

h5py = pytest.importorskip("h5py")
pytest.importorskip("rsciio")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fuzzing import fuzz_settings  # noqa: E402
from test_reconstruct_cli import _run, _signal, sample, tiny_model  # noqa: E402, F401  (shared fixtures)

DTYPES = ["float32", "float64", "uint16", "int8", "bool", "complex64"]
FILLS = [0.0, 1.0, 1e30, -5.0, np.nan, np.inf, -np.inf]
HOSTILE = ("external-link", "virtual", "external-storage")

scan_dims = st.tuples(st.integers(1, 10), st.integers(1, 10), st.sampled_from([4, 16, 17]),
                      st.sampled_from([4, 16, 17]))
hspy_files = st.fixed_dictionaries({
    "kind": st.just("hspy"), "shape": st.one_of(st.just("sample"), scan_dims), "dtype": st.sampled_from(DTYPES),
    "spikes": st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(FILLS)), max_size=3)})
random_files = st.fixed_dictionaries({
    "kind": st.just("random"),
    "objects": st.lists(st.tuples(st.lists(st.sampled_from("abc"), min_size=1, max_size=3),
                                  st.lists(st.integers(0, 5), max_size=5), st.sampled_from(DTYPES),
                                  st.sampled_from(FILLS)), max_size=5)})
files = st.fixed_dictionaries({
    "base": st.one_of(hspy_files, random_files),
    "mutation": st.sampled_from(["none", "none", *HOSTILE, "truncate"]),
    "cut": st.floats(0.05, 0.95)})


def _tree(root: Path) -> dict[str, bytes]:
    """Every file below ``root``, less the ``.<out>.lock`` files workflow.outlock leaves beside --out."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not (p.name.startswith(".") and p.name.endswith(".lock"))}


def _hspy(path: Path, spec: dict[str, Any], sample: Any) -> None:
    from rsciio.hspy import file_writer

    sy, sx = sample.meta.scan_shape
    stack = sample.cbed.reshape(sy, sx, *sample.cbed.shape[1:])
    data = stack.copy() if spec["shape"] == "sample" else np.resize(stack, spec["shape"])
    data = data.astype(spec["dtype"]) if spec["dtype"] != "complex64" else data.astype("complex64") * 1j
    flat = data.reshape(-1)
    for index, value in spec["spikes"]:
        if data.dtype.kind in "fc":
            flat[index % flat.size] = value
    meta = sample.meta
    step = (meta.fov_A[2] / sy, meta.fov_A[3] / sx)
    signal = _signal(data, step, meta.pattern_dk_inv_A,
                     {"beam_energy": meta.energy_kv, "convergence_angle": meta.semiangle_mrad})
    file_writer(str(path), signal)


def _random_h5(path: Path, spec: dict[str, Any]) -> None:
    with h5py.File(path, "w") as fh:
        for names, shape, dtype, fill in spec["objects"]:
            where = "/".join(names)
            try:
                fh.create_dataset(where, data=np.full(shape, fill).astype(dtype))
            except (ValueError, TypeError):  # the name is taken by a group or dataset: a group then
                fh.require_group(names[0])


def _mutate(path: Path, mutation: str, cut: float, secret: Path) -> None:
    if mutation == "truncate":
        size = path.stat().st_size
        with open(path, "r+b") as fh:
            fh.truncate(int(size * cut))
        return
    if mutation == "none":
        return
    with h5py.File(path, "a") as fh:
        if mutation == "external-link":
            fh["zz-link"] = h5py.ExternalLink(str(secret), "/data")
        elif mutation == "virtual":
            layout = h5py.VirtualLayout(shape=(4, 4), dtype="f4")
            layout[...] = h5py.VirtualSource(str(secret), "data", shape=(4, 4))
            fh.create_virtual_dataset("zz-virtual", layout)
        else:
            fh.create_dataset("zz-external", shape=(16,), dtype="u1", external=[(str(secret) + ".raw", 0, 16)])


@fuzz_settings(60)
@given(spec=files)
def test_malformed_hdf5_files_are_one_line_or_reconstructed(spec, sample, tiny_model, tmp_path_factory, capsys):
    root = tmp_path_factory.mktemp("fuzz")
    secret = root / "secret.h5"
    with h5py.File(secret, "w") as fh:
        fh["data"] = np.arange(16, dtype="f4").reshape(4, 4)
    (root / "secret.h5.raw").write_bytes(bytes(range(16)))
    scan = root / "scan.hspy"
    try:
        _hspy(scan, spec["base"], sample) if spec["base"]["kind"] == "hspy" else _random_h5(scan, spec["base"])
    except Exception:  # rosettasciio or h5py cannot write this one: not a file a user could receive
        assume(False)
    _mutate(scan, spec["mutation"], spec["cut"], secret)
    before = _tree(root)
    capsys.readouterr()
    rc = _run("reconstruct", scan, "--model", tiny_model[0], "--out", root / "out")
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    if rc == 2:
        assert len(lines) == 1 and lines[0].startswith("namsa: error: "), err
        assert not (root / "out").exists()
    else:
        assert rc == 0 and spec["mutation"] not in HOSTILE, (rc, err)
        assert (root / "out" / "potential.npy").is_file()
    after = {name: data for name, data in _tree(root).items() if not name.startswith("out/")}
    assert after == before


# -- issue 32 (D7): mutated calibrations in the metadata of .hspy and EMPAD files -------------

#: a calibration value as a file might hold it: absent, right, in another unit, not finite,
#: negative, zero, tiny, huge, text, a list, a boolean
VALUES = st.sampled_from(["absent", "right", 200000.0, 0.2, np.nan, np.inf, -np.inf, -1.0, 0.0, 1e-300, 1e300,
                          "200", "abc", [1.0, 2.0], True])
UNITS = st.sampled_from(["right", "", "nm", "pm", "m", "1/nm", "mrad", "rad", "furlongs", "Å^-1"])
hspy_meta = st.fixed_dictionaries({
    "energy_kv": VALUES, "semiangle_mrad": VALUES, "step": VALUES, "dk": VALUES,
    "step_unit": UNITS, "dk_unit": UNITS, "size": st.sampled_from(["right", 0, -3, 10 ** 12])})
empad_meta = st.fixed_dictionaries({
    "pix": st.tuples(st.sampled_from([8, 0, -1, 7, 9, 10 ** 6, "x"]), st.sampled_from([8, 0, 3, 10 ** 6, "x"])),
    "fov": st.sampled_from(["right", "[nan, nan]", "[-1e-9, 1e-9]", "[0, 0]", "[1e300, 1e300]", "junk"]),
    "pixelsize": st.sampled_from(["right", "nan", "-1", "0", "1e300", "1e-300", "abc"]),
    "raw": st.sampled_from(["right", "right", "../secret.raw", "ABSOLUTE"])})


def _value(spec: Any, right: float) -> Any:
    return right if spec == "right" else spec


def _mutated_hspy(path: Path, spec: dict[str, Any], sample: Any) -> None:
    from rsciio.hspy import file_writer

    meta = sample.meta
    sy, sx = meta.scan_shape
    tem = {key: _value(spec[key], getattr(meta, key)) for key in ("energy_kv", "semiangle_mrad") if spec[key] != "absent"}
    step = _value(spec["step"], meta.fov_A[2] / sy)
    dk = _value(spec["dk"], meta.pattern_dk_inv_A)
    signal = _signal(sample.cbed.reshape(sy, sx, *sample.cbed.shape[1:]), (1.0, 1.0), 1.0, tem)
    for i, axis in enumerate(signal["axes"]):
        scale, unit = (step, spec["step_unit"]) if i < 2 else (dk, spec["dk_unit"])
        axis.update({"scale": scale} if scale != "absent" else {}, units=axis["units"] if unit == "right" else unit)
        axis["size"] = axis["size"] if spec["size"] == "right" else spec["size"]
    file_writer(str(path), signal)


def _mutated_empad(folder: Path, spec: dict[str, Any], sample: Any, secret: Path) -> Path:
    from test_reconstruct_cli import _write_empad

    header = _write_empad(folder, sample)
    raw = next(folder.glob("*.raw")).name
    text = header.read_text()
    sy, sx = sample.meta.scan_shape
    text = text.replace(f"<pix_x>{sx}</pix_x><pix_y>{sy}</pix_y>", f"<pix_x>{spec['pix'][1]}</pix_x>"
                                                                     f"<pix_y>{spec['pix'][0]}</pix_y>")
    if spec["fov"] != "right":
        start = text.index("<get_full_scan_field_of_view>") + len("<get_full_scan_field_of_view>")
        text = text[:start] + spec["fov"] + text[text.index("</get_full_scan_field_of_view>"):]
    if spec["pixelsize"] != "right":
        start = text.index("<calibrated_pixelsize>") + len("<calibrated_pixelsize>")
        text = text[:start] + spec["pixelsize"] + text[text.index("</calibrated_pixelsize>"):]
    name = {"right": raw, "../secret.raw": "../secret.raw", "ABSOLUTE": str(secret)}[spec["raw"]]
    header.write_text(text.replace(f'filename="{raw}"', f'filename="{name}"'))
    return header


def _one_line_or_maps(root: Path, scan: Path, model: Any, capsys, *flags: Any) -> int:
    """The property: exit 0 with maps or exit 2 with one line, no traceback, nothing written
    outside --out, and the Python heap (numpy's arrays included) below 1 GiB at its peak."""
    import tracemalloc

    before = _tree(root)
    capsys.readouterr()
    tracemalloc.start()
    try:
        rc = _run("reconstruct", scan, "--model", model, "--out", root / "out", *flags)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert "Traceback" not in err and peak < 2**30, (err, peak)
    lines = err.strip().splitlines()
    if rc == 2:
        assert len(lines) == 1 and lines[0].startswith("namsa: error: "), err
        assert not (root / "out").exists()
    else:
        assert rc == 0, (rc, err)
        assert (root / "out" / "potential.npy").is_file()
    assert {n: d for n, d in _tree(root).items() if not n.startswith("out/")} == before
    return rc


@fuzz_settings(40)
@given(spec=hspy_meta)
def test_mutated_hspy_calibrations_are_one_line_or_reconstructed(spec, sample, tiny_model, tmp_path_factory,
                                                                 capsys):
    root = tmp_path_factory.mktemp("fuzzmeta")
    try:
        _mutated_hspy(root / "scan.hspy", spec, sample)
    except Exception:  # rosettasciio cannot write this one: not a file a user could receive
        assume(False)
    _one_line_or_maps(root, root / "scan.hspy", tiny_model[0], capsys)


@fuzz_settings(25)
@given(spec=empad_meta)
def test_mutated_empad_headers_are_one_line_or_reconstructed(spec, sample, tiny_model, tmp_path_factory, capsys):
    root = tmp_path_factory.mktemp("fuzzempad")
    (root / "scan").mkdir()
    secret = root / "secret.raw"
    secret.write_bytes(bytes(16))
    header = _mutated_empad(root / "scan", spec, sample, secret)
    meta = sample.meta
    rc = _one_line_or_maps(root, header, tiny_model[0], capsys, "--energy-kv", meta.energy_kv,
                           "--semiangle-mrad", meta.semiangle_mrad)
    assert rc == 2 or spec["raw"] == "right"  # a raw file outside the header's folder is never read
