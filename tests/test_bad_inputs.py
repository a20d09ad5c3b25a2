"""Bad input, tried as a new user would: every case gives exit status 2 and one line
``namsa: error: <what is wrong and what to do>`` on stderr, or succeeds correctly.

`CASES` is the catalogue (docs/bad-inputs.md lists it by kind). The default suite runs every case
through the real CLI entry point (`workflow.cli.main`) in this process; the ``slow`` test runs
every case through the installed console script in its own process, where a crash (SIGBUS,
a traceback) shows as an exit status.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import stage
from bad_input_cases import COMMAND_CASES, CONFIG_FILES, REPO, Case
from bad_input_cases_received import RECEIVED_CASES
from microscope_helpers import damage_first_chunk, disc_scan, precession_scan, rewrite_data, spot_scan, write_hspy
from stage_helpers import CONFIG_HASH, flip_byte_inside, make_samples
from workflow.cli import main

#: the catalogue, in the order docs/bad-inputs.md lists it
CASES: list[Case] = [*COMMAND_CASES, *RECEIVED_CASES]


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> dict[str, str]:
    """The paths the cases name: stores (good, truncated, corrupt), files, directories, configs."""
    root = tmp_path_factory.mktemp("bad_inputs")
    data = root / "data"
    with stage.StoreWriter(data / "store-000", config_hash=CONFIG_HASH) as writer:
        for sample in make_samples(6, variants=2, scan=(4, 4), px=32):
            writer.put(sample)
    truncated = root / "truncated" / "store-000"
    shutil.copytree(data / "store-000", truncated)
    with open(truncated / "data.mdb", "r+b") as fh:
        fh.truncate((truncated / "data.mdb").stat().st_size // 2)
    corrupt = root / "corrupt" / "store-000"
    shutil.copytree(data / "store-000", corrupt)
    with stage.open_store(corrupt) as reader:
        record = bytes(reader.read_raw(0, verify=False)[0])
    flip_byte_inside(corrupt, record[-64:-32])
    (root / "file.txt").write_text("not a directory\n")
    (root / "empty").mkdir()
    (root / "junk").mkdir()
    (root / "junk" / "notes.txt").write_text("no store here\n")
    (root / "bad_cifs").mkdir()
    (root / "bad_cifs" / "a.cif").write_text("data_a\n_cell_length_a nonsense\n")
    (root / "bad_cifs" / "b.cif").write_bytes(b"\x00\x01 not a cif")
    _bare_scan(root / "bare.hspy")
    _big_cif(root / "big_cif" / "big.cif")
    places = {"tmp": str(root), "data": str(data), "bare_scan": str(root / "bare.hspy"), "truncated": str(truncated),
              "truncated_parent": str(truncated.parent), "corrupt": str(corrupt), "file": str(root / "file.txt"),
              "empty_dir": str(root / "empty"), "junk_dir": str(root / "junk"), "bad_cifs": str(root / "bad_cifs"),
              "big_cif_dir": str(root / "big_cif")}
    places["spots_scan"] = str(write_hspy(root / "spots.hspy", spot_scan()))
    places["wide_disc_scan"] = str(write_hspy(root / "wide-disc.hspy", disc_scan(radius=9.0)))
    places.update(_issue32_microscope_files(root))
    places.update(_issue31_microscope_files(root))
    places.update(_issue32_outs(root / "outs", data))
    places.update(_issue32_killed_stores(root / "killed", data))
    for name, content in CONFIG_FILES.items():
        (root / f"{name}.yaml").write_bytes(content)
        places[f"cfg_{name}"] = str(root / f"{name}.yaml")
    places.update(_hostile_models(root / "models"))
    return places


def _issue32_outs(root: Path, data: Path) -> dict[str, str]:
    """Output and run directories a user might point a command at (issue 32, A): a user's own
    figures/ or map under an output's names, and run directories with a link one level down."""
    made = {name: root / name for name in ("users_figures", "users_maps", "run_linked_log", "run_linked_store",
                                           "run_linked_claims")}
    (made["users_figures"] / "figures").mkdir(parents=True)
    (made["users_figures"] / "figures" / "plot.png").write_text("the user's figure")
    made["users_maps"].mkdir()
    (made["users_maps"] / "potential.npy").write_bytes(b"the user's map")
    (root / "elsewhere").mkdir()
    for run, inner, target in (("run_linked_log", "logs/run.log", root / "elsewhere" / "log"),
                               ("run_linked_store", "data/store-000", data / "store-000"),
                               ("run_linked_claims", "data/.claims", root / "elsewhere")):
        (made[run] / inner).parent.mkdir(parents=True)
        (made[run] / inner).symlink_to(target)
    return {name: str(path) for name, path in made.items()}


