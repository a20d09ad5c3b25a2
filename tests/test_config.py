"""Pipeline config: loading, `--set` overrides, one-line errors naming the key."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from namsa.errors import UserError
from workflow.config import (
    PROFILE_NAMES,
    ConfigError,
    PipelineConfig,
    apply_overrides,
    default_config_path,
    load_config,
    parse_override,
    save_resolved,
)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_embedded_default_is_the_quickstart_file():
    # One source of truth: the packaged default must be byte-identical to configs/quickstart.yaml.
    assert default_config_path().read_bytes() == (REPO / "configs" / "quickstart.yaml").read_bytes()
    assert load_config().name == "quickstart"


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_validates(path):
    cfg = load_config(path)
    assert cfg.execution.profile in PROFILE_NAMES


def test_overrides_are_parsed_as_yaml_and_nested():
    raw = apply_overrides({"execution": {"workers": 2}},
                          ["execution.workers=4", "execution.slurm.partition=gpu",
                           "data.split_fractions=[0.8, 0.1, 0.1]", "data.node_local_dir=null"])
    assert raw["execution"] == {"workers": 4, "slurm": {"partition": "gpu"}}
    assert raw["data"] == {"split_fractions": [0.8, 0.1, 0.1], "node_local_dir": None}


def test_override_applies_to_loaded_config(tmp_path):
    cfg = load_config(write(tmp_path, "name: a\n"), ["execution.profile=slurm", "name=b",
                                                     "execution.slurm.walltime=00:30:00"])
    assert (cfg.name, cfg.execution.profile, cfg.execution.slurm.walltime) == ("b", "slurm", "00:30:00")


@pytest.mark.parametrize("text", ["novalue", "=3", "a..b=1", "execution.workers"])
def test_malformed_override_is_a_one_line_error(text):
    with pytest.raises(ConfigError, match="dotted.key=value"):
        parse_override(text)


def test_override_into_a_scalar_names_the_key():
    with pytest.raises(ConfigError, match=r"execution.workers is the value 2, not a section"):
        apply_overrides({"execution": {"workers": 2}}, ["execution.workers.x=1"])


def test_unknown_key_names_the_dotted_key_and_the_allowed_keys(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "execution:\n  wrokers: 3\n"))
    message = str(err.value)
    assert message.startswith("cfg.yaml: execution.wrokers: unknown key; allowed keys here:")
    assert "workers" in message and "\n" not in message


def test_unknown_top_level_section(tmp_path):
    with pytest.raises(ConfigError, match=r"cfg.yaml: simulatoin: unknown key"):
        load_config(write(tmp_path, "simulatoin: {}\n"))


def test_wrong_type_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^cfg.yaml: execution.workers: Input should be a valid integer"):
        load_config(write(tmp_path, "execution:\n  workers: many\n"))


def test_wrong_type_from_override_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"execution.min_success_fraction: Input should be less than or equal to 1"):
        load_config(write(tmp_path, "name: x\n"), ["execution.min_success_fraction=2"])


def test_unknown_profile_lists_the_profiles(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "execution:\n  profile: kubernetes\n"))
    assert str(err.value) == ("cfg.yaml: execution.profile: unknown profile 'kubernetes'; "
                              "choose one of local, local-htex, slurm, pbs")


def test_errors_are_user_errors_on_one_line(tmp_path):
    with pytest.raises(UserError) as err:
        load_config(write(tmp_path, "execution:\n  workers: 0\n  retries: -1\n  bogus: 1\n"))
    message = str(err.value)
    assert "\n" not in message
    for key in ("execution.workers", "execution.retries", "execution.bogus"):
        assert key in message


def test_missing_file_and_bad_yaml_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "execution: [unclosed\n"))
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_bad_run_name(tmp_path):
    with pytest.raises(ConfigError, match="name: name '../x' must be a plain directory name"):
        load_config(write(tmp_path, "name: ../x\n"))


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(write(tmp_path, "name: rt\n"), ["execution.workers=3"])
    path = save_resolved(cfg, tmp_path / "run" / "config.resolved.yaml")
    resolved = yaml.safe_load(path.read_text())
    # Every section is spelled out, defaults included, and it loads back to the same config.
    assert set(resolved) == set(PipelineConfig.model_fields)
    assert load_config(path) == cfg


def test_section_errors_name_the_dotted_key(tmp_path):
    # The sections owned by the other rooms are validated in place, with the same one-line errors.
    with pytest.raises(ConfigError, match=r"^cfg.yaml: simulation.energy_kv: Input should be a valid number"):
        load_config(write(tmp_path, "simulation:\n  energy_kv: fast\n"))
    with pytest.raises(ConfigError, match=r"^cfg.yaml: evaluation.split: Input should be 'train', 'dev', 'test' or 'all'"):
        load_config(write(tmp_path, "name: x\n"), ["evaluation.split=validation"])
    with pytest.raises(ConfigError, match=r"^cfg.yaml: simulation.aberrations.C5_mm: unknown key; allowed keys here: C1_A, C3_mm"):
        load_config(write(tmp_path, "name: x\n"), ["simulation.aberrations.C5_mm=1"])


def test_model_must_fit_the_simulated_data(tmp_path):
    with pytest.raises(ConfigError, match=r"the data has 16 patterns per sample but the model expects in_channels=1024; "
                                          r"set model.in_channels=16 .*\(model preset small\)"):
        load_config(write(tmp_path, "simulation:\n  scan_shape: [4, 4]\n"))
    with pytest.raises(ConfigError, match=r"pattern_px=20 is not a multiple of 8 \(tu_stride\^levels\)"):
        load_config(write(tmp_path, "name: x\n"), ["simulation.pattern_px=20", "simulation.target_px=20"])


# -- issue 32 (C): the loader is bounded before anything is built -----------------------------

def _alias_levels(levels: int, width: int = 10) -> str:
    """``levels`` anchors, each a list of ``width`` aliases of the one before: width**levels values."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_while_composing(tmp_path):
    with pytest.raises(ConfigError, match=r"line 5: the value stands for more than 100,000 values"):
        load_config(write(tmp_path, _alias_levels(10)))


