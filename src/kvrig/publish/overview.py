"""The report's first picture: the whole matrix in one screen, a row per column and a
small square per cell, coloured by its verdict.

A release manager reads the colours before any word: which columns are red, and whether
the red gathers under one model, so a square sits under the same model on every column.
"""

from __future__ import annotations

import html
from dataclasses import dataclass


@dataclass(frozen=True)
class Square:
    """One cell of the picture: its verdict's class (the grids' colours), what hovering
    over it says, and the cell it opens."""

    css: str
    title: str
    cell_id: str


@dataclass(frozen=True)
class Line:
    """A column of the matrix as one line of the picture: its label, and a square (or
    None: no cell there) per case, in the picture's case order."""

    label: str
    squares: list[Square | None]


# The verdicts' colours, stronger than the grids' pale ones: a square is all colour.
COLOURS = {
    "pass": "#3aa757",
    "fail": "#d93025",
    "skip": "#b0b0b0",
    "xfail": "#f2a600",
    "undecided": "#8e7cc3",
    "unread": "#4a90d9",
    "unknown": "#000",
}
STYLE = (
    "table.overview{border-collapse:separate;border-spacing:1px;margin:.5em 0 1em}"
    "table.overview th{border:0;padding:0 6px 0 0;font-size:11px;font-weight:normal;"
    "white-space:nowrap;text-align:right}"
    "table.overview td{border:0;padding:0;width:8px;min-width:8px;height:12px}"
    "table.overview td.sq{cursor:pointer}table.overview td.sq:hover{outline:2px solid #333}"
    "table.overview td.gap{width:4px;min-width:4px}table.overview td.none{background:#f4f4f4}"
    "table.overview td.apart{box-shadow:inset 0 0 0 2px #000}"
    "p.legend span{display:inline-block;width:10px;height:10px;margin:0 3px 0 10px}"
    + "".join(f"table.overview .{k},p.legend .{k}{{background:{v}}}" for k, v in COLOURS.items())
)


def _esc(x: object) -> str:
    return html.escape(str(x))


def _square(sq: Square | None) -> str:
    if sq is None:
        return "<td class=none></td>"
    return (
        f"<td class='sq {_esc(sq.css)}' data-cell='{_esc(sq.cell_id)}' tabindex=0"
        f" title='{_esc(sq.title)}'></td>"
    )


def picture(lines: list[Line], gaps: set[int], legend: list[tuple[str, str]]) -> str:
    """The picture: `gaps` are the case positions a new model starts at (a narrow gap
    before each), `legend` each colour's (class, what it means)."""
    rows = []
    for line in lines:
        tds = []
        for i, sq in enumerate(line.squares):
            if i in gaps:
                tds.append("<td class=gap></td>")
            tds.append(_square(sq))
        rows.append(f"<tr><th>{_esc(line.label)}</th>{''.join(tds)}</tr>")
    keys = "".join(f"<span class='{_esc(css)}'></span>{_esc(what)}" for css, what in legend)
    return (
        "<h2>The matrix at a glance</h2><p class=legend><small>a row per column, a square"
        f" per cell (cases grouped by model){keys}</small></p>"
        f"<table id=overview class=overview><tbody>{''.join(rows)}</tbody></table>"
    )
