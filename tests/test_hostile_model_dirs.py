"""Damaged or hostile model directories: every one is refused with one line before anything is built.

Each case takes a real model directory (a tiny network saved by `checkpoint.save_checkpoint` and
exported by `models.training.export_model`, the code `namsa train` runs) and mutates its card or its
safetensors file. The property, through `models.load_reconstructor` and through
`namsa evaluate` (`workflow.cli.main`): a `UserError` of one line / exit 2 with one
``namsa: error:`` line, never a traceback. Before issue 18, 26 of 32 such directories ended in a
traceback (JSONDecodeError, KeyError, TypeError, SafetensorError, size mismatch, ...). Checkpoint
directories and a full disk at a checkpoint save: test_hostile_checkpoints.py.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import models
import stage
from models import checkpoint as ckpt
from models.card import CARD_FILE, MAX_CARD_BYTES, read_card_file
from models.errors import ModelDirError
from models.safe_files import inside
from models.weights_check import MAX_PARAMETERS
from namsa.errors import UserError
from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from stage_helpers import CONFIG_HASH, make_samples
from workflow.cli import main

REPO = Path(__file__).resolve().parents[1]
MICRO = str(REPO / "configs" / "micro.yaml")
SHIPPED = REPO / "models" / "pretrained" / "study-scan"


def tiny_state(targets: tuple[str, ...] = ("potential",)) -> tuple[torch.nn.Module, dict]:
    """A tiny network and the JSON state the trainer records beside it."""
    cfg = models.ModelConfig(preset="tiny", targets=list(targets))
    torch.manual_seed(0)
    model = models.build_model(cfg)
    norm = stage.Normalizer("log1p", 0.1, 0.2, {t: (1.0, 2.0) for t in targets}, 64.0)
    state = {"architecture": model.arch.to_dict(), "targets": list(targets),
             "model_config": cfg.model_dump(mode="json"), "train_config": models.TrainConfig().model_dump(mode="json"),
             "normalizer": norm.to_dict(), "data_manifest_hash": "0" * 64, "code_version": "test"}
    return model, state


def make_run(root: Path) -> Path:
    """A run directory: checkpoints/step-00000001 and model/ exported from it; returns the run."""
    from models.training import export_model

    model, state = tiny_state()
    opt = torch.optim.Adam(model.parameters())
    step = ckpt.save_checkpoint(root / "checkpoints", 1, model.state_dict(), opt.state_dict(), state)
    export_model(step, root / "model", {"metrics_csv": str(root / "metrics.csv")})
    return root


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("base_run"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("hostile_data")
    with stage.StoreWriter(data / "store-000", config_hash=CONFIG_HASH) as writer:
        for sample in make_samples(4, variants=1, scan=(4, 4), px=32):
            writer.put(sample)
    return data


# ---------------------------------------------------------------------------------- mutations

def card_of(d: Path) -> dict:
    return json.loads((d / CARD_FILE).read_text())


def put_card(d: Path, card: dict) -> None:
    (d / CARD_FILE).write_text(json.dumps(card))


def edit(change: Callable[[dict], None]) -> Callable[[Path], None]:
    """A mutation of the card's JSON tree."""
    def apply(d: Path) -> None:
        card = card_of(d)
        change(card)
        put_card(d, card)
    return apply


def raw_card(data: bytes) -> Callable[[Path], None]:
    return lambda d: (d / CARD_FILE).write_bytes(data)


def record_weights(d: Path) -> None:
    """Re-record size and digest of the weights in the card, and as the last link of its chain of runs
    (``training.lineage``, which must end at them), as a careful forger would."""
    card = card_of(d)
    w = d / ckpt.MODEL_FILE
    card["files"][ckpt.MODEL_FILE] = {"bytes": w.stat().st_size, "xxh3_128": ckpt.file_digest(w)}
    if (card.get("training") or {}).get("lineage"):
        card["training"]["lineage"][-1]["weights_xxh3_128"] = card["files"][ckpt.MODEL_FILE]["xxh3_128"]
    put_card(d, card)


