"""evaluation.methods: every registered method, switched on by its own record (`Method.quick`) and run
for real on the tiny store with the tiny trained model, makes its maps, is labelled and coloured,
reaches the report, the figures, the timings, the dose sweep and the verdict exactly as its record says;
and no module but the registry and a baseline's own keeps a table of names."""
from __future__ import annotations

import ast
import importlib
import json
import pkgutil
from html import escape as html_escape
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import is_color_like, to_rgba

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from evaluation import EvaluationConfig, evaluate
from evaluation.methods import REGISTRY, Method, baselines, names

ROOT = Path(__file__).resolve().parents[1]
#: (file, literal): string literals equal to a method's name that are not a method's name.
ALLOWED_LITERALS = {
    ("evaluation/metrics.py", "mean"): "bootstrap_ci's statistic",
    ("evaluation/aggregation.py", "mean"): "compute_seconds' statistic (metrics.json key)",
    ("evaluation/report.py", "mean"): "reads compute_seconds' statistic",
    ("evaluation/card_view.py", "network"): "a model-card row label",
}


@pytest.fixture(scope="module")
def every_method(tiny_trained_model, tiny_data_dir, tmp_path_factory):  # noqa: F811
    """One evaluation with every method switched on by its record's `Method.quick` (py4DSTEM run short),
    one dose, and the first sample's maps scored again from the baseline cache the evaluation filled."""
    import models
    import stage
    from evaluation.baselines import mean_training_targets
    from evaluation.scoring import score_all

    out = tmp_path_factory.mktemp("every_method")
    cfg = EvaluationConfig(n_bootstrap=20, n_panels=1, worst_k=0, baseline_cache=str(out / "cache"), doses=[10000.0])
    for m in REGISTRY:
        cfg = m.quick(cfg) if m.quick is not None else cfg
    result = evaluate(cfg, stage.DataConfig(), [tiny_data_dir], tiny_trained_model.model_dir, out / "eval")
    doc = json.loads(result.metrics_json.read_text())
    rec = models.load_reconstructor(tiny_trained_model.model_dir)
    with stage.open_stores([tiny_data_dir]) as stores:
        first = stores.indices("test")[:1]
        targets = list(rec.targets)
        records, kept = score_all(cfg, stores, first, rec, targets, mean_training_targets(stores, targets))
    return cfg, doc, result.report_html.read_text(), records[0], kept[first[0]]


@pytest.mark.parametrize("m", REGISTRY, ids=lambda m: m.name)
def test_every_method_makes_its_maps_and_reaches_every_output_as_its_record_says(every_method, m: Method):
    from evaluation.aggregation import subset_aggregates
    from evaluation.figures import metric_values, sample_panel_figure
    from evaluation.verdict import verdict

    cfg, doc, html, record, kept = every_method
    assert m.enabled(cfg)
    made = [t for t in doc["targets"] if t in m.targets]
    assert made, f"{m.name} makes no map of the evaluated targets {doc['targets']}"
    for t in made:
        produced, truth = kept["maps"][t][m.name], kept["maps"][t]["truth"]
        assert produced.shape == truth.shape and np.all(np.isfinite(produced))
        assert m.name in doc["methods"][t] and m.name in record["metrics"][t]
    # labelled and coloured
    assert m.label and m.short_label and m.verdict_label and is_color_like(m.colour)
    # the report: its headline column and, for a baseline, its per-sample column
    assert html_escape(m.label) in html
    assert f"{html_escape(m.short_label)} rel L2" in html
    # the figures: the histograms' series and a panel of the first sample titled with its label
    assert m.name in metric_values(doc["samples"], "potential", "rel_l2")
    figure = sample_panel_figure(kept, "potential", record)
    titles = [ax.get_title() for sub in figure.subfigs for ax in sub.axes]
    assert any(title.startswith(m.figure_label) for title in titles), titles
    # the record's flags decide the timings, the fits, the dose sweep and the verdict
    assert (m.name in doc["compute_seconds"]) == m.timed
    assert (record.get(f"{m.name}_fit") is not None) == m.legacy_fitted
    if m.runner is not None and not m.legacy_fitted:  # its facts, e.g. network+ptycho's data errors
        assert record[f"{m.name}_facts"]["seconds"] >= 0
    assert (m.name in doc["dose_sweep"][0]["aggregates"]["potential"]) == m.dose_sweep
    assert (m.name in doc["verdicts"]["potential"]) == m.judged
    ran = [r for r in doc["samples"] if m.name in r["metrics"]["potential"]]
    assert len(ran) == (len(doc["samples"]) if m.subset is None else 1)
    if m.judged and m.subset is not None:
        # judged against the network on the same samples, not the network's mean over all of them
        paired, _ = subset_aggregates(doc["samples"], "potential", cfg)[m.name]
        assert paired["network"]["field"]["rel_l2"]["n"] == 1
        assert doc["verdicts"]["potential"][m.name]["overall_sentence"] == verdict(paired, m.name).sentence


def test_names_labels_and_colours_are_distinct():
    for field in ("name", "label", "short_label", "verdict_label", "colour"):
        values = [getattr(m, field) for m in REGISTRY]
        assert len(set(values)) == len(values), field
    assert len({to_rgba(m.colour) for m in REGISTRY}) == len(REGISTRY)
    assert sorted(m.panel_order for m in REGISTRY) == list(range(len(REGISTRY)))


def _name_literals(path: Path) -> list[tuple[int, str]]:
    """(line, literal) of every string constant in ``path`` equal to a registered method's name."""
    known = set(names())
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known]


def _homes() -> dict[str, str]:
    """{file: the name of the method it declares}: each baseline module of ``evaluation/baselines/``
    with a ``METHOD`` (its record, beside its runner)."""
    import evaluation.baselines as package

    homes = {}
    for info in pkgutil.iter_modules(package.__path__):
        record = getattr(importlib.import_module(f"{package.__name__}.{info.name}"), "METHOD", None)
        if record is not None:
            homes[f"evaluation/baselines/{info.name}.py"] = record.name
    return homes


def test_every_baseline_record_sits_in_its_own_module_beside_its_runner():
    homes = _homes()
    assert sorted(homes.values()) == sorted(m.name for m in baselines()), homes
    for m in (m for m in REGISTRY if m.runner is not None):
        assert homes.get(m.runner.__module__.replace(".", "/") + ".py") == m.name, m.name


def test_no_module_but_the_registry_names_a_method():
    """A method name written out elsewhere in evaluation/ or workflow/ is a table of methods the
    registry does not own (it would filter or mislabel a new method): refer to the record instead.
    A baseline's module names its own method once, in its record."""
    found, used, homes = [], set(), _homes()
    for folder in ("evaluation", "workflow"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "evaluation/methods.py":
                continue
            for line, literal in _name_literals(path):
                if literal == homes.get(rel):
                    continue
                if (rel, literal) in ALLOWED_LITERALS:
                    used.add((rel, literal))
                else:
                    found.append(f"{rel}:{line}: {literal!r}")
    assert not found, "method names outside evaluation/methods.py:\n" + "\n".join(found)
    assert used == set(ALLOWED_LITERALS), f"allow-list entries no longer needed: {set(ALLOWED_LITERALS) - used}"


def test_the_literal_scan_finds_a_planted_table(tmp_path):
    """The scan above can fail: a module with a tuple of method names is caught."""
    planted = tmp_path / "planted.py"
    planted.write_text(f"METHODS = {tuple(names())!r}\nLABEL = 'network output'\n")
    assert [literal for _, literal in _name_literals(planted)] == list(names())
