"""The report's per-material and per-sample sections: what each id means (formula, prototype, how
the structure was made, zone axis), the worst cases and every sample."""
from __future__ import annotations

from typing import Any

from .html_parts import esc, figure, num, table
from .material_ids import ID_FORMS, describe_material
from .methods import NETWORK, Method, baselines, in_panel_order
from .views import HEADLINE, LEVEL

#: the columns that say what a sample is, beside its id in every per-sample table.
SAMPLE_COLUMNS = ["sample", "formula", "prototype", "zone axis", "thickness (Å)"]


def _baselines(doc: dict[str, Any], target: str) -> list[Method]:
    """The baselines computed for ``target``, in panel order (a column of a method never run would be
    all dashes)."""
    present = {m for r in doc["samples"] for m in r["metrics"][target]}
    return [m for m in in_panel_order(baselines()) if m.name in present]


def _column(m: Method) -> str:
    """A method's per-sample column heading (field's rule)."""
    return f"{m.short_label} rel L2"


def materials_section(doc: dict[str, Any]) -> str:
    """Each evaluated material: its formula, prototype and how its structure was made from the id."""
    formulas = {r["material_id"]: r.get("formula", "") for r in doc["samples"]}
    rows = []
    for material, formula in sorted(formulas.items()):
        d = describe_material(material, formula)
        rows.append([f"<code>{esc(d['id'])}</code>", esc(d["formula"]), esc(d["prototype"]), esc(d["made"])])
    forms = "".join(f"<li><b>{esc(kind)}</b>: <code>{esc(form)}</code>, {esc(meaning)}</li>"
                    for kind, form, meaning in ID_FORMS)
    return ("<h2>Materials</h2><p>What the ids in this report mean:</p>"
            f"<ul>{forms}</ul>" + table(["material id", "formula", "prototype", "how it was made"], rows, left=4))


def _sample_cells(r: dict[str, Any]) -> list[str]:
    """The `SAMPLE_COLUMNS` cells of one record: the id and what it names."""
    d = describe_material(r["material_id"], r.get("formula", ""))
    return [f"<code>{esc(r['sample_id'])}</code>", esc(d["formula"]), esc(d["prototype"]), esc(r["zone_axis"]).replace(" ", "\u00a0"),
            num(r["thickness_A"])]


def worst_section(doc: dict[str, Any], target: str) -> str:
    """The samples with the largest network error, each with its panel (or where it is drawn above)."""
    by_id = {r["index"]: r for r in doc["samples"]}
    first = [r["index"] for r in doc["samples"][: doc["config"]["n_panels"]]]
    rows, figs, baselines = [], [], _baselines(doc, target)
    for rank, index in enumerate(doc["worst"].get(target, [])):
        r = by_id[index]
        m = r["metrics"][target]
        rows.append(_sample_cells(r) + [num(m[NETWORK][HEADLINE]["rel_l2"])]
                    + [num(m.get(k.name, {}).get(HEADLINE, {}).get("rel_l2")) for k in baselines])
        if index in first and f"sample_{first.index(index)}_{target}" in doc["figures"]:
            figs.append(f"<p class='note'>Worst case {rank + 1} ({esc(r['sample_id'])}) is drawn above as "
                        f"per-sample panel {first.index(index) + 1}.</p>")
        else:
            figs.append(figure(doc, f"worst_{rank}_{target}", f"Worst case {rank + 1}: {r['sample_id']}"))
    return (f"<h2>Worst cases ({esc(target)}, field's rule)</h2>" +
            table(SAMPLE_COLUMNS + ["network rel L2"] + [_column(m) for m in baselines], rows, left=4)
            + "\n".join(figs))


def samples_section(doc: dict[str, Any], target: str) -> str:
    """Every evaluated sample with its errors under the field's rule and the network's level error."""
    rows, baselines = [], _baselines(doc, target)
    for r in doc["samples"]:
        m = r["metrics"][target]
        net = m[NETWORK]
        rows.append(_sample_cells(r)
                    + [num(m.get(k, {}).get(HEADLINE, {}).get("rel_l2")) for k in [NETWORK, *(b.name for b in baselines)]]
                    + [num(net[HEADLINE]["ssim"]), num(net[HEADLINE]["mean_error_A"]),
                       num(net.get(LEVEL, {}).get("level_error"))])
    return (f"<h2>Every sample ({esc(target)}, field's rule)</h2>" +
            table(SAMPLE_COLUMNS + ["network rel L2"] + [_column(m) for m in baselines]
                  + ["network SSIM", "network column error (Å)", "network level error"], rows, left=4))
