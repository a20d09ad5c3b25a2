"""report.html as a reader meets it (issue 31): the verdict, one picture and one chart before any table,
the tables after them with the manifest last; one definition of each element class everywhere; "most"
only where it is more than half; histograms a reader can tell apart; nothing from the truth marked best.
On one real evaluation of the tiny trained model over every split (both element classes present)."""
from __future__ import annotations

import copy
import json
import re
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgba
from matplotlib.image import imread

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from evaluation import EvaluationConfig, evaluate
from evaluation import figures as F
from evaluation.methods import REGISTRY, method
from evaluation.scoring import ELEMENT_CLASSES, HEAVY_CLASS, LIGHT_CLASS
from evaluation.views import FIELD, HEADLINE

#: the report's text column (CSS px): body max-width 1200 px less 2 x 1em padding.
COLUMN_PX = 1168
#: most visible characters above the first table: the verdict and its captions, one screen's worth.
TOP_TEXT_CHARS = 2500


@pytest.fixture(scope="module")
def report(tiny_trained_model, tiny_data_dir, tmp_path_factory):  # noqa: F811
    """(result, metrics.json, report.html) of every tiny sample: light and heavy materials both."""
    import stage

    out = tmp_path_factory.mktemp("layout")
    cfg = EvaluationConfig(split="all", n_bootstrap=50, n_panels=2, worst_k=2)
    result = evaluate(cfg, stage.DataConfig(), [tiny_data_dir], tiny_trained_model.model_dir, out)
    return result, json.loads(Path(result.metrics_json).read_text()), result.report_html.read_text()


