"""What is derived from the method registry (`evaluation.methods.REGISTRY`) and the metric registry
(`evaluation.metric_registry.METRICS`) follows them: docs/evaluation.md's two tables, metrics.json's
conventions, the pre-check of what a method requires, the reference the network is compared with, and
the verdict's and the aggregation's metrics."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

import stage
from evaluation import EvaluationConfig, evaluate
from evaluation import metrics as M
from evaluation.aggregation import AGGREGATED_VIEWS, VERSUS, aggregate
from evaluation.conventions import CONVENTIONS
from evaluation.doc_tables import BEGIN, END, method_table, metric_table
from evaluation.methods import NETWORK, REGISTRY, Method, Requirement, RequirementError, check_requirements, reference
from evaluation.metric_registry import METRICS, Metric, in_view, judged, whole_map
from evaluation.verdict import verdict
from evaluation.views import HEADLINE, LEVEL

DOC = Path(__file__).resolve().parents[1] / "docs" / "evaluation.md"
#: a module no environment has: a requirement that is missing for real.
ABSENT = Requirement(module="namsa_test_no_such_module", package="NoSuchPackage", install="pip install nothing")
REQUIRING = [m for m in REGISTRY if m.requires is not None]


@pytest.mark.parametrize("name, render", [("method_table", method_table), ("metric_table", metric_table)])
def test_the_docs_tables_are_the_ones_the_registries_render(name, render):
    text = DOC.read_text()
    begin, end = BEGIN.format(name=name), END.format(name=name)
    assert begin in text and end in text, f"docs/evaluation.md lost the markers of its generated {name}"
    written = text.split(begin, 1)[1].split(end, 1)[0]
    assert written == render(), f"docs/evaluation.md's {name} differs from the registry's; paste this:\n{render()}"


def test_the_method_table_lists_every_method_and_the_metric_table_every_metric():
    assert [line.split("`")[1] for line in method_table().splitlines()[2:]] == [m.name for m in REGISTRY]
    assert sorted(line.split("`")[1] for line in metric_table().splitlines()[2:]) == sorted(m.name for m in METRICS)


def test_every_timed_method_is_in_the_compute_seconds_convention():
    said = CONVENTIONS["compute_seconds"]
    for m in REGISTRY:
        assert (f"{m.name} = {m.timing}" in said) == m.timed, m.name


def test_conventions_define_every_metric_and_every_legacy_fit():
    for m in METRICS:
        assert CONVENTIONS[m.name] == m.definition
    for m in REGISTRY:
        assert (f"{m.name}_fit" in CONVENTIONS) == m.legacy_fitted
    assert all(m.name in CONVENTIONS["verdict"] for m in judged())


def _asking_for(m: Method) -> EvaluationConfig:
    """A configuration that asks for ``m``."""
    return m.quick(EvaluationConfig()) if m.quick is not None else EvaluationConfig()


def test_network_ptycho_is_among_the_methods_that_require_a_package():
    assert {"ptycho", "multislice_ptycho", "network+ptycho"} <= {m.name for m in REQUIRING}


@pytest.mark.parametrize("m", REQUIRING, ids=lambda m: m.name)
def test_the_pre_check_names_a_missing_requirement_and_how_to_turn_the_method_off(m: Method):
    assert m.switch is not None, f"{m.name} requires a package but no switch turns it off"
    missing = dataclasses.replace(m, requires=ABSENT)
    with pytest.raises(RequirementError) as info:
        check_requirements(_asking_for(m), (missing,))
    message = str(info.value)
    assert "\n" not in message and "NoSuchPackage" in message and ABSENT.install in message
    assert f"evaluation.{m.switch}" in message and m.off() in message
    check_requirements(EvaluationConfig(**_switched_off(m)), (missing,))   # not asked for: nothing to check


def _switched_off(m: Method) -> dict[str, Any]:
    """The config section that turns ``m`` off (its switch False or None)."""
    return {m.switch: False if isinstance(getattr(EvaluationConfig(), m.switch), bool) else None}


@pytest.mark.parametrize("m", REQUIRING, ids=lambda m: m.name)
def test_evaluate_stops_on_a_missing_package_before_it_loads_the_model(m: Method, tmp_path, monkeypatch):
    """py4DSTEM made unimportable: the pre-check fails before the model (here: no model at all) is read."""
    for name in [k for k in sys.modules if k == "py4DSTEM" or k.startswith("py4DSTEM.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "py4DSTEM", None)   # import py4DSTEM now raises ImportError
    with pytest.raises(RequirementError, match=f"evaluation.{m.switch} .*namsa\\[baselines\\]"):
        evaluate(_asking_for(m), stage.DataConfig(), [tmp_path / "data"], tmp_path / "no-model", tmp_path / "eval")
    assert not (tmp_path / "eval" / "metrics.json").exists()


def test_the_one_reference_is_judged_swept_and_keys_the_comparison():
    assert [m.name for m in REGISTRY if m.is_reference] == [reference().name]
    ref = reference()
    assert ref.judged and ref.dose_sweep and ref.runner is not None and ref.switch is not None
    assert VERSUS == f"network_vs_{ref.name}"


def test_every_switch_is_a_field_of_the_evaluation_config():
    for m in REGISTRY:
        assert m.switch is None or m.switch in EvaluationConfig.model_fields, m.name
        assert m.enabled(_asking_for(m)), m.name


# --------------------------------------------------------------------------- metrics

def test_the_whole_map_records_are_the_metrics_image_metrics_computes():
    import numpy as np

    truth = np.arange(64.0).reshape(8, 8)
    assert list(M.image_metrics(truth[::-1], truth)) == [m.name for m in whole_map()]


def _records(network_better: dict[str, bool]) -> list[dict]:
    """Two materials of three samples; every metric of every view, the network better or worse on each
    metric as asked (a step of 0.3 with a spread of 0.01: intervals apart)."""
    rows = []
    for k in range(6):
        spread = 0.01 * (k % 3)
        scores = {}
        for method in (NETWORK, reference().name):
            scores[method] = {}
            for view in AGGREGATED_VIEWS:
                if view == LEVEL and method != NETWORK:
                    continue
                scores[method][view] = {m.name: _value(m, (method == NETWORK) == network_better.get(m.name, True),
                                                       spread) for m in in_view(view)}
        rows.append({"metrics": {"potential": scores}, "material_id": f"m{k % 2}"})
    return rows


def _value(m: Metric, good: bool, spread: float) -> float:
    """0.5 -+ 0.3 in the metric's better direction."""
    step = 0.3 if good == (m.better == "higher") else -0.3
    return 0.5 + step + spread


