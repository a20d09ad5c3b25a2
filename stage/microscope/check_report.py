"""The report every check of a scan writes: {"warnings": [{"code", "message"}], "measured": {name:
{"value", "unit", ...}}}, the checks before inference (stage.microscope.checks, counts_restore) and
those against a model's card (models.scan_fit.card_checks) alike; reconstruction.json holds them."""
from __future__ import annotations

from typing import Any


def new_report() -> dict[str, Any]:
    """An empty check report: {"warnings": [], "measured": {}}."""
    return {"warnings": [], "measured": {}}


def add_warning(report: dict[str, Any], code: str, message: str) -> None:
    """A finding of ``report``: a short ``code`` and a one-line ``message``."""
    report["warnings"].append({"code": code, "message": message})


def add_measurement(report: dict[str, Any], name: str, value: Any, unit: str, **extra: Any) -> None:
    """A measured ``value`` (in ``unit``) of ``report``, with whatever else describes it."""
    report["measured"][name] = {"value": value, "unit": unit, **extra}
