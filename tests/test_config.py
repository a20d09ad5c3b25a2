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
