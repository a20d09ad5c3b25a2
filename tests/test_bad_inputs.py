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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import stage
from microscope_helpers import damage_first_chunk, disc_scan, precession_scan, rewrite_data, spot_scan, write_hspy
from stage_helpers import CONFIG_HASH, flip_byte_inside, make_samples
from workflow.cli import main

REPO = Path(__file__).resolve().parents[1]
MICRO = str(REPO / "configs" / "micro.yaml")


@dataclass(frozen=True)
class Case:
    """argv ({name} fields are filled from the `places` fixture), what must happen, and a piece
    of the message. expect: "bad" = exit 2 and exactly one stderr line ``namsa: error: ...``
    containing ``says``; "found" = exit 1, the report on stdout and a last stderr line
    ``namsa: error: ...`` (a check that found problems); "ok" = exit 0 (``says`` on stderr if set)."""

    id: str
    argv: tuple[str, ...]
    says: str
    expect: str = "bad"


def sim(*sets: str, command: str = "simulate") -> tuple[str, ...]:
    """`namsa simulate MICRO --out {tmp}/out` (or run) with --set overrides."""
    out = ("--out", "{tmp}/out") if command in ("simulate", "run") else ()
    return (command, MICRO, *out, "--no-progress", *[a for s in sets for a in ("--set", s)])


def ev(model: str) -> tuple[str, ...]:
    """`namsa evaluate MICRO --data {data} --model MODEL --out {tmp}/e`."""
    return ("evaluate", MICRO, "--data", "{data}", "--model", model, "--out", "{tmp}/e")


def cfg(name: str, command: str = "simulate") -> tuple[str, ...]:
    """`namsa simulate {cfg_<name>} --out {tmp}/out`: a config file from CONFIG_FILES."""
    return (command, "{cfg_" + name + "}", "--out", "{tmp}/out", "--no-progress")


