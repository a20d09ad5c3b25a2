"""The findings of a reconstruction: every check's warnings (the file before inference, each block's
input to the model, the maps after), gathered once, so the terminal, reconstruction.json, the figure
and a notebook show the same set.

A check report is stage.microscope.checks' {"warnings": [{"code", "message"}], "measured": {...}}.
`Reconstructor.predict` checks the first stack of every call (models.scan_fit.card_checks.input_report);
`namsa reconstruct` calls it once per block of tiles, so its reports are merged here: a finding kind
(its code) is kept once, with the first block's message, and the number of blocks that raised it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

#: where in the reconstruction a finding was made (reconstruction.json's ``checks`` sections)
STAGES = ("before", "predict", "after")


@dataclass
class PredictReports:
    """The input reports of every `Reconstructor.predict` call of a reconstruction (one per block)."""

    reports: list[Mapping[str, Any]] = field(default_factory=list)

    def add(self, report: Mapping[str, Any] | None) -> None:
        if report is not None:
            self.reports.append(report)

    def merged(self) -> dict[str, Any]:
        """One report: each finding code once (the first block's message, ``blocks``: how many raised
        it), and the first block's measurements (a scan's blocks share their physics)."""
        warnings: dict[str, dict[str, Any]] = {}
        for report in self.reports:
            for w in report.get("warnings", []):
                kept = warnings.setdefault(w["code"], {**w, "blocks": 0})
                kept["blocks"] += 1
        measured = dict(self.reports[0].get("measured", {})) if self.reports else {}
        return {"warnings": list(warnings.values()), "measured": measured, "blocks": len(self.reports)}


def findings(checks: Mapping[str, Mapping[str, Any]]) -> list[dict[str, str]]:
    """Every warning of ``checks`` ({stage: report}, stages in `STAGES` order) once per code, each
    {"code", "message", "stage"}: the one list every output of a reconstruction shows."""
    seen: dict[str, dict[str, str]] = {}
    for stage in STAGES:
        for w in (checks.get(stage) or {}).get("warnings", []):
            seen.setdefault(w["code"], {"code": w["code"], "message": w["message"], "stage": stage})
    return list(seen.values())