def _issue32_killed_stores(root: Path, data: Path) -> dict[str, str]:
    """Data directories a killed `namsa simulate` leaves (issue 32, B): a store whose writer died
    between creating its LMDB environment and its info record (made the way the writer makes it),
    one that died after the info record of other physics but before a sample, and such a store
    sorted before a full one. Cases that write get a directory of their own."""
    from stage.lmdbenv import _open_writable_env

    made = {name: root / name for name in ("killed_empty", "killed_resume", "killed_other_physics",
                                           "killed_beside_full")}
    for name in ("killed_empty", "killed_resume", "killed_beside_full"):
        (made[name] / "store-000").mkdir(parents=True)
        env, _ = _open_writable_env(made[name] / "store-000", 1 << 20)
        env.close()
    shutil.copytree(data / "store-000", made["killed_beside_full"] / "store-001")
    with stage.StoreWriter(made["killed_other_physics"] / "store-000", config_hash="e" * 64):
        pass
    made["sim_linked_claims"] = root / "sim_linked_claims"   # claims are never written through a link
    made["sim_linked_claims"].mkdir()
    (root / "elsewhere").mkdir()
    (made["sim_linked_claims"] / ".claims").symlink_to(root / "elsewhere")
    return {name: str(path) for name, path in made.items()}


def _hostile_models(root: Path) -> dict[str, str]:
    """Model directories damaged as a user might receive them (issue 32, E): each a real exported tiny
    model (`test_hostile_model_dirs.make_run`) with one mutation from that file's catalogue."""
    import struct

    import test_hostile_model_dirs as hostile
    from models.checkpoint import MODEL_FILE
    from models.card import CARD_FILE

    base = hostile.make_run(root / "base") / "model"
    mutations = {
        "model_weights_link": hostile.symlink_outside(MODEL_FILE),
        "model_card_link": hostile.symlink_inside(CARD_FILE),
        "model_weights_fifo": lambda d: ((d / MODEL_FILE).unlink(), os.mkfifo(d / MODEL_FILE)),
        "model_nan": hostile.tensors(lambda s: s["head.weight"].fill_(float("nan"))),
        "model_huge_header": hostile.weights_bytes(hostile.with_header_length(1 << 60)),
        "model_header_past_end": hostile.weights_bytes(lambda b: struct.pack("<Q", len(b) - 7) + b[8:]),
        "model_absurd_normalizer": hostile.edit(hostile._set("normalizer.targets.potential", [1.0, 1e30])),
        "model_expects_mismatch": hostile.edit(hostile._set("expects_input", hostile.expects(scan_shape=[32, 32]))),
    }
    made = {}
    for name, mutate in mutations.items():
        shutil.copytree(base, root / name)
        mutate(root / name)
        made[name] = str(root / name)
    return made


def _issue32_microscope_files(root: Path) -> dict[str, str]:
    """Issue 32 (D): a wide disc (which the disc check would blame on the semi-angle) with an energy in V
    or negated; an EMPAD .raw; empty scan and detector axes; data declared but never written; a
    damaged gzip chunk."""
    wide = disc_scan(radius=9.0)
    (root / "scan.raw").write_bytes(bytes(130 * 128 * 4))
    return {"volts_scan": str(write_hspy(root / "volts.hspy", wide, energy_kv=200000.0)),
            "negated_scan": str(write_hspy(root / "negated.hspy", -wide)), "empad_raw": str(root / "scan.raw"),
            "no_positions_scan": str(rewrite_data(write_hspy(root / "no-pos.hspy", wide),
                                                  np.zeros((0, 8, 32, 32), np.float32))),
            "no_detector_scan": str(rewrite_data(write_hspy(root / "no-det.hspy", wide),
                                                 np.zeros((8, 8, 0, 0), np.float32))),
            "unwritten_scan": str(rewrite_data(write_hspy(root / "unwritten.hspy", wide),
                                               declared=(64, 64, 4096, 4096))),
            "damaged_scan": str(damage_first_chunk(write_hspy(root / "damaged.hspy", disc_scan())))}


def _issue31_microscope_files(root: Path) -> dict[str, str]:
    """Issue 31: precession spot patterns; CBED discs of matching radius on a scan too coarse (2 A) and
    too small (8 x 8) with a too coarse detector (0.3 1/A); a scan without a count; and Poisson
    counts of 4.2 electrons a pattern (30 e/A^2 at the study's 0.375 A step), some patterns empty."""
    counts = np.random.default_rng(0).poisson(disc_scan((32, 32), radius=4.6).astype(np.float64) * 30 * 0.375 ** 2)
    return {"precession_scan": str(write_hspy(root / "precession.hspy", precession_scan())),
            "unfixable_scan": str(write_hspy(root / "unfixable.hspy", disc_scan(radius=2.67), step_A=2.0,
                                             dk_inv_A=0.3)),
            "blank_scan": str(write_hspy(root / "blank.hspy", np.zeros((4, 4, 32, 32), np.uint16))),
            "low_dose_scan": str(write_hspy(root / "low-dose.hspy", counts.astype(np.uint16)))}


