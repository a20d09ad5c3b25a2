"""The `namsa` CLI: --help everywhere, one-line errors with exit status 2, real stage runs."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

import stage
from workflow.cli import build_parser, main
from workflow.errors import EXIT_BAD_INPUT

SUBCOMMANDS = ("simulate", "stage", "inspect", "train", "evaluate", "run", "scaling", "reconstruct", "precompute",
               "publish", "perfmodel", "tuning")

MICRO = Path(__file__).resolve().parents[1] / "configs" / "micro.yaml"


def micro_with_bad_material(tmp_path: Path) -> Path:
    """configs/micro.yaml plus one structure id that does not exist."""
    cfg = tmp_path / "micro.yaml"
    cfg.write_text(MICRO.read_text().replace("Cu-fcc]", "Cu-fcc, no-such-material]"))
    return cfg


def test_every_subcommand_is_registered():
    actions = [a for a in build_parser()._actions if a.dest == "command"]
    assert set(actions[0].choices) == set(SUBCOMMANDS)


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: namsa {command}")


def test_config_commands_take_a_config_and_overrides(capsys):
    for command in ("simulate", "train", "evaluate", "run", "scaling", "precompute"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "CONFIG" in out and "--set KEY=VALUE" in out, command


README = Path(__file__).resolve().parents[1] / "README.md"


def _takes_set(parser: argparse.ArgumentParser) -> bool:
    """Whether a subcommand takes --set as a documented option (reconstruct's refusal is hidden)."""
    return any("--set" in a.option_strings and a.help != argparse.SUPPRESS for a in parser._actions)


def test_set_is_taken_by_exactly_the_commands_the_readme_names():
    readme = " ".join(README.read_text().split())
    said = re.search(r"The subcommands that read a CONFIG \(([^)]*)\) take `--set", readme)
    without = re.search(r"overrides; ([^;.]*) read no config \(", readme)
    assert said and without, "README.md no longer says which subcommands take --set"
    named, unnamed = set(re.findall(r"`(\w+)`", said.group(1))), set(re.findall(r"`(\w+)`", without.group(1)))
    subparsers = [a for a in build_parser()._actions if a.dest == "command"][0].choices
    assert named == {name for name, p in subparsers.items() if _takes_set(p)}
    assert unnamed == set(SUBCOMMANDS) - named


def test_reconstruct_refuses_set_saying_it_reads_no_config(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["reconstruct", str(tmp_path / "scan.hspy"), "--model", "pretrained:study-scan", "--out",
              str(tmp_path / "maps"), "--set", "simulation.energy_kv=300"])
    assert exit_info.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("namsa: error: reconstruct: --set: reconstruct reads no pipeline "
                                               "config"), err
    assert "--energy-kv" in err[0] and not (tmp_path / "maps").exists()
    with pytest.raises(SystemExit):
        main(["reconstruct", "--help"])
    assert "takes no --set" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", ["evaluate", "reconstruct"])
def test_model_help_documents_pretrained_names(command, capsys, monkeypatch):
    import models

    monkeypatch.setenv("COLUMNS", "1000")   # one line per option: no name broken at a hyphen
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    model_help = out[out.rindex("--model DIR|pretrained:<name> "):]   # the option's entry, not the usage line
    names = models.pretrained_names()
    assert names and "or pretrained:<name> for a reconstructor shipped with namsa" in model_help
    assert f"shipped: {', '.join(names)}; the flagship, the best on held-out types: {models.flagship_name()}" \
        in model_help
    assert models.flagship_name() in names


def test_building_the_parser_and_printing_help_do_not_import_torch():
    # The shipped names come from the package's files (models.pretrained_index): --help, even with the list
    # of shipped models, starts no torch (it took 7-8 s on a cold machine)
    for code in ("from workflow.cli import build_parser; build_parser()",
                 "from workflow.cli import main\ntry:\n    main(['reconstruct', '--help'])\nexcept SystemExit:\n    pass"):
        probe = f"import sys\n{code}\nprint('torch' in sys.modules, file=sys.stderr)"
        err = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stderr
        assert err.strip().splitlines()[-1] == "False", code


def test_every_help_example_of_set_names_a_real_config_key(capsys):
    """The --set example in the help of every config command (and in the errors of a bad --set) applies to
    the default config: it once named training.steps, a key that does not exist."""
    from workflow.config import load_config

    examples = set()
    for command in ("simulate", "train", "evaluate", "run", "scaling", "precompute"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        examples |= set(re.findall(r"--set ([a-z_]+\.[\w.]+=\S+?)\s", " ".join(capsys.readouterr().out.split()) + " "))
    assert examples
    for example in examples:
        key, value = example.split("=")
        config = load_config(None, overrides=[example])
        section, name = key.split(".")
        assert str(getattr(getattr(config, section), name)) == value, example


@pytest.mark.parametrize("command,flag,default", [("simulate", "--worker", "default 0"), ("simulate", "--of", "default 1"),
                                                  ("stage", "--threads", "default 4"),
                                                  ("scaling", "--metric", "default rel_l2")])
def test_options_with_a_default_say_it(command, flag, default, capsys):
    parser = [a for a in build_parser()._actions if a.dest == "command"][0].choices[command]
    action = next(a for a in parser._actions if flag in a.option_strings)
    assert default in action.help and default.split()[-1] == str(action.default), (flag, action.help)


def test_bad_config_key_exits_2_with_one_line(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("execution:\n  profile: cloud\n")
    assert main(["run", str(cfg), "--out", str(tmp_path / "run")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err == ("namsa: error: bad.yaml: execution.profile: unknown profile 'cloud'; "
                   "choose one of local, local-htex, slurm, pbs\n")
    assert not (tmp_path / "run").exists()


def test_bad_override_exits_2(tmp_path, capsys):
    assert main(["simulate", "--out", str(tmp_path), "--set", "simulation.energy_kv=fast"]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.startswith("namsa: error: quickstart.yaml: simulation.energy_kv: "
                                              "Input should be a valid number")


def test_bad_worker_index_exits_2(tmp_path, capsys):
    assert main(["simulate", "--out", str(tmp_path), "--worker", "3", "--of", "2"]) == EXIT_BAD_INPUT
    assert "--worker 3 must be in [0, --of 2)" in capsys.readouterr().err


def test_console_script_reports_missing_config(tmp_path):
    # The installed entry point itself (pyproject [project.scripts]), not just main().
    script = Path(sys.executable).parent / "namsa"
    proc = subprocess.run([str(script), "train", str(tmp_path / "missing.yaml"), "--data", str(tmp_path),
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr.strip().splitlines() == [
        f"namsa: error: {tmp_path / 'missing.yaml'}: config file not found; pass a YAML file such as "
        "configs/quickstart.yaml"]


def test_simulate_writes_a_store_records_the_bad_material_and_resumes(tmp_path, capsys):
    cfg = micro_with_bad_material(tmp_path)
    out = tmp_path / "data"
    assert main(["simulate", str(cfg), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "8 written, 0 already stored, 1 failed" in printed
    assert "failed: no-such-material: unknown structure id" in printed
    with stage.open_stores(stage.find_stores(out)) as stores:
        assert len(stores) == 8
        assert {s.split("__")[0] for s in stores.ids()} == {"Si-diamond", "GaAs-zincblende", "MgO-rocksalt", "Cu-fcc"}
    # A rerun with two workers finds everything stored and simulates nothing.
    assert main(["simulate", str(cfg), "--out", str(out), "--no-progress", "--worker", "1", "--of", "2"]) == 0
    assert "0 written, 4 already stored" in capsys.readouterr().out


def test_inspect_and_stage_a_simulated_store(tmp_path, capsys):
    data, local = tmp_path / "data", tmp_path / "node-local"
    assert main(["simulate", str(MICRO), "--out", str(data), "--no-progress", "--set", "simulation.zone_axes=[[0,0,1]]"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(data), "--verify"]) == 0
    assert "store-000" in capsys.readouterr().out
    assert main(["stage", str(data), str(local), "--no-progress"]) == 0
    assert "copied 4 samples" in capsys.readouterr().out
    with stage.open_stores(stage.find_stores(local)) as stores:
        assert len(stores) == 4
    # Staging into the source itself is bad input: exit 2 and one line.
    assert main(["stage", str(data), str(data / "inside"), "--no-progress"]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.count("\n") == 1


def test_scaling_without_progress_bars_prints_only_its_result(tmp_path, capsys):
    data, out = tmp_path / "data", tmp_path / "scaling"
    assert main(["simulate", str(MICRO), "--out", str(data), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["scaling", str(MICRO), "--data", str(data), "--out", str(out), "--fractions", "1",
                 "--no-progress", "--set", "evaluation.n_panels=0", "--set", "evaluation.worst_k=0"]) == 0
    printed = capsys.readouterr()
    assert "step/s" not in printed.err + printed.out   # no tqdm bar from the training runs
    assert printed.out.startswith("scaling study: ") and (out / "scaling.json").is_file()


def test_inspect_of_a_missing_directory_is_bad_input(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nothing")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("namsa: error: no store at") and err.count("\n") == 1


def test_bad_scaling_fractions_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["scaling", "--data", str(tmp_path), "--out", str(tmp_path), "--fractions", "0.5,2"])
    assert exit_info.value.code == EXIT_BAD_INPUT
    assert "every fraction must be in (0, 1]" in capsys.readouterr().err


def test_train_refuses_data_whose_scan_differs_from_the_models_scan_shape(tmp_path, capsys):
    """`namsa train` alone applies the scan-shape rule (models.config.Architecture.data_mismatch): a
    4 x 16 scan holds the 64 patterns an 8 x 8 scan-layout model takes, but not its positions."""
    from stage_helpers import CONFIG_HASH, make_samples

    data = tmp_path / "data"
    with stage.StoreWriter(data / "store-000", config_hash=CONFIG_HASH, data_cfg=stage.DataConfig()) as writer:
        for sample in make_samples(8, scan=(4, 16), px=8):
            writer.put(sample)
    cfg = tmp_path / "scan.yaml"
    cfg.write_text("model:\n  preset: scan\n  in_channels: 64\n  scan_shape: [8, 8]\n  pattern_bins: 4\n"
                   "simulation:\n  scan_shape: [8, 8]\n  pattern_px: 8\n  target_px: 8\n"
                   "training:\n  device: cpu\n  max_steps: 1\n  progress: false\n")
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--data", str(data), "--out", str(out), "--no-progress"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("namsa: error: model.scan_shape [8, 8] differs from "
                                                   "simulation.scan_shape [4, 16]; set model.scan_shape"), err
    assert not (out / "checkpoints").exists()


def test_publish_writes_only_where_it_is_told(tmp_path, capsys):
    """`namsa publish` needs --out DIR or --into-package (the source tree only on request); bad input is
    one line."""
    for where in ([], ["--out", str(tmp_path / "o"), "--into-package"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["publish", str(tmp_path / "run"), "x", *where])
        err = capsys.readouterr().err
        assert exit_info.value.code == EXIT_BAD_INPUT and err.count("\n") == 1
        assert "one of the arguments --out --into-package is required" in err or "not allowed with argument" in err
    assert main(["publish", str(tmp_path / "run"), "x", "--out", str(tmp_path / "o")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is missing; run the whole pipeline first" in err
    assert not (tmp_path / "o").exists()


def test_no_module_has_an_entry_point_of_its_own():
    """Every command is a `namsa` subcommand: no `python -m <room>.<module>` besides the CLI itself."""
    root = Path(__file__).resolve().parents[1]
    rooms = ("namsa", "stage", "models", "evaluation", "workflow")
    modules = [p for room in rooms for p in (root / room).rglob("*.py")]
    mains = [str(p.relative_to(root)) for p in modules if "__main__" in p.read_text()]
    assert mains == ["workflow/cli.py"]


@pytest.mark.parametrize("model", ["measure", "scaling", "coordination"])
def test_perfmodel_models_have_help(model, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["perfmodel", model, "--help"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith(f"usage: namsa perfmodel {model}")


def test_tuning_without_out_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["tuning", "--ranks", "2"])
    err = capsys.readouterr().err
    assert exit_info.value.code == EXIT_BAD_INPUT and err.count("\n") == 1 and "required: --out" in err