def weights_bytes(change: Callable[[bytes], bytes], record: bool = True) -> Callable[[Path], None]:
    """A mutation of the safetensors bytes (card re-recorded unless ``record`` is False)."""
    def apply(d: Path) -> None:
        w = d / ckpt.MODEL_FILE
        w.write_bytes(change(w.read_bytes()))
        if record:
            record_weights(d)
    return apply


def header_edit(change: Callable[[dict], None]) -> Callable[[Path], None]:
    """A mutation of the safetensors header JSON (same data bytes after it)."""
    def bytes_change(raw: bytes) -> bytes:
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        change(header)
        text = json.dumps(header).encode()
        return struct.pack("<Q", len(text)) + text + raw[8 + n:]
    return weights_bytes(bytes_change)


def tensors(change: Callable[[dict], None]) -> Callable[[Path], None]:
    """Re-save the weights with a changed state dict (a real safetensors file of other tensors)."""
    def apply(d: Path) -> None:
        from safetensors.torch import load_file

        state = load_file(str(d / ckpt.MODEL_FILE))
        change(state)
        save_file(state, str(d / ckpt.MODEL_FILE))
        record_weights(d)
    return apply


def with_header_length(n: int) -> Callable[[bytes], bytes]:
    return lambda raw: struct.pack("<Q", n) + raw[8:]


def symlink_outside(name: str) -> Callable[[Path], None]:
    """Replace ``name`` by a symlink to a copy of it outside the model directory."""
    def apply(d: Path) -> None:
        outside = d.parent / f"outside-{name}"
        shutil.copyfile(d / name, outside)
        (d / name).unlink()
        (d / name).symlink_to(outside)
    return apply


def symlink_inside(name: str) -> Callable[[Path], None]:
    """Replace ``name`` by a symlink to a renamed copy of it in the same directory."""
    def apply(d: Path) -> None:
        os.replace(d / name, d / f"real-{name}")
        (d / name).symlink_to(f"real-{name}")
    return apply


def expects(**change: object) -> dict:
    """An ``expects_input`` that fits the tiny network (8 x 8 scan of 16 px patterns), changed by ``change``."""
    return {"energy_kv": 200.0, "semiangle_mrad": 20.0, "sampling_A": 0.1, "scan_shape": [8, 8], "pattern_px": 16,
            "target_px": 16, "cell_lateral_A": 12.0, "band_limit": 0.6, **change}


def first_key(d: dict) -> str:
    return next(k for k in d if k != "__metadata__")


def _set(path: str, value: object) -> Callable[[dict], None]:
    """Set the dotted ``path`` of a card to ``value``."""
    def change(card: dict) -> None:
        *parents, last = path.split(".")
        node = card
        for p in parents:
            node = node[p]
        node[last] = value
    return change


def _drop(key: str) -> Callable[[dict], None]:
    return lambda card: card.pop(key)


HUGE = {"in_channels": 1 << 20, "init_channels": 1 << 16, "growth_rate": 1 << 16, "kernel_size": 31,
        "layers_per_block": [1024] * 5}