class _Outline(HTMLParser):
    """The page in document order: (tag, attributes, text of a heading), and how many visible
    characters came before each element."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, dict, str, int]] = []
        self.chars = 0
        self._skip = False
        self._heading: int | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._skip = tag in ("style", "title")
        if tag in ("h2", "h3"):
            self._heading = len(self.events)
        self.events.append((tag, dict(attrs), "", self.chars))

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        self.chars += len(data.strip())
        if self._heading is not None:
            tag, attrs, text, at = self.events[self._heading]
            self.events[self._heading] = (tag, attrs, text + data, at)

    def handle_endtag(self, tag: str) -> None:
        self._skip = False
        if tag in ("h2", "h3"):
            self._heading = None


def _outline(html: str) -> list[tuple[str, dict, str, int]]:
    parser = _Outline()
    parser.feed(html)
    return parser.events


def _first(events: list, tag: str) -> int:
    return next(i for i, e in enumerate(events) if e[0] == tag)


def test_the_verdict_picture_and_chart_come_before_any_table(report):
    result, doc, html = report
    events = _outline(html)
    table = _first(events, "table")
    headings = [e[2] for e in events[:table] if e[0] == "h2"]   # the first table is the headline's
    assert headings[0] == "Verdict: potential" and headings[1:] == [headings[-1]] \
        and headings[-1].startswith("Headline: potential"), headings
    assert _first(events, "ul") < _first(events, "img") < table        # the verdict's list, then the picture
    shown = [e[1]["srcset"].removesuffix(" 2x") for e in events[:table] if e[0] == "img"]
    assert shown == [doc["figures"]["overview_potential"], doc["figures"]["class_chart_potential"]]
    assert events[table][3] < TOP_TEXT_CHARS, f"{events[table][3]} characters before the first table"
    # side by side in the text column, no taller than a laptop screen (PNG at 2x: CSS px = pixels / 2)
    sizes = [imread(result.out_dir / rel).shape[:2] for rel in shown]
    assert sum(w / 2 for _, w in sizes) + 24 <= COLUMN_PX, sizes
    assert max(h / 2 for h, _ in sizes) <= 560, sizes


def test_the_tables_follow_with_the_manifest_last(report):
    _, _, html = report
    events = _outline(html)
    h2 = [e[2] for e in events if e[0] == "h2"]
    order = ["Verdict: potential", "Headline: potential", "Where the network beats iCoM", "Breakdowns (potential",
             "Every sample (potential", "What was trained on what"]
    at = [next(i for i, text in enumerate(h2) if text.startswith(lead)) for lead in order]
    assert at == sorted(at) and at[-1] == len(h2) - 1, h2
    h3 = [(i, e[2]) for i, e in enumerate(events) if e[0] == "h3"]
    card, manifest = (next(i for i, text in h3 if text == name) for name in ("Model card", "Data manifest"))
    last_table = max(i for i, e in enumerate(events) if e[0] == "table")
    assert card < manifest < last_table


def _text(html: str) -> str:
    return unescape(re.sub(r"<[^>]+>", " ", html.split("</style>", 1)[1]))


def test_one_definition_of_each_element_class_everywhere(report):
    _, doc, html = report
    known = set(ELEMENT_CLASSES) | {"unknown"}
    assert {r["element_class"] for r in doc["samples"]} == {LIGHT_CLASS, HEAVY_CLASS}
    assert not any("z_class" in r for r in doc["samples"])
    assert set(doc["breakdowns"]["potential"]["element_class"]) <= known
    assert set(doc["network_vs_icom"]["potential"]["element_class"]) <= known
    assert set(doc["class_aggregates"]["potential"]) <= set(ELEMENT_CLASSES)
    text = _text(html)
    # every class the page names is named by its one definition ("light (every element Z <= 14", its verdict
    # label adding "; n samples of m materials)"), and every Z rule on the page is that definition's
    assert "medium" not in text
    for found in re.finditer(r"\b(light|heavy) \(", text):
        name = next(c for c in ELEMENT_CLASSES if c.startswith(found.group(1)))
        assert text[found.start():].startswith(name[:-1]), text[found.start(): found.start() + 60]
    assert set(re.findall(r"Z\s*(?:<=|>=|<|>|≤|≥)\s*\d+", text)) <= {"Z <= 14", "Z > 14"}


def test_most_is_said_only_of_more_than_half_with_the_count():
    from evaluation.report_versus import majority_sentences

    def group(wins: int, n: int) -> dict:
        return {"n": n, "network_wins": wins, "win_rate": wins / n if n else None}

    said = majority_sentences([("A", group(6, 10)), ("B", group(5, 10)), ("C", group(4, 10)), ("D", group(0, 0))])
    assert ("The network is better on most samples of: <b>A, network better on 6 of 10 samples (60%)</b>."
            in said)
    assert "iCoM is as good or better on most samples of: <b>C, network better on 4 of 10 samples (40%)</b>." in said
    assert "Split evenly: <b>B, network better on 5 of 10 samples (50%)</b>." in said
    assert "D" not in said


def test_the_reports_most_sentences_agree_with_the_counts(report):
    _, doc, html = report
    versus = doc["network_vs_icom"]["potential"]
    groups = {name: g for key in ("element_class", "thickness_class") for name, g in versus[key].items()}
    for lead, holds in (("The network is better on most samples of: ", lambda w, n: 2 * w > n),
                        ("iCoM is as good or better on most samples of: ", lambda w, n: 2 * w < n)):
        listed = re.search(re.escape(lead) + r"<b>(.*?)</b>", html)
        for item in (unescape(listed.group(1)).split("; ") if listed else []):
            name, wins, n = re.fullmatch(r"(.*), network better on (\d+) of (\d+) samples \(\d+%\)", item).groups()
            assert (int(wins), int(n)) == (groups[name]["network_wins"], groups[name]["n"]) and holds(int(wins), int(n))


def test_histograms_are_outlines_in_each_methods_registry_colour(report):
    _, doc, _ = report
    fig = F.error_histograms_figure(doc["samples"], "potential")
    ax = fig.axes[0]
    present = F.metric_values(doc["samples"], "potential", "rel_l2")
    assert len(ax.patches) == len(present) >= 3
    for patch in ax.patches:   # step outlines: nothing filled, nothing half-transparent to blend
        assert not patch.get_fill() and patch.get_alpha() in (None, 1.0)
    legend = [t.get_text().split(" (n=")[0] for t in ax.get_legend().get_texts()]
    for patch, label in zip(ax.patches, legend):
        m = next(m for m in REGISTRY if m.figure_label == label)
        assert patch.get_edgecolor() == pytest.approx(to_rgba(m.colour))


def test_nothing_taken_from_the_truth_is_marked_best(report):
    """A fitted baseline's level error is ~0 because its offset came from the truth: even in a headline
    table that showed it, it is never bold; and bold cells appear in the headline table only."""
    from evaluation.report import render

    _, doc, html = report
    headline = html.split("Headline: potential")[1].split("The network's level error")[0]
    assert headline.count("<td><b>") > 0 and html.count("<td><b>") == headline.count("<td><b>")
    doc = copy.deepcopy(doc)
    for name, entry in doc["aggregates"]["potential"].items():
        value = 1e-9 if method(name).legacy_fitted else 0.2
        entry[HEADLINE]["rel_l2_level"] = {"value": value, "low": value, "high": value, "n": 2}
        entry[HEADLINE]["scale"] = {"value": 1.0, "low": 1.0, "high": 1.0, "n": 2}
    table = render(doc).split("Headline: potential")[1].split("</table>")[0]
    for label in ("from the map", "fitted scale"):
        row = next(r for r in table.split("<tr>") if label in r)
        assert "<b>" not in row, row


def test_the_picture_shows_the_best_judged_baseline_of_a_typical_and_the_worst_sample(
        report, tiny_trained_model, tiny_data_dir):  # noqa: F811
    import models
    import stage
    from evaluation.baselines import mean_training_targets
    from evaluation.map_figures import MAX_WIDTH_IN, overview_figure
    from evaluation.scoring import recompute

    _, doc, html = report
    agg = doc["aggregates"]["potential"]
    judged = {m.name: agg[m.name][FIELD]["rel_l2"]["value"] for m in REGISTRY
              if m.judged and m.subset is None and m.name in agg}
    best = F.best_baseline(agg)
    assert best == min(judged, key=judged.get) and f"the best baseline ({method(best).label}:" in _text(html)
    errors = {r["index"]: r["metrics"]["potential"]["network"][FIELD]["rel_l2"] for r in doc["samples"]}
    typical = F.median_index(doc["samples"], "potential")
    assert abs(errors[typical] - np.median(list(errors.values()))) == min(
        abs(v - np.median(list(errors.values()))) for v in errors.values())
    worst = doc["worst"]["potential"][0]
    cfg = EvaluationConfig.model_validate(doc["config"])
    with stage.open_stores([tiny_data_dir]) as stores:
        kept = recompute(cfg, stores, [typical, worst], models.load_reconstructor(tiny_trained_model.model_dir),
                         ["potential"], mean_training_targets(stores, ["potential"]))
    by_index = {r["index"]: r for r in doc["samples"]}
    fig = overview_figure([("typical", kept[typical], by_index[typical]), ("worst", kept[worst], by_index[worst])],
                          "potential", best)
    assert fig.get_figwidth() <= MAX_WIDTH_IN
    for sub, index in zip(fig.subfigs, (typical, worst)):
        maps = [ax for ax in sub.axes if not hasattr(ax, "_colorbar")]
        assert [ax.get_title().split("\n")[0] for ax in maps] == ["truth", "network", method(best).figure_label]
        assert maps[1].get_title().endswith(f"rel L2 {errors[index]:.3f}")
        lo, hi = maps[0].get_images()[0].get_clim()   # one range per row, clipping none of its maps
        for ax in maps:
            shown = ax.get_images()[0].get_array()
            assert lo <= float(shown.min()) and float(shown.max()) <= hi and ax.get_images()[0].get_clim() == (lo, hi)
        assert any(c.get_ylabel() == "projected potential (V·Å)" for c in sub.axes if hasattr(c, "_colorbar"))


def test_best_baseline_passes_over_the_network_and_subset_methods():
    def entry(v: float) -> dict:
        return {FIELD: {"rel_l2": {"value": v}}}

    subset = next(m.name for m in REGISTRY if m.subset is not None and m.judged)
    judged = [m.name for m in REGISTRY if m.judged and m.subset is None]
    agg = {"network": entry(0.01), subset: entry(0.02), judged[0]: entry(0.5), judged[1]: entry(0.3)}
    assert F.best_baseline(agg) == judged[1]
    assert F.best_baseline({"network": entry(0.1)}) is None


def test_the_class_chart_plots_the_intervals_of_metrics_json(report):
    from matplotlib.container import ErrorbarContainer

    _, doc, _ = report
    cfg = EvaluationConfig.model_validate(doc["config"])
    intervals = F.class_intervals(doc["samples"], "potential", cfg)
    assert list(intervals) == [F.ALL_SAMPLES, *doc["class_aggregates"]["potential"]]
    fig = F.class_chart_figure(intervals, "potential")
    ax = fig.axes[0]
    sources = {F.ALL_SAMPLES: doc["aggregates"]["potential"], **doc["class_aggregates"]["potential"]}
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert {c.get_label() for c in bars} == {method(m).figure_label for m in doc["aggregates"]["potential"]}
    for c in bars:
        name = next(m.name for m in REGISTRY if m.figure_label == c.get_label())
        expected = [sources[g][name][FIELD]["rel_l2"] for g in intervals if name in sources[g]]
        assert list(c.lines[0].get_ydata()) == pytest.approx([e["value"] for e in expected])
        segments = c.lines[2][0].get_segments()
        assert [s[0][1] for s in segments] == pytest.approx([e["low"] for e in expected])
        assert [s[1][1] for s in segments] == pytest.approx([e["high"] for e in expected])
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0].startswith(F.ALL_SAMPLES) and any(label.startswith("light\n(every element\nZ <= 14)")
                                                       for label in labels)


def test_cbed_axes_in_mrad_from_either_detector_sampling():
    from evaluation.map_figures import cbed_extent
    from namsa.constants import wavelength_A
    from namsa.sample_meta import SampleMeta

    scan = SampleMeta(scan_shape=(4, 4), fov_A=(0.0, 0.0, 4.0, 4.0))
    dk = 0.05   # 1/Angstrom per pixel
    mrad = dk * wavelength_A(200.0) * 1e3
    by_k = cbed_extent(scan.replace(pattern_dk_inv_A=dk, energy_kv=200.0), 32)
    assert by_k == pytest.approx(cbed_extent(scan.replace(pattern_mrad_per_px=mrad), 32))
    assert by_k == pytest.approx((-16.5 * mrad, 15.5 * mrad, 15.5 * mrad, -16.5 * mrad))
    assert cbed_extent(scan, 32) is None