def _big_cif(path: Path) -> None:
    """A CIF of 20,000 Si atoms 2 A apart (pymatgen would read it for minutes, then orient it out of memory)."""
    from pymatgen.core import Lattice, Structure
    from pymatgen.io.cif import CifWriter

    grid = np.stack(np.meshgrid(np.arange(20), np.arange(20), np.arange(50), indexing="ij"), -1).reshape(-1, 3)
    path.parent.mkdir()
    CifWriter(Structure(Lattice.orthorhombic(40.0, 40.0, 100.0), ["Si"] * len(grid), grid / [20, 20, 50])).write_file(path)


def _bare_scan(path: Path) -> None:
    """A 4 x 4 scan of 8 px CBED patterns (a centred disc) in .hspy without a single calibration
    (no units, no metadata)."""
    from rsciio.hspy import file_writer

    axes = [{"name": n, "size": 4 if i < 2 else 8, "scale": 1.0, "offset": 0.0, "units": "", "navigate": i < 2,
             "index_in_array": i} for i, n in enumerate(("y", "x", "ky", "kx"))]
    file_writer(str(path), {"data": np.ascontiguousarray(disc_scan((4, 4), px=8, radius=2.5)), "axes": axes, "original_metadata": {},
                            "metadata": {"General": {"title": ""}, "Signal": {"signal_type": ""}},
                            "tmp_parameters": {}, "attributes": {"_lazy": False}, "learning_results": {},
                            "models": {}, "package_info": {"name": "namsa-tests", "version": "0"}})


def fill(case: Case, places: dict[str, str], run: str) -> tuple[list[str], str]:
    """The case's argv and message with paths filled in; each run gets its own output dirs."""
    own = {**places, "tmp": str(Path(places["tmp"]) / run)}
    Path(own["tmp"]).mkdir(parents=True, exist_ok=True)
    argv = [a.format(**own) for a in case.argv]
    return argv, case.says.format(**own)


def check(case: Case, says: str, rc: int, out: str, err: str) -> None:
    lines = err.strip().splitlines()
    if case.expect == "bad":
        assert rc == 2, f"exit {rc}\nstdout: {out[-1500:]}\nstderr: {err[-3000:]}"
        assert len(lines) == 1 and lines[0].startswith("namsa: error: "), err
        assert says in lines[0], lines[0]
    elif case.expect == "found":
        assert rc == 1 and out.strip(), (rc, out, err)
        assert lines and lines[-1].startswith("namsa: error: ") and says in lines[-1], err
    else:
        assert rc == 0, f"exit {rc}\nstderr: {err[-3000:]}"
        assert says in err, err
        assert "Traceback" not in err


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_in_process(case, places, capsys):
    argv, says = fill(case, places, case.id)
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code
    out, err = capsys.readouterr()
    check(case, says, rc, out, err)


def _in_own_process(case: Case, places: dict[str, str]) -> str | None:
    """Run one case through the console script; None if it behaved, else what went wrong."""
    argv, says = fill(case, places, f"proc-{case.id}")
    done = subprocess.run([str(Path(sys.executable).parent / "namsa"), *argv], capture_output=True, text=True,
                          timeout=600, cwd=places["tmp"])
    try:
        check(case, says, done.returncode, done.stdout, done.stderr)
    except AssertionError as exc:
        return f"{case.id}: {exc}"
    return None


@pytest.mark.slow  # ~100 fresh processes: 5-15 minutes on 2 cores
@pytest.mark.timeout(3600)
def test_bad_input_through_the_console_script(places):
    """Every case again, each in its own `namsa` process: no crash, no traceback, same outcome."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3) as pool:  # the processes mostly wait on imports
        failures = [f for f in pool.map(lambda c: _in_own_process(c, places), CASES) if f]
    assert not failures, "\n\n".join(failures)


def test_the_catalogue_is_what_the_docs_count():
    """docs/bad-inputs.md records how many cases were tried; it must match this catalogue."""
    doc = (REPO / "docs" / "bad-inputs.md").read_text()
    assert f"{len(CASES)} cases" in doc
    for case in CASES:
        assert f"`{case.id}`" in doc, case.id
