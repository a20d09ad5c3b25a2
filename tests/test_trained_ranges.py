"""One figure per training range, from the card (`models.scan_fit.trained_ranges`): the focus on the
specimen's middle, the thickness, the probe step and the dose that the warnings, the scan fit and the
docs' ranges table all read."""
from __future__ import annotations

import pytest

from models import flagship_name
from models.reconstructor import pretrained_card
from models.scan_fit import card_checks, model_expectation
from models.scan_fit.expectation import ranges_table
from models.scan_fit.trained_ranges import MEASURED, trained_dose_range, trained_ranges


@pytest.fixture(scope="module")
def flagship():
    return pretrained_card(flagship_name())


def test_the_flagships_ranges_are_its_training_configs_on_the_specimens_middle(flagship):
    ranges = trained_ranges(flagship)
    cfg = flagship.expects_input.simulation_config()
    (c1_low, c1_high), (t_low, t_high) = cfg.variations.defocus_range_A, cfg.variations.thickness_range_A
    # namsa sets C1 at the entrance surface; the parallax reads the focus from the specimen's middle
    assert ranges.defocus_A.span() == (c1_low + t_low / 2, c1_high + t_high / 2) == (-35.0, 115.0)
    assert ranges.thickness_A.span() == (t_low, t_high) == (10.0, 150.0)
    assert ranges.dose_e_per_A2.span() == trained_dose_range(flagship) == (100.0, 1e6)
    assert card_checks.trained_defocus_range(flagship) == (*ranges.defocus_A.span(), ranges.defocus_A.source)


def test_the_probe_steps_span_the_config_and_the_measured_training_split(flagship):
    """The flagship's training split held steps up to 0.895 A (a wide unit cell) where its config's span
    ends at 0.75: the fit uses the union, and says both."""
    step = trained_ranges(flagship).scan_step_A
    planned, measured = flagship.expects_input.sampling.step_A, flagship.training_statistics.step_A
    assert step.span() == (min(planned[0], measured[0]), max(planned[1], measured[1]))
    assert measured[1] > planned[1] and step.high == measured[1]
    assert "training config" in step.source and MEASURED.format(n=flagship.training_statistics.samples) in step.source
    assert model_expectation(flagship).step_A == step.span()


def test_without_a_training_config_the_measured_ranges_are_used(flagship):
    card = flagship.model_copy(update={"expects_input": None})
    ranges = trained_ranges(card)
    stats = flagship.training_statistics
    assert ranges.defocus_A.span() == (stats.ranges["defocus_A"].low, stats.ranges["defocus_A"].high)
    assert ranges.defocus_A.source == MEASURED.format(n=stats.ranges["defocus_A"].samples)
    assert ranges.thickness_A is None   # no composition: a thickness is never measured over the split
    assert ranges.scan_step_A.span() == tuple(stats.step_A)


def test_no_config_and_no_statistics_state_no_range(flagship):
    card = flagship.model_copy(update={"expects_input": None, "training_statistics": None, "trained_on": None})
    ranges = trained_ranges(card)
    assert (ranges.defocus_A, ranges.thickness_A, ranges.scan_step_A, ranges.dose_e_per_A2) == (None,) * 4


def test_the_docs_table_states_each_range_as_the_warnings_do(flagship):
    ranges = trained_ranges(flagship)
    table = ranges_table(flagship, "pretrained:x")
    focus = next(row for row in table.splitlines() if row.startswith("| focus"))
    thickness = next(row for row in table.splitlines() if row.startswith("| specimen thickness"))
    assert f"| {ranges.defocus_A.low:g} to {ranges.defocus_A.high:g} ({ranges.defocus_A.source}) |" in focus
    assert f"| {ranges.thickness_A.low:g} to {ranges.thickness_A.high:g} (" in thickness
