"""The HTML pieces every report section is built from: escaped text, numbers, intervals, tables, figures."""
from __future__ import annotations

import html
from typing import Any


def esc(x: Any) -> str:
    """``x`` as text, HTML-escaped."""
    return html.escape(str(x))


def num(v: Any, digits: int = 4) -> str:
    """A number to ``digits`` significant digits; "–" for None."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return esc(v)


def ci(entry: dict[str, Any] | None) -> str:
    """A mean with its interval in brackets (aggregation's {value, low, high} entries)."""
    if not entry or entry.get("value") is None:
        return "–"
    text = num(entry["value"])
    if entry.get("low") is not None and entry.get("high") is not None and entry["low"] != entry["high"]:
        text += f" <span class='note'>[{num(entry['low'], 3)}, {num(entry['high'], 3)}]</span>"
    return text


def table(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    """A table whose first ``left`` columns are left-aligned (text) and the rest right-aligned (numbers)."""
    head = "".join(f"<th class='l'>{h}</th>" if i < left else f"<th>{h}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td class='l'>{c}</td>" if i < left else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def figure(doc: dict[str, Any], name: str, caption: str) -> str:
    """The figure ``name`` of ``doc["figures"]`` ("" when it was not drawn), declared 2x
    (`figures.SAVE_DPI`) so it shows at the size its fonts were set for. Only ``srcset``: a ``src``
    beside it would be taken as the 1x image and shown twice as large."""
    path = doc["figures"].get(name)
    if not path:
        return ""
    return (f"<figure><img srcset='{esc(path)} 2x' alt='{esc(caption)}'>"
            f"<figcaption class='note'>{esc(caption)}</figcaption></figure>")
