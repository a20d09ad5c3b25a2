"""docs/experimental-data.md states the ranges `namsa reconstruct` takes from the code that enforces
them: its table for the flagship is `models.scan_fit.expectation.ranges_table` of the shipped card (the
training ranges of `models.scan_fit.trained_ranges`, which every warning reads), the scan fit refuses just
outside what the table says it uses as it is, and the page's prose and README repeat none of its ranges."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from models import flagship_name
from models.reconstructor import pretrained_card
from models.scan_fit import model_expectation, plan_fit
from models.scan_fit.expectation import ranges_table
from stage.microscope import Calibrations, ExperimentalInputError

DOC = Path(__file__).resolve().parents[1] / "docs" / "experimental-data.md"
FLAGSHIP = flagship_name()
BEGIN = f"<!-- ranges_table(pretrained:{FLAGSHIP}): generated, do not edit by hand -->\n"
END = "<!-- end of ranges_table -->"


def test_the_docs_table_is_the_one_the_code_renders():
    text = DOC.read_text()
    assert BEGIN in text and END in text, "docs/experimental-data.md lost the markers of its generated table"
    written = text.split(BEGIN, 1)[1].split(END, 1)[0]
    expected = ranges_table(pretrained_card(FLAGSHIP), f"pretrained:{FLAGSHIP}")
    assert written == expected, f"docs/experimental-data.md's table differs from the code's; paste this:\n{expected}"


def test_no_other_range_of_the_page_contradicts_the_table():
    """The prose names no scan-step or detector-pixel range of its own (the table is the one place)."""
    text = DOC.read_text()
    prose = text.split(BEGIN, 1)[0] + text.split(END, 1)[1]
    ranges = re.findall(r"\d\.\d+-\d\.\d+ (?:Å|1/Å)", prose)
    assert not ranges, ranges


@pytest.mark.parametrize("what", ["step", "dk"])
def test_the_fit_uses_what_the_table_says_and_refuses_just_beyond(what):
    expect = model_expectation(pretrained_card(FLAGSHIP))
    (_, step_hi), (_, dk_hi) = expect.step_range_A, expect.dk_range_inv_A
    sources = {k: "command line" for k in ("energy_kv", "semiangle_mrad", "dk_inv_A", "step_A")}

    def cal(step: float, dk: float) -> Calibrations:
        return Calibrations(energy_kv=200.0, semiangle_mrad=20.0, dk_inv_A=(dk, dk), step_A=(step, step),
                            sources=sources)

    shape = (64, 64, 64, 64)
    edge = cal(step_hi, 0.2) if what == "step" else cal(0.5, dk_hi)
    beyond = cal(step_hi * 1.001, 0.2) if what == "step" else cal(0.5, dk_hi * 1.001)
    assert plan_fit(shape, edge, expect).shape[0] >= 32
    with pytest.raises(ExperimentalInputError, match="cannot be refined"):
        plan_fit(shape, beyond, expect)
