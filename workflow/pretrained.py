"""Publish a trained run as a pretrained reconstructor (`namsa publish`, workflow.cli).

    namsa publish runs/study study-scan --out DIR              writes DIR/study-scan/
    namsa publish runs/study study-scan --into-package         (what `make pretrained` runs)

copies ``RUN/model/model.safetensors`` to ``<root>/<name>/`` and writes its model card
with what a user of the weights must know besides the weights: the simulation physics the model
expects its input to have (beam energy, convergence angle, sampling, scan and pattern sizes: a
scan taken under other conditions is outside what it learned), the data it was trained on, and
its held-out scores against the baselines (``RUN/eval/metrics.json``). ``models.load_reconstructor``
loads the folder; published into the package's ``models/pretrained/`` (only on request:
``--into-package``), it loads as ``"pretrained:<name>"``.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from models import checkpoint as ckpt
from models.card import CARD_FILE, validate_card
from models.card_writer import write_card
from models.reconstructor import PRETRAINED_DIR, load_reconstructor
from models.safe_files import open_regular
from namsa.errors import UserError
from namsa.sampling import sampling_fields

from .publish_inputs import HeldOutMetrics, RunConfig, read_run
from .replace_out import replaced_atomically

#: where `namsa publish --into-package` writes (the package's data folder; see pyproject's package-data)
PRETRAINED_ROOT = Path(__file__).resolve().parents[1] / "models" / PRETRAINED_DIR
#: what a published folder holds: the card is written last and marks a finished one
_PUBLISHED = (ckpt.MODEL_FILE, CARD_FILE)


def publish(run_dir: str | Path, name: str, root: str | Path) -> Path:
    """Copy the run's exported model to ``root/name`` with an extended card; returns that folder.

    The run directory is read through `workflow.publish_inputs` (no links, bounded, typed); the
    folder is built beside ``root/name`` and swapped into place whole (`workflow.replace_out`), so
    nothing already at ``root/name`` (a planted link included) is written through."""
    if not name or "/" in name or "\x00" in name or name.startswith("."):
        raise UserError(f"pretrained name {name!r} must be a plain folder name, e.g. study-scan")
    run = read_run(run_dir)
    # no links, digest and finite weights: what users will load
    card = load_reconstructor(run.model_dir, device="cpu").card.to_json()
    card.update(_provenance(run.config, run.metrics))
    card["name"] = name
    # expects_input must fit the architecture
    published = validate_card(_portable(card), f"the card published from {run.root}")
    dest = Path(os.path.abspath(Path(root) / name))
    _refuse_non_folder(dest)
    with replaced_atomically(dest, lambda entry: entry in _PUBLISHED, marker=CARD_FILE) as tmp:
        with open_regular(run.model_dir / ckpt.MODEL_FILE, "weights file") as src, \
                open(tmp / ckpt.MODEL_FILE, "xb") as dst:
            shutil.copyfileobj(src, dst)
        write_card(tmp, published)
        # the folder as users will load it: the bytes copied are the ones the card's digest names,
        # whatever changed in the run directory since it was loaded above
        load_reconstructor(tmp, device="cpu")
    return dest


def _refuse_non_folder(dest: Path) -> None:
    """A link at ``dest`` would be replaced at its target, outside --out; a file there would be replaced."""
    if dest.is_symlink():
        raise UserError(f"{dest} is a symbolic link to {os.readlink(dest)}; namsa publish writes only inside "
                        f"{dest.parent}: remove the link, or choose another NAME or --out")
    if dest.exists() and not dest.is_dir():
        raise UserError(f"{dest} is a file, not a published folder; namsa publish replaces only a folder it "
                        f"wrote: move the file away, or choose another NAME or --out")


def _provenance(config: RunConfig, metrics: HeldOutMetrics) -> dict[str, Any]:
    sim = config.simulation_json()   # the samples' physics and plan, not the machine that simulated them
    return {"expects_input": sampling_fields(config.simulation),
            # the whole simulation and data sections: what held-out samples are re-made and stored with
            "simulation_config": sim, "data_config": config.data.model_dump(mode="json"),
            "check_samples": check_samples(metrics),
            "trained_on": {"config_name": config.name, "variants": sim["variants"], "data": metrics.data,
                           **_training_distribution(config)},
            "held_out_evaluation": {"split": metrics.config.split, "headline": metrics.headline,
                                    "aggregates": metrics.aggregates,
                                    "symmetry_average": metrics.config.symmetry_average}}


#: held-out samples per element class whose figures `tests/test_pretrained_figures.py` re-makes from
#: scratch: the thinnest ones, so re-simulating them takes a minute on a CPU
CHECK_SAMPLES_PER_CLASS = 2


def check_samples(metrics: HeldOutMetrics) -> list[dict[str, Any]]:
    """The thinnest held-out samples of each element class, each with the network's per-sample relative
    L2 per target: re-simulated from its id, the shipped weights must score the same."""
    chosen: dict[str, list[dict[str, Any]]] = {}
    for s in sorted(metrics.samples, key=lambda s: s.thickness_A):
        group = chosen.setdefault(s.element_class, [])
        if len(group) < CHECK_SAMPLES_PER_CLASS:
            group.append({"sample_id": s.sample_id, "element_class": s.element_class,
                          # the network as predicted (its legacy-view entry): what re-simulating and
                          # predicting reproduces, whatever view the headline uses
                          "network_rel_l2": {t: m.network.legacy.rel_l2 for t, m in s.metrics.items()}})
    return [s for group in chosen.values() for s in group]


def _training_distribution(config: RunConfig) -> dict[str, Any]:
    """What the training data spanned besides the microscope: structure sources, thickness, tilt,
    phonons, and the dose and symmetry augmentation the loader applied."""
    sim, data = config.simulation_json(), config.data.model_dump(mode="json")
    return {"materials": sim["materials"], "generator": sim["generator"], "zone_axes": sim["zone_axes"],
            "max_zone_axes": sim["max_zone_axes"], "variations": sim["variations"],
            "split_by": data["split_by"], "dose_augmentation": data["dose_augmentation"],
            "symmetry_augmentation": data["symmetry_augmentation"]}


def _portable(card: dict[str, Any]) -> dict[str, Any]:
    """The card without this machine's paths (where the run lived means nothing to a user): the run's
    own path entries are dropped, and any other absolute path (e.g. the stores it was scored on) is
    cut to its last component (``store-000``), which still names the part of the data it was."""
    card = dict(card)
    card.pop("metrics_csv", None)
    if isinstance(card.get("data"), dict):
        card["data"] = {k: v for k, v in card["data"].items() if k not in ("dirs", "node_local_dir")}
    return _without_absolute_paths(card)


def _without_absolute_paths(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_absolute_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_absolute_paths(v) for v in value]
    if isinstance(value, str) and Path(value).is_absolute():
        return Path(value).name
    return value
