"""The `namsa` command line's argument types and parser classes: values checked as argparse parses
them, and the house error format (one line, exit status 2) for every parser error."""
from __future__ import annotations

import argparse

from .errors import EXIT_BAD_INPUT


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def step_pair(text: str) -> tuple[float, ...]:
    """One positive number, or ``Y,X`` for different steps along the scan's rows and columns."""
    parts = text.split(",")
    if len(parts) > 2:
        raise argparse.ArgumentTypeError(f"{text!r}: give one step or Y,X")
    return tuple(positive_float(part) for part in parts)


def zone_axis(text: str) -> tuple[int, ...]:
    """``U,V,W``: comma-separated integers (that they are three, not all 0, is `KnownSpecimen.checked`'s rule)."""
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give three integers U,V,W, e.g. 0,1,1") from None


def fractions(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers, e.g. 0.25,0.5,1") from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every fraction must be in (0, 1]")
    return values


class Parser(argparse.ArgumentParser):
    """argparse with the house error format: one line on stderr, exit status 2 (no usage block)."""

    def error(self, message: str):  # type: ignore[override]
        command = self.prog.removeprefix("namsa").strip()
        self.exit(EXIT_BAD_INPUT, f"namsa: error: {command + ': ' if command else ''}{message}; "
                                  f"see {self.prog} --help\n")


class ShippedModelsHelp(argparse.HelpFormatter):
    """Fills ``{shipped}`` in a help text with the names of the reconstructors shipped with namsa and
    which is the flagship (models.pretrained_index: the package's files, no torch), only when the help
    is printed."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        if text and "{shipped}" in text:
            from models.pretrained_index import flagship_name, pretrained_names

            names = ", ".join(pretrained_names()) or "none"
            text = text.replace("{shipped}", f"{names}; the flagship, the best on held-out types: {flagship_name()}")
        return text


class NoOverrides(argparse.Action):
    """reconstruct's ``--set``: refused with the reason (it reads no config) rather than argparse's bare
    "unrecognized arguments", since the other model commands take it."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        parser.error("--set: reconstruct reads no pipeline config, so there is nothing to override; give the "
                     "calibrations with its flags (--energy-kv, --semiangle-mrad, --dk-inv-a or --dk-mrad, "
                     "--scan-step-a)")
