"""The bad-input catalogue's cases (docs/bad-inputs.md lists them by kind): what each command gets and
what must happen; here the case type, its argv builders and the command-line, config, simulate and
store cases (tests/bad_input_cases_received.py the rest). tests/test_bad_inputs.py builds the files
they name (``{data}``, ``{model_nan}``, ...) and runs them; these modules are data only."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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

COMMAND_CASES: list[Case] = [
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
]
