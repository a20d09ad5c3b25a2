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

from models import checkpoint as ckpt
from models.card import CARD_FILE
from models.card_provenance import CheckSample, HeldOutEvaluation, TrainedOn
from models.card_writer import published_card, write_card
from models.reconstructor import PRETRAINED_DIR, load_reconstructor
from models.safe_files import open_regular
from namsa.errors import UserError

from .publish_inputs import HeldOutMetrics, read_run
from .replace_out import replaced_atomically

#: where `namsa publish --into-package` writes (the package's data folder; see pyproject's package-data)
PRETRAINED_ROOT = Path(__file__).resolve().parents[1] / "models" / PRETRAINED_DIR
#: what a published folder holds: the card is written last and marks a finished one
_PUBLISHED = (ckpt.MODEL_FILE, CARD_FILE)


def publish(run_dir: str | Path, name: str, root: str | Path) -> Path:
    """Copy the run's exported model to ``root/name`` with an extended card; returns that folder.

    The run directory is read through `workflow.publish_inputs` (no links, bounded, typed); the card
    is built from its typed records (`models.card_writer.published_card`); the folder is built beside
    ``root/name`` and swapped into place whole (`workflow.replace_out`), so nothing already at
    ``root/name`` (a planted link included) is written through."""
    if not name or "/" in name or "\x00" in name or name.startswith("."):
        raise UserError(f"pretrained name {name!r} must be a plain folder name, e.g. study-scan")
    run = read_run(run_dir)
    # no links, digest and finite weights: what users will load
    trained = load_reconstructor(run.model_dir, device="cpu").card
    # expects_input must fit the architecture (the card's own check)
    published = published_card(trained, f"the card published from {run.root}", name=name,
                               simulation=run.config.simulation, data=run.config.data,
                               trained_on=TrainedOn.of(run.config.name, run.config.simulation, run.config.data,
                                                       run.metrics.data),
                               held_out_evaluation=held_out_evaluation(run.metrics),
                               check_samples=check_samples(run.metrics))
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


def held_out_evaluation(metrics: HeldOutMetrics) -> HeldOutEvaluation:
    """The card's ``held_out_evaluation``: the split the run's metrics.json scored, its headline and
    aggregates, and whether its maps were averaged over the 8 turns."""
    return HeldOutEvaluation(split=metrics.config.split, headline=metrics.headline, aggregates=metrics.aggregates,
                             symmetry_average=metrics.config.symmetry_average)


#: held-out samples per element class whose figures `tests/test_pretrained_figures.py` re-makes from
#: scratch: the thinnest ones, so re-simulating them takes a minute on a CPU
CHECK_SAMPLES_PER_CLASS = 2


def check_samples(metrics: HeldOutMetrics) -> list[CheckSample]:
    """The thinnest held-out samples of each element class, each with the network's per-sample relative
    L2 per target: re-simulated from its id, the shipped weights must score the same."""
    chosen: dict[str, list[CheckSample]] = {}
    for s in sorted(metrics.samples, key=lambda s: s.thickness_A):
        group = chosen.setdefault(s.element_class, [])
        if len(group) < CHECK_SAMPLES_PER_CLASS:
            group.append(CheckSample(sample_id=s.sample_id, element_class=s.element_class,
                                     # the network as predicted (its legacy-view entry): what re-simulating and
                                     # predicting reproduces, whatever view the headline uses
                                     network_rel_l2={t: m.network.legacy.rel_l2 for t, m in s.metrics.items()}))
    return [s for group in chosen.values() for s in group]