#: (id, mutation of the model dir, a piece of the one line)
MODEL_CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("card-not-json", raw_card(b"{not json"), "is not valid JSON"),
    ("card-empty", raw_card(b""), "is not valid JSON"),
    ("card-a-list", raw_card(b"[1, 2]"), "holds a JSON list, not an object"),
    ("card-a-string", raw_card(b'"card"'), "holds a JSON str"),
    ("card-not-utf8", raw_card(b'{"format": "\xff\xfe"}'), "is not UTF-8"),
    ("card-huge", raw_card(b" " * (MAX_CARD_BYTES + 1) + b"{}"), "more than the"),
    ("card-deeply-nested", raw_card(b"[" * 200_000 + b"]" * 200_000), "nests deeper"),
    ("card-nan", lambda d: (d / CARD_FILE).write_text((d / CARD_FILE).read_text().replace(
        '"cbed_std": 0.2', '"cbed_std": NaN')), "NaN is not a number"),
    ("card-missing-architecture", edit(_drop("architecture")), "missing field architecture"),
    ("card-missing-targets", edit(_drop("targets")), "missing field targets"),
    ("card-missing-normalizer", edit(_drop("normalizer")), "missing field normalizer"),
    ("card-missing-files", edit(_drop("files")), "missing field files"),
    ("card-unknown-field", edit(_set("evil", 1)), "unknown field evil"),
    ("card-architecture-unknown-field", edit(_set("architecture.depth", 3)), "unknown field architecture.depth"),
    ("card-architecture-not-object", edit(_set("architecture", [1, 2])), "architecture"),
    ("card-growth-a-string", edit(_set("architecture.growth_rate", "8")), "architecture.growth_rate"),
    ("card-skip-an-int", edit(_set("architecture.skip", 1)), "architecture.skip"),
    ("card-levels-negative", edit(_set("architecture.levels", -1)), "architecture.levels"),
    ("card-in-channels-zero", edit(_set("architecture.in_channels", 0)), "architecture.in_channels"),
    ("card-blocks-wrong-length", edit(_set("architecture.layers_per_block", [1, 2])), "layers_per_block"),
    ("card-even-kernel", edit(_set("architecture.kernel_size", 4)), "must be odd"),
    ("card-72-terabytes", edit(lambda c: c["architecture"].update(HUGE)), "parameters"),
    ("card-targets-unknown", edit(_set("targets", ["phase"])), "targets.0"),
    ("card-targets-empty", edit(_set("targets", [])), "targets"),
    ("card-targets-vs-channels", edit(_set("targets", ["potential", "density"])), "out_channels"),
    ("card-normalizer-zero-std", edit(_set("normalizer.cbed_std", 0)), "normalizer.cbed_std"),
    ("card-normalizer-transform", edit(_set("normalizer.transform", "exp")), "normalizer.transform"),
    ("card-normalizer-no-target", edit(_set("normalizer.targets", {})), "no statistics for potential"),
    ("card-files-traversal", edit(lambda c: c["files"].update({"../x.safetensors": c["files"][ckpt.MODEL_FILE]})),
     "files"),
    ("card-files-bytes-a-string", edit(lambda c: c["files"].update({ckpt.MODEL_FILE: {"bytes": "many", "xxh3_128": "0" * 32}})),
     "bytes"),
    ("card-format-version-2", edit(_set("format_version", 2)), "format_version"),
    ("card-expects-zero-scan", edit(_set("expects_input", {
        "energy_kv": 200.0, "semiangle_mrad": 20.0, "sampling_A": 0.1, "scan_shape": [0, 0], "pattern_px": 32,
        "target_px": 32, "cell_lateral_A": 12.0, "band_limit": 0.6})), "expects_input.scan_shape"),
    ("card-scan-layout-no-bins", edit(lambda c: c["architecture"].update(input_layout="scan", pattern_bins=0,
                                                                         scan_shape=[8, 8])), "pattern_bins"),
    ("card-metrics-csv-not-text", edit(_set("metrics_csv", 42)), "metrics_csv"),
    ("weights-truncated", weights_bytes(lambda b: b[: len(b) // 2], record=False), "is missing or not the"),
    ("weights-truncated-recorded", weights_bytes(lambda b: b[: len(b) // 2]), "truncated"),
    ("weights-empty", weights_bytes(lambda b: b""), "too short for a safetensors header"),
    ("weights-header-length-lies", weights_bytes(lambda b: struct.pack("<Q", len(b) - 7) + b[8:]), "the header lies"),
    ("weights-header-length-huge", weights_bytes(with_header_length(1 << 60)), "above the 16 MiB this reader accepts"),
    ("weights-header-above-cap",
     weights_bytes(lambda b: struct.pack("<Q", 17 << 20) + b"{" + b" " * (17 << 20) + b[8:]),
     "header is 17.0 MiB, above the 16 MiB this reader accepts"),
    ("weights-nan", tensors(lambda s: s["head.weight"].fill_(float("nan"))), "non-finite values (NaN or inf)"),
    ("weights-inf", tensors(lambda s: s["stem.weight"].view(-1)[:1].fill_(float("inf"))), "the file is damaged"),
    ("weights-header-length-short", weights_bytes(with_header_length(5)), "header"),
    ("weights-header-not-json", weights_bytes(lambda b: b[:8] + b"#" * (len(b) - 8)), "not valid JSON"),
    ("weights-header-a-list", weights_bytes(lambda b: struct.pack("<Q", 2) + b"[]"), "not an object"),
    ("weights-missing-tensor", tensors(lambda s: s.pop("head.weight")), "lacks tensor 'head.weight'"),
    ("weights-extra-tensor", tensors(lambda s: s.update(evil=torch.zeros(3))), "holds tensor 'evil'"),
    ("weights-wrong-shape", tensors(lambda s: s.update({"head.weight": torch.zeros(2, 3, 1, 1)})),
     "tensor 'head.weight' has shape"),
    ("weights-wrong-dtype", tensors(lambda s: s.update({"head.weight": s["head.weight"].half()})),
     "tensor 'head.weight' is 'F16'"),
    ("weights-overlapping-offsets", header_edit(lambda h: h[first_key(h)].update(data_offsets=[0, 0])), "spans"),
    ("weights-offsets-outside", header_edit(lambda h: h[first_key(h)].update(data_offsets=[1 << 40, 1 << 41])),
     "outside"),
    ("weights-entry-malformed", header_edit(lambda h: h.update({first_key(h): 7})), "is malformed"),
    ("weights-a-pickle", weights_bytes(lambda b: b"\x80\x04" + b"x" * 64), "pickled payload"),
    ("weights-flipped-byte", weights_bytes(lambda b: b[:-1] + bytes([b[-1] ^ 1]), record=False), "digest"),
    ("weights-symlink-outside", symlink_outside(ckpt.MODEL_FILE), "is a symbolic link"),
    ("card-symlink-outside", symlink_outside(CARD_FILE), "is a symbolic link"),
    ("weights-symlink-inside", symlink_inside(ckpt.MODEL_FILE), "is a symbolic link"),
    ("card-symlink-inside", symlink_inside(CARD_FILE), "is a symbolic link"),
    ("weights-a-fifo", lambda d: ((d / ckpt.MODEL_FILE).unlink(), os.mkfifo(d / ckpt.MODEL_FILE)), "not a regular"),
    ("card-normalizer-nan-via-overflow", lambda d: (d / CARD_FILE).write_text((d / CARD_FILE).read_text().replace(
        '"cbed_mean": 0.1', '"cbed_mean": 1e999')), "normalizer.cbed_mean"),
    ("card-normalizer-absurd-target-std", edit(_set("normalizer.targets.potential", [1.0, 1e30])),
     "targets.potential std is 1e+30, outside what a training set gives"),
    ("card-normalizer-negative-target-std", edit(_set("normalizer.targets.potential", [1.0, -2.0])),
     "targets.potential std is -2.0"),
    ("card-normalizer-tiny-cbed-std", edit(_set("normalizer.cbed_std", 1e-30)), "cbed_std is 1e-30"),
    ("card-normalizer-absurd-scale", edit(_set("normalizer.intensity_scale", 1e300)), "intensity_scale is 1e+300"),
    ("card-expects-vs-in-channels", edit(_set("expects_input", expects(scan_shape=[4, 4]))),
     "expects_input (scan_shape [4, 4], pattern_px 16, target_px 16) does not fit its architecture: the data has "
     "16 patterns per sample but the model expects in_channels=64"),
    ("card-expects-vs-target-px", edit(_set("expects_input", expects(target_px=32))),
     "targets are 32 px and patterns 16 px; the card contradicts itself"),
]


def hostile_copy(base_run: Path, tmp_path: Path, mutate: Callable[[Path], None]) -> Path:
    run = tmp_path / "run"
    shutil.copytree(base_run, run, symlinks=True)
    mutate(run / "model")
    return run / "model"


def assert_one_line_refusal(call: Callable[[], object], says: str) -> None:
    with pytest.raises(UserError) as info:
        call()
    text = str(info.value)
    assert "\n" not in text and says in text, text


def test_the_base_directory_loads(base_run):
    rec = models.load_reconstructor(base_run / "model", device="cpu")
    assert rec.targets == ["potential"]
    assert models.load_reconstructor(base_run, device="cpu").targets == ["potential"]


@pytest.mark.parametrize("case", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_hostile_model_dir_is_one_line(case, base_run, data_dir, tmp_path, capsys):
    _, mutate, says = case
    model_dir = hostile_copy(base_run, tmp_path, mutate)
    assert_one_line_refusal(lambda: models.load_reconstructor(model_dir, device="cpu"), says)
    rc = main(["evaluate", MICRO, "--data", str(data_dir), "--model", str(model_dir), "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("namsa: error: ") and says in err[0], err


def test_at_least_32_cases():
    assert len(MODEL_CASES) >= 32


def test_a_72_terabyte_card_is_refused_in_milliseconds(base_run, tmp_path):
    model_dir = hostile_copy(base_run, tmp_path, edit(lambda c: c["architecture"].update(HUGE)))
    started = time.perf_counter()
    assert_one_line_refusal(lambda: models.load_reconstructor(model_dir, device="cpu"),
                            f"more than the {MAX_PARAMETERS:,}")
    assert time.perf_counter() - started < 0.5


def test_run_dir_whose_model_folder_leaves_it(base_run, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "model").symlink_to(base_run / "model")
    assert_one_line_refusal(lambda: models.load_reconstructor(run, device="cpu"), "leads outside")


def test_a_consistent_expects_input_loads(base_run, tmp_path):
    model_dir = hostile_copy(base_run, tmp_path, edit(_set("expects_input", expects())))
    assert models.load_reconstructor(model_dir, device="cpu").card.expects_input.target_px == 16


# ----------------------------------------------------------------------- the cards we write validate

def test_shipped_cards_validate():
    for name in models.pretrained_names():
        card = read_card_file(REPO / "models" / "pretrained" / name / CARD_FILE)
        assert card.expects_input is not None and card.held_out_evaluation is not None


def test_the_trainer_export_validates(tiny_trained_model):  # noqa: F811
    """The card `namsa train` writes (real training); `workflow.pretrained.publish`'s card is
    loaded through the same schema in tests/test_pretrained.py::test_publish_a_run_and_load_it_back."""
    card = read_card_file(Path(tiny_trained_model.model_dir) / CARD_FILE)
    assert card.metrics_csv and card.data is not None and card.data.dirs


# ----------------------------------------------------------------------- paths a card names

def test_inside_keeps_paths_in_their_directory(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "metrics.csv").write_text("step\n")
    assert inside(tmp_path / "m", "metrics.csv") == (tmp_path / "m" / "metrics.csv").resolve()
    for bad in ("../x.csv", "/etc/passwd", "a/../../x", "", "a\x00b"):
        with pytest.raises(ModelDirError):
            inside(tmp_path / "m", bad)
    (tmp_path / "m" / "link.csv").symlink_to(tmp_path / "elsewhere.csv")
    with pytest.raises(ModelDirError, match="leads outside"):
        inside(tmp_path / "m", "link.csv")
