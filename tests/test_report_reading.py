"""The evaluation's report and figures as a scientist reads them: legible panels with units, no raw
JSON, every material and figure explained, one best method marked, one-value panels in words (the tiny
really-trained reconstructor on the tiny real data set, evaluated once: tests/_evaluated_fixture.py)."""
from __future__ import annotations

from html import escape as html_escape

import pytest

from _evaluated_fixture import evaluated  # noqa: F401  (session fixture)
from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from evaluation import EvaluationConfig
from evaluation.views import FIELD, LEGACY, STRUCTURE




def _drawn_texts(fig) -> list:
    """Every visible, non-empty text of ``fig`` after a draw (tick labels are made at draw time)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    FigureCanvasAgg(fig).draw()
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


@pytest.fixture(scope="module")
def panel(evaluated, tiny_trained_model, tiny_data_dir):  # noqa: F811
    """The per-sample panel figure of the first evaluated sample, from the real sample and the
    real predictions (`scoring.recompute`, as `evaluate` draws its worst cases)."""
    import models
    import stage
    from evaluation.baselines import mean_training_targets
    from evaluation.map_figures import sample_panel_figure
    from evaluation.scoring import recompute

    _, doc = evaluated
    cfg = EvaluationConfig.model_validate(doc["config"])
    record = doc["samples"][0]
    with stage.open_stores([tiny_data_dir]) as stores:
        kept = recompute(cfg, stores, [record["index"]], models.load_reconstructor(tiny_trained_model.model_dir),
                         ["potential"], mean_training_targets(stores, ["potential"]))
    return sample_panel_figure(kept[record["index"]], "potential", record), kept[record["index"]]


def test_sample_panel_is_legible_at_its_shown_size(panel):
    """Fonts >= 9 pt and no wider than the report's column, so the browser never scales it down."""
    from evaluation.map_figures import MAX_WIDTH_IN, MIN_FONT_PT

    fig, _ = panel
    assert fig.get_figwidth() <= MAX_WIDTH_IN + 1e-9
    small = [(t.get_text(), t.get_fontsize()) for t in _drawn_texts(fig) if t.get_fontsize() < MIN_FONT_PT]
    assert not small, small


def test_sample_panel_has_units_on_colour_bars_and_scale_bars(panel):
    from mpl_toolkits.axes_grid1.anchored_artists import AnchoredSizeBar

    fig, kept = panel
    labels = [ax.get_ylabel() for ax in fig.findobj(lambda a: hasattr(a, "_colorbar"))]
    assert "projected potential (V·Å)" in labels and "error (V·Å)" in labels, labels
    assert any("incident probe = 1" in label for label in labels), labels
    bars = [a for a in fig.findobj(AnchoredSizeBar)]
    texts = {t.get_text() for bar in bars for t in bar.findobj(lambda o: hasattr(o, "get_text"))}
    assert any(t.endswith(" Å") for t in texts) and any(t.endswith(" mrad") for t in texts), texts
    # the maps' extent is the scanned field of view in Angstrom
    y0, x0, h, w = kept["meta"].fov_A
    extents = [im.get_extent() for im in fig.findobj(lambda o: hasattr(o, "get_extent") and hasattr(o, "get_array"))]
    assert pytest.approx([x0, x0 + w, y0 + h, y0]) in [list(e) for e in extents]


def test_every_evaluation_figure_is_legible(evaluated, tiny_trained_model):
    """The other figures: fonts >= 9 pt, width inside the column."""
    from evaluation import figures as F
    from evaluation.map_figures import MAX_WIDTH_IN, MIN_FONT_PT, bar_length

    _, doc = evaluated
    fig = F.learning_curves_figure(tiny_trained_model.metrics_csv)
    assert fig.get_figwidth() <= MAX_WIDTH_IN
    assert min(t.get_fontsize() for t in _drawn_texts(fig)) >= MIN_FONT_PT
    assert bar_length(16.0) == 5 and bar_length(30.0) == 10 and bar_length(0.0) == 0
    for fig in (F.error_histograms_figure(doc["samples"], "potential"),
                F.class_chart_figure(F.class_intervals(doc["samples"], "potential",
                                                       EvaluationConfig.model_validate(doc["config"])), "potential")):
        assert fig.get_figwidth() <= MAX_WIDTH_IN
        assert min(t.get_fontsize() for t in _drawn_texts(fig)) >= MIN_FONT_PT