def test_aliases_of_modest_size_and_merge_keys_still_load():
    from workflow.safe_yaml import load_yaml

    small = load_yaml(_alias_levels(3))           # 1,000 values: an ordinary use of anchors
    assert len(small["a2"]) == 10 and small["a2"][0] == small["a1"]
    merged = load_yaml("base: &b {energy_kv: 200, seed: 1}\nsim: {<<: *b, seed: 2}\n")
    assert merged["sim"] == {"energy_kv": 200, "seed": 2}   # a merge key's override is no duplicate


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"alias \*m refers to a value that contains the alias itself"):
        load_config(write(tmp_path, "simulation:\n  materials: &m [Si, [*m]]\n"))


def test_a_repeated_key_names_the_key_and_both_lines(tmp_path):
    text = "simulation:\n  energy_kv: 200\ntraining:\n  max_steps: 3\nsimulation:\n  energy_kv: 100\n"
    with pytest.raises(ConfigError, match=r"key 'simulation' appears twice \(lines 1 and 5\)"):
        load_config(write(tmp_path, text))
    with pytest.raises(ConfigError, match=r"key 'energy_kv' appears twice \(lines 2 and 3\)"):
        load_config(write(tmp_path, "simulation:\n  energy_kv: 200\n  energy_kv: 100\n"))


@pytest.mark.parametrize("text", ["name: " + "[" * 5000 + "]" * 5000,
                                  "name: " + "{a: " * 3000 + "1" + "}" * 3000,
                                  "a0: &a0 1\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 300))])
def test_deep_nesting_is_one_line_not_a_recursion_error(tmp_path, text):
    with pytest.raises(ConfigError, match="nest more than 64 levels deep"):
        load_config(write(tmp_path, text))


def test_a_file_larger_than_any_config_is_refused_unread(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_bytes(b"name: x\n" + b"#" * (300 * 1024))
    with pytest.raises(ConfigError, match="larger than 256 KiB"):
        load_config(path)


@pytest.mark.parametrize("value, says", [("2024-13-45", "month must be in 1..12"),
                                         ("9" * 5000, "Exceeds the limit (4300 digits)")])
def test_a_value_python_cannot_build_is_one_line(tmp_path, value, says):
    with pytest.raises(ConfigError, match=r"a value cannot be read \(" + says.replace("(", r"\(").replace(")", r"\)")):
        load_config(write(tmp_path, f"name: {value}\n"))
    with pytest.raises(ConfigError, match=r"--set name: a value cannot be read"):
        parse_override(f"name={value}")


def test_overrides_use_the_same_bounded_loader():
    with pytest.raises(ConfigError, match="key 'a' appears twice"):
        parse_override("evaluation.multislice_ptycho={a: 1, a: 2}")
    with pytest.raises(ConfigError, match="nest more than 64"):
        parse_override("name=" + "[" * 100 + "]" * 100)
    with pytest.raises(ConfigError, match="the key nests more than 64 levels"):
        parse_override(".".join(["a"] * 65) + "=1")


@pytest.mark.parametrize("key", ["simulation.seed", "simulation.generator.seed", "data.split_seed",
                                 "data.dose_augmentation.seed", "data.symmetry_augmentation.seed",
                                 "training.seed", "evaluation.seed"])
def test_every_seed_is_in_0_to_2_63(tmp_path, key):
    path = REPO / "configs" / "micro.yaml"
    assert load_config(path, [f"{key}={2**63 - 1}"])
    for bad in (2**63, 10**30, -1):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.") + ": Input should be"):
            load_config(path, [f"{key}={bad}"])
