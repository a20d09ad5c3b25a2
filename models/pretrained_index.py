"""The reconstructors shipped with namsa (``models/pretrained/<name>/``) and which one is the flagship,
read from the package's files without importing torch (the CLI's --help lists them).

The flagship is named in ``models/pretrained/FLAGSHIP`` (one line): the one model the README, the
report, the notebook's default and `--model`'s help speak of. A lent GPU's study that publishes a
better model changes that file (docs/evaluation.md, "The flagship").
"""
from __future__ import annotations

from importlib import resources

from .card import CARD_FILE

#: the package folder of the shipped reconstructors, one sub-folder each
PRETRAINED_DIR = "pretrained"
#: the file in PRETRAINED_DIR naming the flagship
FLAGSHIP_FILE = "FLAGSHIP"


def pretrained_names() -> list[str]:
    """Names of the reconstructors shipped with the package (``models/pretrained/<name>/``)."""
    root = resources.files("models") / PRETRAINED_DIR
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / CARD_FILE).is_file()) if root.is_dir() else []


def flagship_name() -> str:
    """The flagship's name (``models/pretrained/FLAGSHIP``), one of `pretrained_names`."""
    name = (resources.files("models") / PRETRAINED_DIR / FLAGSHIP_FILE).read_text().strip()
    if name not in pretrained_names():
        raise RuntimeError(f"models/pretrained/{FLAGSHIP_FILE} names {name!r}, which is not shipped "
                           f"({', '.join(pretrained_names())}): the package is damaged; reinstall namsa")
    return name