def test_constant_learning_rate_gets_words_not_a_panel(tiny_trained_model, tmp_path):
    import csv

    from evaluation.figures import constant_learning_rate, learning_curves_figure, read_metrics_csv

    x_name, cols = read_metrics_csv(tiny_trained_model.metrics_csv)
    lr = next(c for c in cols if c.lower() in ("lr", "learning_rate") or c.lower().startswith("lr"))
    rows = list(csv.DictReader(open(tiny_trained_model.metrics_csv, newline="")))
    for flat, values in ((True, ["0.002"] * len(rows)), (False, [str(0.001 * (i + 1)) for i in range(len(rows))])):
        path = tmp_path / f"metrics-{flat}.csv"
        with open(path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows([{**r, lr: v} for r, v in zip(rows, values)])
        fig = learning_curves_figure(path)
        assert len(fig.axes) == (1 if flat else 2)
        assert ("constant learning rate 0.002" in fig.axes[0].get_title()) == flat
        assert constant_learning_rate(path) == (0.002 if flat else None)


def test_report_has_no_raw_json_and_a_readable_model_card(evaluated):
    import re

    from evaluation.card_view import card_rows

    result, doc = evaluated
    html = result.report_html.read_text()
    assert not re.search(r"\{\s*(&quot;|\"|')", html), "a JSON object is dumped into the report"
    assert not re.search(r"\[\s*(&quot;|\"|')", html), "a JSON list is dumped into the report"
    assert not re.search(r"&lt;[fiu]\d\b", html), "a numpy dtype code (<f4) where its name (float32) belongs"
    sections = {section for section, _, _ in card_rows(doc["model_card"])}
    assert {"architecture", "training data", "optimiser", "training result"} <= sections
    for _, label, value in card_rows(doc["model_card"]):
        assert not value.startswith(("{", "[")), (label, value)
        assert f"<td class='l'>{html_escape(label)}</td>" in html
    assert f"{doc['model_card']['parameters']:,}" in html


def test_report_explains_every_material_and_sample_id(evaluated):
    from evaluation.material_ids import ID_FORMS, describe_material

    result, doc = evaluated
    html = result.report_html.read_text()
    for _, form, _ in ID_FORMS:
        assert html_escape(form) in html
    for r in doc["samples"]:
        d = describe_material(r["material_id"], r["formula"])
        assert d["prototype"] != "–", r["material_id"]
        row = (f"<td class='l'><code>{html_escape(r['sample_id'])}</code></td><td class='l'>{html_escape(d['formula'])}"
               f"</td><td class='l'>{html_escape(d['prototype'])}</td>")
        assert row in html, row


def test_generated_material_ids_are_explained_from_their_recipe():
    from namsa import library
    from namsa.generator import GeneratorConfig, build, generated_ids

    from evaluation.material_ids import describe_material, describe_sample

    for material in generated_ids(GeneratorConfig(count=4, seed=3)):
        template, new, scale = material.split(":")
        structure = build(material)
        d = describe_material(material, structure.composition.reduced_formula)
        assert d["prototype"] == library.info(template)["prototype"]
        assert d["made"].startswith(f"library {template} with ") and d["made"].endswith(f"lattice × {scale}")
        assert [swap.split("→")[1] for swap in d["made"].split(" with ")[1].split(", lattice")[0].split(", ")] \
            == new.split(",")
        assert set(new.split(",")) == {e.symbol for e in structure.composition.elements}
    assert describe_sample("NaCl-rocksalt:K,Br:1.0731__1_-1_0__v2__0123456789ab") == {
        "material": "NaCl-rocksalt:K,Br:1.0731", "zone_axis": "[1 -1 0]", "variant": "2", "hash": "0123456789ab"}


def test_every_figure_the_report_shows_exists(evaluated):
    import re

    result, doc = evaluated
    html = result.report_html.read_text()
    shown = re.findall(r"<img srcset='([^' ]+) 2x'", html)
    assert shown and " src=" not in html   # a src beside srcset would be shown at twice the size
    for rel in shown:
        assert (result.out_dir / rel).is_file(), rel


def test_only_the_headline_table_marks_a_best_method(evaluated):
    """The verdict is decided on the field's rule; the structure and legacy tables take numbers from the
    truth, so no method is bold there, even where its mean is the best of its row."""
    import copy

    from evaluation.report import render

    _, doc = evaluated
    doc = copy.deepcopy(doc)
    agg = doc["aggregates"]["potential"]
    for view in (STRUCTURE, LEGACY):   # iCoM far ahead in the views that fit it to the truth
        agg["icom"][view]["ssim"].update(value=2.0, low=2.0, high=2.0)
    html = render(doc)
    headline = html.split("Headline: potential")[1].split("<h3>")[0]
    best = max(agg, key=lambda m: agg[m][FIELD]["ssim"]["value"])
    assert f"<b>{agg[best][FIELD]['ssim']['value']:.4g}" in headline
    assert "The verdicts at the top of the page are decided on this table" in headline
    for title in ("potential: structure only", "potential: legacy rule"):
        section = html.split(title)[1].split("</table>")[0]
        assert "<b>2</b>" not in section and "<td><b>" not in section
        assert "<td>2</td>" in section


def test_one_value_panels_and_breakdowns_become_words(evaluated, tmp_path):
    import copy

    from evaluation.figures import error_histograms, error_vs_thickness
    from evaluation.report import BREAKDOWN_KEYS, render

    _, doc = evaluated
    doc = copy.deepcopy(doc)
    for r in doc["samples"]:
        r["thickness_A"] = 40.0
        for m in r["metrics"]["potential"].values():
            m[FIELD]["ssim"] = 0.5
    assert error_histograms(tmp_path / "h.png", doc["samples"], "potential", "ssim") is None
    assert error_vs_thickness(tmp_path / "t.png", doc["samples"], "potential") is None
    assert not list(tmp_path.iterdir())
    doc["figures"] = {k: v for k, v in doc["figures"].items() if not k.startswith(("hist_ssim", "thickness"))}
    html = render(doc)
    assert "No ssim histogram: one value per method" in html and "every sample has thickness 40 Å" in html
    versus = html.split("<h2>Where the network beats iCoM")[1].split("<h2>")[0]
    for key, title in (("element_class", "element class"), ("thickness_class", "thickness")):
        one = len(doc["network_vs_icom"]["potential"][key]) == 1
        assert (f"<h3>By {title}</h3>" in versus) != one and (f"<b>By {title}</b>: all" in versus) == one, key
    html = html.split("<h2>Breakdowns")[1].split("<h2>")[0]
    for key, title in BREAKDOWN_KEYS.items():
        groups = doc["breakdowns"]["potential"][key]
        assert (f"<h3>By {title}</h3>" in html) == (len(groups) > 1), key
        if len(groups) == 1:
            assert f"<b>By {html_escape(title)}</b>: all" in html