def test_the_aggregates_hold_each_views_metrics_as_their_records_say():
    agg = aggregate(_records({}), "potential", EvaluationConfig(n_bootstrap=200))
    for view in AGGREGATED_VIEWS:
        assert list(agg[NETWORK][view]) == [m.name for m in in_view(view)]
    assert LEVEL not in agg[reference().name]


def test_the_verdict_decides_on_the_judged_records_in_their_directions():
    cfg = EvaluationConfig(n_bootstrap=200)
    ref = reference().name
    assert verdict(aggregate(_records({}), "potential", cfg), ref).beats
    for m in judged():
        v = verdict(aggregate(_records({m.name: False}), "potential", cfg), ref)
        assert not v.beats and v.worse_apart == [m.name], m.name
        assert f"worse on {m.short_name}" in v.sentence
    # a metric that is not judged decides nothing
    loser = next(m for m in in_view(HEADLINE) if not m.judged)
    assert verdict(aggregate(_records({loser.name: False}), "potential", cfg), ref).beats


def test_each_metric_row_says_its_direction():
    for m in METRICS:
        arrows = [a for a in "↑↓" if a in m.row_label]
        assert arrows == ({"higher": ["↑"], "lower": ["↓"]}.get(m.better or "", [])), m.name
        assert m.part_of is None or m.part_of in {x.name for x in METRICS}
