"""The report's section on where the network beats the reference method (`methods.reference`: iCoM),
sample by sample (`aggregation.network_vs_reference`): overall, per element class and per thickness
class, with sentences that say "most" only of a class where one side is better on more than half of
the samples, and give the count."""
from __future__ import annotations

from typing import Any

from .aggregation import VERSUS
from .html_parts import esc, num, table
from .methods import reference

#: the groupings of `aggregation.network_vs_reference`, with their headings.
GROUPINGS: dict[str, str] = {"element_class": "element class", "thickness_class": "thickness"}


def versus_section(doc: dict[str, Any]) -> str:
    """"Where the network beats iCoM": the overall count, the majority sentences and one table per grouping."""
    ref = reference()
    versus = doc.get(VERSUS, {}).get("potential")
    if not versus:
        return f"<h2>Network vs {esc(ref.short_label)}</h2><p>{esc(ref.missing_note)}.</p>"
    o = versus["overall"]
    parts = [f"<h2>Where the network beats {esc(ref.short_label)}, and where it does not</h2>",
             f"<p>Overall the network has the lower relative L2 error on {_count(o)}. {esc(ref.reference)}</p>",
             f"<p>{majority_sentences([(name, g) for key in GROUPINGS for name, g in versus.get(key, {}).items()])}</p>"]
    for key, title in GROUPINGS.items():
        groups = versus.get(key, {})
        if len(groups) == 1:
            parts.append(one_group(title, *next(iter(groups.items())), "the overall figure above"))
            continue
        rows = [[esc(name), num(s["n"]), num(s["network_wins"]),
                 "–" if s["win_rate"] is None else f"{100 * s['win_rate']:.0f}%", num(s["mean_rel_l2_gap"])]
                for name, s in groups.items()]
        parts.append(f"<h3>By {title}</h3>")
        parts.append(table([title, "samples", "network wins", "win rate",
                            f"mean rel L2 ({esc(ref.short_label)} − network)"], rows))
    return "\n".join(parts)


def majority_sentences(groups: list[tuple[str, dict[str, Any]]]) -> str:
    """Which side is better on most (more than half) of the samples of each group, with the count; a
    group split exactly in half is said to be even. Groups without a compared sample are left out."""
    said = [(f"{name}, network better on {_count(g)}", 2 * g["network_wins"] - g["n"]) for name, g in groups
            if g.get("n")]
    network = [text for text, lead in said if lead > 0]
    icom = [text for text, lead in said if lead < 0]
    even = [text for text, lead in said if lead == 0]
    sentences = [_sentence("The network is better on most samples of", network),
                 # the network's count is of strict wins: iCoM's side holds the (rare) exact ties too
                 _sentence(f"{reference().short_label} is as good or better on most samples of", icom)]
    if even:
        sentences.append(f"Split evenly: <b>{esc('; '.join(even))}</b>.")
    return " ".join(sentences)


def _sentence(lead: str, groups: list[str]) -> str:
    if not groups:
        return f"{lead} no element or thickness class."
    return f"{lead}: <b>{esc('; '.join(groups))}</b>."


def _count(group: dict[str, Any]) -> str:
    """"7 of 10 samples (70%)": the network's wins in ``group``."""
    rate = "" if not group["n"] else f" ({100 * group['network_wins'] / group['n']:.0f}%)"
    return f"{group['network_wins']} of {group['n']} samples{rate}"


def one_group(title: str, name: str, group: dict[str, Any], where: str) -> str:
    """A grouping with a single group, in words: a one-row table would repeat ``where``."""
    return (f"<p><b>By {esc(title)}</b>: all {num(group['n'])} samples share one value, {esc(name)}; "
            f"{where} is its breakdown.</p>")