#: config files (bytes) for the file-format cases; micro.yaml's text is available as {micro}
CONFIG_FILES: dict[str, bytes] = {
    "empty": b"",
    "comments": b"# nothing but a comment\n\n",
    "binary": bytes(range(256)) * 4,
    "latin1": "name: caf\xe9\n".encode("latin-1"),
    "list": b"- simulation\n- data\n",
    "scalar": b"42\n",
    "invalid": b"simulation: [1, 2\n",
    "tabs": b"simulation:\n\tenergy_kv: 200\n",
    "unknown_section": b"simulatoin:\n  energy_kv: 200\n",
    "null_section": b"simulation:\n",
    # issue 32 (C): 1.6 KB of nested aliases standing for 10**10 values, an alias inside its own
    # anchor, a section said twice, 200 levels of lists, 300 KB of comments, a 5,000-digit integer
    "alias_bomb": ("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10))).encode(),
    "alias_cycle": b"simulation:\n  materials: &m [Si, *m]\n",
    "duplicate_section": b"simulation:\n  energy_kv: 200\nsimulation:\n  energy_kv: 100\n",
    "deep": b"name: " + b"[" * 200 + b"]" * 200 + b"\n",
    "huge": b"# padding\n" * 30_000,
    "huge_integer": b"training:\n  seed: " + b"9" * 5000 + b"\n",
}

CASES: list[Case] = [
    # -- the command line itself ----------------------------------------------------------------
    Case("no-command", (), "arguments are required: COMMAND"),
    Case("unknown-command", ("simulat",), "invalid choice: 'simulat'"),
    Case("unknown-option", ("inspect", "{data}", "--bogus"), "unrecognized arguments: --bogus"),
    Case("simulate-without-out", ("simulate",), "the following arguments are required: --out"),
    Case("train-without-data", ("train", "--out", "{tmp}/t"), "required: --data"),
    Case("evaluate-without-model", ("evaluate", "--data", "{data}", "--out", "{tmp}/e"), "required: --model"),
    Case("worker-not-a-number", ("simulate", "--out", "{tmp}/o", "--worker", "one"), "invalid int value: 'one'"),
    Case("worker-out-of-range", ("simulate", MICRO, "--out", "{tmp}/o", "--worker", "3", "--of", "2"),
         "--worker 3 must be in [0, --of 2)"),
    Case("worker-negative", ("simulate", MICRO, "--out", "{tmp}/o", "--worker", "-1"), "--worker -1 must be in"),
    Case("of-zero", ("simulate", MICRO, "--out", "{tmp}/o", "--of", "0"), "must be in [0, --of 0)"),
    Case("stage-zero-threads", ("stage", "{data}", "{tmp}/s", "--threads", "0"), "threads must be >= 1"),
    Case("stage-rank-outside", ("stage", "{data}", "{tmp}/s", "--rank", "2", "--world-size", "2"),
         "rank 2 is outside world_size 2"),
    Case("stage-world-size-zero", ("stage", "{data}", "{tmp}/s", "--world-size", "0"), "outside world_size 0"),
    Case("fractions-above-one", ("scaling", "--data", "{data}", "--out", "{tmp}/sc", "--fractions", "0.5,2"),
         "every fraction must be in (0, 1]"),
    Case("fractions-not-numbers", ("scaling", "--data", "{data}", "--out", "{tmp}/sc", "--fractions", "a,b"),
         "is not a comma-separated list of numbers"),
    Case("fractions-empty", ("scaling", "--data", "{data}", "--out", "{tmp}/sc", "--fractions", ","),
         "every fraction must be in (0, 1]"),
    # -- --set overrides ------------------------------------------------------------------------
    Case("set-without-equals", sim("training.max_steps"), "expected dotted.key=value"),
    Case("set-empty-key", sim("=3"), "expected dotted.key=value"),
    Case("set-empty-key-part", sim("simulation..energy_kv=3"), "expected dotted.key=value"),
    Case("set-value-not-yaml", sim("simulation.energy_kv=[1,"), "is not valid YAML"),
    Case("set-wrong-type", sim("simulation.energy_kv=fast"), "simulation.energy_kv: Input should be a valid number"),
    Case("set-unknown-key", sim("simulation.energy=200"), "simulation.energy: unknown key; allowed keys here:"),
    Case("set-into-a-value", sim("simulation.scan_shape.x=1"), "is the value [4, 4], not a section"),
    Case("set-unknown-section", sim("simulatoin.energy_kv=1"), "simulatoin: unknown key"),
    Case("set-split-by-unknown", sim("data.split_by=structure"), "data.split_by: Input should be 'material' or 'prototype'"),
    Case("set-physics-input-unknown", sim("model.physics_inputs=[dpc]"),
         "model.physics_inputs.0: Input should be 'com_y', 'com_x' or 'icom'"),
    Case("set-physics-input-twice", sim("model.physics_inputs=[icom,icom]"), "names a channel twice"),
    Case("set-icom-residual-without-icom", sim("model.icom_residual=true"), "icom_residual needs 'potential'"),
    Case("set-loss-weighting-unknown", sim("training.loss_weighting=per_sample"),
         "training.loss_weighting: Input should be 'absolute' or 'relative'"),
    Case("set-multislice-no-samples", sim("evaluation.multislice_ptycho={{max_samples: 0}}"),
         "evaluation.multislice_ptycho.max_samples: Input should be greater than or equal to 1"),
    Case("set-ptycho-tolerance-zero", sim("evaluation.ptycho_convergence.rel_tol=0"),
         "evaluation.ptycho_convergence.rel_tol: Input should be greater than 0"),
    Case("set-evaluation-dose-zero", sim("evaluation.doses=[1000,0]"),
         "evaluation.doses.1: Input should be greater than 0"),
    Case("set-symmetry-average-not-a-bool", sim("evaluation.symmetry_average=sometimes"),
         "evaluation.symmetry_average: Input should be a valid boolean"),
    # -- config files ---------------------------------------------------------------------------
    Case("config-missing", ("simulate", "{tmp}/nope.yaml", "--out", "{tmp}/o"), "config file not found"),
    Case("config-is-a-directory", ("simulate", "{tmp}", "--out", "{tmp}/o"), "config file not found"),
    Case("config-empty", cfg("empty"), "the config is empty; start from a copy of configs/quickstart.yaml"),
    Case("config-only-comments", cfg("comments"), "the config is empty"),
    Case("config-binary", cfg("binary"), "not a text file (byte 128 is not UTF-8)"),
    Case("config-latin1", cfg("latin1"), "is not UTF-8"),
    Case("config-top-level-list", cfg("list"), "the top level must be a mapping of sections, got a list"),
    Case("config-top-level-scalar", cfg("scalar"), "got a int"),
    Case("config-invalid-yaml", cfg("invalid"), "not valid YAML"),
    Case("config-tab-indent", cfg("tabs"), "not valid YAML"),
    Case("config-unknown-section", cfg("unknown_section"), "simulatoin: unknown key"),
    Case("config-empty-section", cfg("null_section"), "simulation: Input should be a valid dictionary"),
    Case("profile-unknown", sim("execution.profile=cloud"), "unknown profile 'cloud'"),
    Case("name-with-slash", sim("name=a/b"), "must be a plain directory name"),
    Case("name-dotdot", sim("name=.."), "must be a plain directory name"),
    Case("name-empty", sim("name="), "must be a plain directory name"),
    Case("energy-negative", sim("simulation.energy_kv=-200"), "simulation.energy_kv: Input should be greater than 0"),
    Case("energy-huge", sim("simulation.energy_kv=5000"), "less than or equal to 3000"),
    Case("semiangle-zero", sim("simulation.semiangle_mrad=0"), "simulation.semiangle_mrad"),
    Case("scan-zero", sim("simulation.scan_shape=[0,4]"), "scan_shape must be two positive ints"),
    Case("scan-one-number", sim("simulation.scan_shape=4"), "simulation.scan_shape"),
    Case("scan-absurd", sim("simulation.scan_shape=[100000,100000]"), "use a scan of at most"),
    Case("scan-absurd-model-matched", sim("simulation.scan_shape=[100000,100000]", "model.in_channels=10000000000"),
         "use a scan of at most"),
    Case("model-channels-mismatch", sim("simulation.scan_shape=[2,2]"), "set model.in_channels=4"),
    Case("pattern-not-a-multiple", sim("simulation.pattern_px=18", "simulation.target_px=18"), "pattern_px=18 is not a multiple of 4"),
    Case("target-ne-pattern", sim("simulation.target_px=32"), "set simulation.target_px = pattern_px, or model.input_layout: scan"),
    Case("no-sampling-no-gpts", sim("simulation.sampling_A=null"), "set sampling_A (Angstrom/pixel) or gpts"),
    Case("gpts-too-small", sim("simulation.gpts=4"), "simulation.gpts: Input should be greater than or equal to 8"),
    Case("fov-outside-cell", sim("simulation.scan_fov_A=[0,0,20,20]"), "must lie inside the"),
    Case("fov-fraction-above-one", sim("simulation.scan_fov_fraction=1.5"), "puts the scan outside the cell"),
    Case("device-unknown", sim("simulation.device=tpu"), "device must be 'cpu', 'cuda' or 'cuda:<index>'"),
    Case("grid-absurd", sim("simulation.cell_lateral_A=20000"), "shrink the grid"),
    Case("workers-zero", sim("execution.workers=0"), "execution.workers: Input should be greater than or equal to 1"),
    Case("host-threads-zero", sim("simulation.host_threads=0"),
         "simulation.host_threads: Input should be greater than or equal to 1"),
    Case("success-fraction-above-one", sim("execution.min_success_fraction=2"), "execution.min_success_fraction"),
    Case("retries-negative", sim("execution.retries=-1"), "execution.retries"),
    Case("dose-range-reversed", sim("data.dose_augmentation.dose_range_e_per_A2=[1000000,100]"),
         "data.dose_augmentation.dose_range_e_per_A2: dose range [1000000.0, 100.0] must be [low, high]"),
    Case("dose-clean-fraction-above-one", sim("data.dose_augmentation.clean_fraction=1.5"),
         "data.dose_augmentation.clean_fraction: clean_fraction 1.5 is a probability"),
    Case("data-dir-unset-variable", sim("execution.data_dir=$NAMSA_NO_SUCH_VAR/data", command="run"),
         "NAMSA_NO_SUCH_VAR"),
    # -- what to simulate -----------------------------------------------------------------------
    Case("materials-cif-path", sim("simulation.materials=[my/Si.cif]"), "set simulation.cif_dir to it"),
    Case("materials-cif-name", sim("simulation.materials=[Si.cif]"), "is a file path"),
    Case("materials-empty", sim("simulation.materials=[]"), "nothing to simulate: simulation.materials is empty"),
    Case("materials-all-unknown", sim("simulation.materials=[Unobtainium]"),
         "no sample was simulated: all 1 planned samples or materials failed (the first: Unobtainium: unknown"),
    Case("materials-all-unknown-run", sim("simulation.materials=[Unobtainium]", command="run"),
         "the first failure: Unobtainium: unknown structure id 'Unobtainium'; namsa.library.list_ids() lists "
         "the built-in ids; for anything else put CIF files in a folder and set simulation.cif_dir to it"),
    Case("zone-axis-zero", sim("simulation.zone_axes=[[0,0,0]]"), "no sample was simulated"),
    Case("zone-axis-zero-run", sim("simulation.zone_axes=[[0,0,0]]", command="run"), "only 0 of about"),
    Case("zone-axis-two-numbers", sim("simulation.zone_axes=[[1,1]]"), "simulation.zone_axes"),
    Case("cif-dir-missing", sim("simulation.materials=[]", "simulation.cif_dir={tmp}/no-cifs"),
         "does not exist or is not a directory"),
    Case("cif-dir-empty", sim("simulation.materials=[]", "simulation.cif_dir={empty_dir}"),
         "holds no .cif file"),
    Case("cif-dir-all-bad", sim("simulation.materials=[]", "simulation.cif_dir={bad_cifs}"),
         "no sample was simulated: all 2 planned"),
    Case("memory-budget-above-machine", sim("simulation.memory_budget_gb=100000"),
         "simulation.memory_budget_gb=100000 for each of 1 sample(s) at once is more than this machine's"),
    Case("memory-budget-above-machine-run", sim("simulation.memory_budget_gb=100000", command="run"),
         "simulation.memory_budget_gb=100000 for each of 2 sample(s) at once"),
    Case("memory-budget-too-small", sim("simulation.memory_budget_gb=0.000001"),
         "no sample was simulated"),
    # -- stores ---------------------------------------------------------------------------------
    Case("inspect-missing", ("inspect", "{tmp}/nothing"), "the path does not exist"),
    Case("inspect-a-file", ("inspect", "{file}"), "holds no store"),
    Case("inspect-empty-directory", ("inspect", "{empty_dir}"), "holds no store"),
    Case("inspect-junk-directory", ("inspect", "{junk_dir}"), "holds no store"),
    Case("inspect-truncated", ("inspect", "{truncated}"), "data.mdb is truncated"),
    Case("inspect-verify-truncated", ("inspect", "--verify", "{truncated}"), "data.mdb is truncated"),
    Case("inspect-verify-corrupt", ("inspect", "--verify", "{corrupt}"), "1 corrupt record(s)", "found"),
    Case("stage-source-missing", ("stage", "{tmp}/nothing", "{tmp}/s", "--no-progress"), "does not exist"),
    Case("stage-into-its-source", ("stage", "{data}", "{data}/inside", "--no-progress"), "lies inside the source"),
    Case("stage-corrupt-source", ("stage", "{corrupt}", "{tmp}/s", "--no-progress"),
         "1 record(s) corrupt in the source (not copied)", "found"),
    Case("stage-truncated", ("stage", "{truncated}", "{tmp}/s", "--no-progress"), "data.mdb is truncated"),
    Case("stage-destination-is-a-file", ("stage", "{data}", "{file}", "--no-progress"), "{file}"),
    Case("train-data-missing", ("train", MICRO, "--data", "{tmp}/nothing", "--out", "{tmp}/t", "--no-progress"),
         "does not exist"),
    Case("train-data-empty", ("train", MICRO, "--data", "{empty_dir}", "--out", "{tmp}/t", "--no-progress"),
         "{empty_dir}"),
    Case("train-data-truncated", ("train", MICRO, "--data", "{truncated}", "--out", "{tmp}/t", "--no-progress"),
         "data.mdb is truncated"),
    Case("train-data-wrong-shape", ("train", MICRO, "--data", "{data}", "--out", "{tmp}/t", "--no-progress",
                                    "--set", "simulation.scan_shape=[8,8]", "--set", "model.in_channels=64"),
         "64"),
    Case("train-symmetry-on-unturnable-data", ("train", MICRO, "--data", "{data}", "--out", "{tmp}/t", "--no-progress",
                                               "--set", "data.symmetry_augmentation.enabled=true"),
         "has scan 4x4, patterns [32, 32], targets [32, 32]: set data.symmetry_augmentation.enabled false"),
    Case("symmetry-seed-negative", sim("data.symmetry_augmentation.seed=-1"),
         "data.symmetry_augmentation.seed"),
    Case("train-out-is-a-file", ("train", MICRO, "--data", "{data}", "--out", "{file}", "--no-progress"),
         "--out {file} is a file"),
    Case("evaluate-out-is-a-file", ("evaluate", MICRO, "--data", "{data}", "--model", "{empty_dir}",
                                    "--out", "{file}"), "--out {file} is a file"),
    Case("scaling-out-is-a-file", ("scaling", MICRO, "--data", "{data}", "--out", "{file}"), "--out {file} is a file"),
    Case("evaluate-model-missing", ("evaluate", MICRO, "--data", "{data}", "--model", "{tmp}/nomodel",
                                    "--out", "{tmp}/e"), "{tmp}/nomodel"),
    Case("evaluate-model-not-a-model", ("evaluate", MICRO, "--data", "{data}", "--model", "{empty_dir}",
                                        "--out", "{tmp}/e"), "{empty_dir}"),
    Case("simulate-out-is-a-file", ("simulate", MICRO, "--out", "{file}", "--no-progress"), "{file}"),
    Case("simulate-plan-cache-dir-is-a-file", sim("execution.plan_cache_dir={file}"),
         "execution.plan_cache_dir={file}: cannot store the plan there"),
    Case("simulate-into-a-truncated-store", ("simulate", MICRO, "--out", "{truncated_parent}", "--no-progress"),
         "data.mdb is truncated"),
    Case("run-out-is-a-file", ("run", MICRO, "--out", "{file}", "--no-progress"), "{file}"),
    # -- issue 18: microscope files read by `namsa reconstruct` ------------------------------
    Case("reconstruct-out-below-a-file", ("reconstruct", "{tmp}/scan.hspy", "--model", "pretrained:study-scan",
                                          "--out", "{file}/maps"), "--out {file}/maps lies below {file}, which is a file"),
    Case("reconstruct-out-under-proc", ("reconstruct", "{tmp}/scan.hspy", "--model", "pretrained:study-scan",
                                        "--out", "/proc/namsa-maps"), "--out /proc/namsa-maps: cannot create the lock file"),
    Case("reconstruct-out-holds-other-files", ("reconstruct", "{tmp}/scan.hspy", "--model", "pretrained:study-scan",
                                               "--out", "{junk_dir}"),
         "holds files this command did not write (e.g. 'notes.txt')"),
    Case("reconstruct-with-set", ("reconstruct", "{tmp}/scan.hspy", "--model", "pretrained:study-scan",
                                  "--out", "{tmp}/maps", "--set", "simulation.energy_kv=300"),
         "--set: reconstruct reads no pipeline config, so there is nothing to override"),
    # -- issue 21: the patterns themselves, checked before inference -------------------------
    Case("reconstruct-spot-patterns", ("reconstruct", "{spots_scan}", "--model", "pretrained:study-scan",
                                       "--out", "{tmp}/maps"), "the patterns do not look like CBED"),
    Case("reconstruct-disc-radius-mismatch", ("reconstruct", "{wide_disc_scan}", "--model", "pretrained:study-scan",
                                              "--out", "{tmp}/maps"),
         "the bright-field disc has a radius of 8.93 px but the semi-angle 20 mrad (file metadata)"),
    # -- issue 21: microscope files, bounded memory and calibrations ----------------------
    Case("reconstruct-no-calibrations", ("reconstruct", "{bare_scan}", "--model", "pretrained:study-scan",
                                         "--out", "{tmp}/maps"),
         "lacks 4 calibration(s): beam energy (kV) (--energy-kv); convergence semi-angle (mrad) (--semiangle-mrad); "
         "detector pixel size"),
    Case("reconstruct-memory-gb-zero", ("reconstruct", "{bare_scan}", "--model", "pretrained:study-scan",
                                        "--out", "{tmp}/maps", "--memory-gb", "0"),
         "argument --memory-gb: '0' must be a positive number"),
    # (end of microscope files)
    # -- issue 18: model directories, cards, safetensors and checkpoints --------------------
    Case("evaluate-model-is-a-file", ("evaluate", MICRO, "--data", "{data}", "--model", "{file}", "--out", "{tmp}/e"),
         "is neither a model dir"),
    Case("evaluate-pretrained-traversal", ("evaluate", MICRO, "--data", "{data}", "--model",
                                           "pretrained:../pretrained/study-scan", "--out", "{tmp}/e"),
         "no pretrained reconstructor '../pretrained/study-scan'"),
    # (end of model directories)
    # -- issue 18: one writer per output, stores written exactly once ----------------------
    Case("train-out-below-a-file", ("train", MICRO, "--data", "{data}", "--out", "{file}/t", "--no-progress"),
         "--out {file}/t lies below {file}, which is a file"),
    Case("run-out-below-a-file", ("run", MICRO, "--out", "{file}/r", "--no-progress"),
         "--out {file}/r lies below {file}, which is a file"),
    Case("wait-is-not-for-simulate", ("simulate", MICRO, "--out", "{tmp}/o", "--wait"),
         "unrecognized arguments: --wait"),
    # (end of one writer per output)
    # -- issue 18: run directories, disk and permission errors, sizes and options ----------
    Case("generator-count-huge", sim("simulation.generator.count=1000000000"),
         "set generator.count to at most 20000"),
    Case("generator-seed-negative", sim("simulation.generator.seed=-1"),
         "simulation.generator.seed: Input should be greater than or equal to 0"),
    Case("generator-seed-huge", sim("simulation.generator.seed=100000000000000000000"),
         "simulation.generator.seed: Input should be less than or equal to"),
    Case("generator-template-refused", sim("simulation.generator.templates=[A2B_tI12_141_e_a]"),
         "not library ids or accepted AFLOW prototype labels"),
    Case("generator-substitution-unknown", sim("simulation.generator.substitution=probability"),
         "simulation.generator.substitution: Input should be 'any' or 'oxidation'"),
    Case("phonon-fraction-without-phonons", sim("simulation.variations.frozen_phonon_fraction=0.5"),
         "set variations.frozen_phonon: true, or leave the fraction out"),
    Case("simulation-seed-negative", sim("simulation.seed=-1"), "simulation.seed: Input should be greater than"),
    Case("plan-too-many-samples", sim("simulation.variations.tilt_mrad=1", "simulation.variants=1000000"),
         "one run plans at most 1000000"),
    Case("specimen-too-many-slices", sim("simulation.thickness_A=1000000000"), "slices, more than 10000"),
    Case("phonon-configs-huge", sim("simulation.variations.frozen_phonon=true", "simulation.phonon_configs=100000"),
         "simulation.phonon_configs: Input should be less than or equal to 1000"),
    Case("scaling-unknown-metric", ("scaling", MICRO, "--data", "{data}", "--out", "{tmp}/sc", "--no-progress",
                                    "--metric", "nosuch"), "--metric 'nosuch' is not a metric"),
    Case("evaluate-out-under-a-file", ("evaluate", MICRO, "--data", "{data}", "--model", "{empty_dir}",
                                       "--out", "{file}/e"), "{file}"),
    Case("scaling-out-under-a-file", ("scaling", MICRO, "--data", "{data}", "--out", "{file}/sc", "--no-progress"),
         "--out {file}/sc lies below {file}, which is a file"),
    Case("train-out-under-proc", ("train", MICRO, "--data", "{data}", "--out", "/proc/namsa-t", "--no-progress"),
         "--out /proc/namsa-t: cannot create the lock file /proc/.namsa-t.lock"),
    Case("evaluate-out-under-proc", ("evaluate", MICRO, "--data", "{data}", "--model", "{empty_dir}",
                                     "--out", "/proc/namsa-e"), "/proc/namsa-e"),
    Case("scaling-out-under-proc", ("scaling", MICRO, "--data", "{data}", "--out", "/proc/namsa-s", "--no-progress"),
         "--out /proc/namsa-s: cannot create the lock file /proc/.namsa-s.lock"),
    Case("run-out-under-proc", ("run", MICRO, "--out", "/proc/namsa-r", "--no-progress"), "--out /proc/namsa-r: cannot create the lock"),
    Case("simulate-out-under-proc", ("simulate", MICRO, "--out", "/proc/namsa-o", "--no-progress"), "/proc/namsa-o"),
    # (end of run directories and options)
    # -- issue 32 (A): run directories, --out, locks, child processes -------------------------
    Case("evaluate-out-holds-users-figures", ("evaluate", MICRO, "--data", "{data}", "--model", "{empty_dir}",
                                              "--out", "{users_figures}"),
         "holds files this command did not write (e.g. 'figures')"),
    Case("reconstruct-out-holds-users-map", ("reconstruct", "{tmp}/scan.hspy", "--model", "pretrained:study-scan",
                                             "--out", "{users_maps}"), "did not write (e.g. 'potential.npy')"),
    Case("run-linked-log", ("run", MICRO, "--out", "{run_linked_log}", "--no-progress"),
         "logs/run.log is a symbolic link to"),
    Case("run-linked-store", ("run", MICRO, "--out", "{run_linked_store}", "--no-progress"),
         "data/store-000 is a symbolic link to"),
    Case("run-linked-claims", ("run", MICRO, "--out", "{run_linked_claims}", "--no-progress"),
         "data/.claims is a symbolic link to"),
    # -- issue 32 (B): stores that resume after a kill or a repair -----------------------------
    Case("simulate-into-a-store-killed-before-its-info", ("simulate", MICRO, "--out", "{killed_resume}",
                                                          "--no-progress", "--worker", "0", "--of", "8"), "", "ok"),
    Case("simulate-into-an-empty-store-of-other-physics", ("simulate", MICRO, "--out", "{killed_other_physics}",
                                                           "--no-progress", "--worker", "0", "--of", "8"), "", "ok"),
    Case("stage-a-store-killed-before-its-info", ("stage", "{killed_empty}", "{tmp}/s", "--no-progress"),
         "holds no samples (a store whose writer was killed before its first sample is empty)"),
    Case("stage-shard-of-a-store-killed-before-its-info", ("stage", "{killed_empty}", "{tmp}/s", "--rank", "1",
                                                            "--world-size", "2", "--no-progress"),
         "run namsa simulate into it first, then stage it"),
    Case("stage-empty-shard-beside-a-killed-store", ("stage", "{killed_beside_full}", "{tmp}/s", "--rank", "13",
                                                     "--world-size", "14", "--no-progress"), "", "ok"),
    Case("inspect-a-store-killed-before-its-info", ("inspect", "{killed_empty}"), "problems in 1 of 1 store(s)",
         "found"),
    Case("simulate-linked-claims", ("simulate", MICRO, "--out", "{sim_linked_claims}", "--no-progress", "--worker",
                                    "0", "--of", "8"), "/.claims is a symbolic link to"),
    Case("train-on-a-store-killed-before-its-info", ("train", MICRO, "--data", "{killed_empty}", "--out", "{tmp}/t",
                                                     "--no-progress"), "hold no samples; run namsa simulate first"),
    # -- issue 32 (C): config files and structures, bounded before validation ------------------
    Case("config-alias-bomb", cfg("alias_bomb"), "values once its aliases (*name) are expanded"),
    Case("config-alias-cycle", cfg("alias_cycle"), "alias *m refers to a value that contains the alias itself"),
    Case("config-duplicate-section", cfg("duplicate_section"), "key 'simulation' appears twice (lines 1 and 3)"),
    Case("config-deep-nesting", cfg("deep"), "values nest more than 64 levels deep"),
    Case("config-too-large", cfg("huge"), "larger than 256 KiB"),
    Case("config-huge-integer", cfg("huge_integer"), "a value cannot be read (Exceeds the limit (4300 digits)"),
    Case("set-alias-bomb", sim("name=[&a [x,x,x,x,x,x,x,x,x,x], " + ", ".join(
        f"&{c} [{','.join(['*' + p] * 10)}]" for p, c in zip("abcdefgh", "bcdefghi")) + "]"),
         "--set name: line 1: the value stands for more than 100,000 values"),
    Case("set-deep-nesting", sim("name=" + "[" * 200 + "]" * 200), "--set name: line 1: values nest more than 64"),
    Case("set-duplicate-key", sim("evaluation.multislice_ptycho={{max_samples: 1, max_samples: 2}}"),
         "key 'max_samples' appears twice"),
    Case("set-key-too-deep", sim(".".join(["simulation"] * 100) + "=1"), "the key nests more than 64 levels"),
    Case("training-seed-1e30", sim("training.seed=1" + "0" * 30),
         "training.seed: Input should be less than or equal to 9223372036854775807"),
    Case("training-seed-negative", sim("training.seed=-1"), "training.seed: Input should be greater than or equal to 0"),
    Case("split-seed-2-64", sim(f"data.split_seed={2**64}"), "data.split_seed: Input should be less than or equal"),
    Case("evaluation-seed-2-63", sim(f"evaluation.seed={2**63}"), "evaluation.seed: Input should be less than or equal"),
    Case("dose-seed-2-63", sim(f"data.dose_augmentation.seed={2**63}"),
         "data.dose_augmentation.seed: Input should be less than or equal"),
    Case("cif-20000-atoms", sim("simulation.materials=[]", "simulation.cif_dir={big_cif_dir}"),
         "big.cif: CIF '{big_cif_dir}/big.cif' holds 20,000 atoms, more than the 2,000"),
    # -- issue 32 (D): microscope files and their readers --------------------------------------
    Case("reconstruct-energy-in-volts", ("reconstruct", "{volts_scan}", "--model", "pretrained:study-scan",
                                         "--out", "{tmp}/maps"),
         "the beam energy 200000 kV (file metadata) is outside the 1-3000 kV electron microscopes use (is it in V?"),
    Case("reconstruct-energy-flag-in-volts", ("reconstruct", "{wide_disc_scan}", "--model", "pretrained:study-scan",
                                              "--out", "{tmp}/maps", "--energy-kv", "200000"),
         "the beam energy 200000 kV (command line (--energy-kv)) is outside the 1-3000 kV"),
    Case("reconstruct-negated-data", ("reconstruct", "{negated_scan}", "--model", "pretrained:study-scan",
                                      "--out", "{tmp}/maps"), "the data are negative (the mean pattern spans"),
    Case("reconstruct-raw-not-xml", ("reconstruct", "{empad_raw}", "--model", "pretrained:study-scan",
                                     "--out", "{tmp}/maps"), "an EMPAD .raw file is read through its XML header"),
    Case("reconstruct-no-scan-positions", ("reconstruct", "{no_positions_scan}", "--model", "pretrained:study-scan",
                                           "--out", "{tmp}/maps"), "its 4-D dataset has shape (0, 8, 32, 32)"),
    Case("reconstruct-zero-detector", ("reconstruct", "{no_detector_scan}", "--model", "pretrained:study-scan",
                                       "--out", "{tmp}/maps"), "its 4-D dataset has shape (8, 8, 0, 0)"),
    Case("reconstruct-declared-never-written", ("reconstruct", "{unwritten_scan}", "--model",
                                                "pretrained:study-scan", "--out", "{tmp}/maps"),
         "declares a 64 x 64 x 4096 x 4096 float32 dataset (256 GiB) but holds only"),
    Case("reconstruct-damaged-chunk", ("reconstruct", "{damaged_scan}", "--model", "pretrained:study-scan",
                                       "--out", "{tmp}/maps"),
         "damaged.hspy: its data could not be read (Can't synchronously read data"),
    Case("reconstruct-input-name-too-long", ("reconstruct", "{tmp}/" + "a" * 300 + ".hspy", "--model",
                                             "pretrained:study-scan", "--out", "{tmp}/maps"),
         ".hspy could not be read (File name too long); check the file is readable"),
    # -- issue 31: microscope data II (low dose, every problem at once, spot patterns) ----------
    Case("reconstruct-precession-spots", ("reconstruct", "{precession_scan}", "--model", "pretrained:study-scan",
                                          "--out", "{tmp}/maps"),
         "do not look like CBED (the direct beam has no edge: it fades from 70% of its level"),
    Case("reconstruct-every-unfixable-problem", ("reconstruct", "{unfixable_scan}", "--model", "pretrained:study-scan",
                                                 "--out", "{tmp}/maps"),
         "3 problems: (1) the scan step along y is 2 Angstrom but the model was trained on steps of 0.3675-0.765 "
         "Angstrom (and its 8 positions are fewer than the 32 the model needs)"),
    Case("reconstruct-blank-scan", ("reconstruct", "{blank_scan}", "--model", "pretrained:study-scan",
                                    "--out", "{tmp}/maps"), "every pixel of every pattern is 0: the beam was blanked"),
    Case("reconstruct-30-electrons-per-square-angstrom", ("reconstruct", "{low_dose_scan}", "--model",
                                                         "pretrained:study-scan", "--out", "{tmp}/maps"),
         "below the 100-1e+06 e/Angstrom^2 the model was trained at", "ok"),
    # -- issue 32 (E): model directories, cards, weights and their maps ------------------------
    Case("evaluate-model-weights-a-symlink", ev("{model_weights_link}"), "model.safetensors is a symbolic link"),
    Case("evaluate-model-card-a-symlink", ev("{model_card_link}"), "model_card.json is a symbolic link"),
    Case("evaluate-model-weights-a-fifo", ev("{model_weights_fifo}"), "model.safetensors is not a regular file"),
    Case("evaluate-model-nan-weights", ev("{model_nan}"), "non-finite values (NaN or inf) in tensor 'head.weight'"),
    Case("evaluate-model-header-above-cap", ev("{model_huge_header}"), "above the 16 MiB this reader accepts"),
    Case("evaluate-model-header-past-the-end", ev("{model_header_past_end}"), "the header lies or the file is truncated"),
    Case("evaluate-model-absurd-normalizer", ev("{model_absurd_normalizer}"),
         "targets.potential std is 1e+30, outside what a training set gives"),
    Case("evaluate-model-expects-vs-architecture", ev("{model_expects_mismatch}"),
         "expects_input.scan_shape [32, 32] holds 1024 patterns but architecture.in_channels is 64"),
    # -- neighbours that must succeed ---------------------------------------------------------
    Case("inspect-a-good-store", ("inspect", "--verify", "{data}"), "", "ok"),
    Case("simulate-one-bad-material", sim("simulation.materials=[Si-diamond,Unobtainium]",
                                          "simulation.zone_axes=[[0,0,1]]"),
         "namsa: warning: 1 samples or materials failed and were skipped (the first: Unobtainium", "ok"),
]


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
