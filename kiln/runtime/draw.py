"""Pictures of a compiled model, self-contained (no scripts): `Library.draw` and `kiln show --svg` draw the
fused graph as SVG, `kiln bench --per-kernel --html` the per-kernel profile as an HTML bar chart.

The graph is laid out by graphviz's `dot` where it is installed (`engine="auto"` or `"graphviz"`: kiln
writes the graph in DOT and reads back dot's SVG), else by kiln's own layered layout (`engine="kiln"`,
and "auto" without `dot` or when dot fails). Both draw the same boxes, edges and shades, with the boxes
as SVG groups of class "input", "launch" and "output" and the edges of class "edge".

The graph is drawn top to bottom in layers: the inputs first, each launch (a fused group: one kernel) one
layer below the deepest value it reads, the outputs last. A box names the kernel and the ops it fuses (with
where they came from: ONNX node names, file:line) and its output's dtype and shape; an edge carries the
dtype and shape of the value it passes. With a `Profile`, each group is shaded by its share of the time
spent in kernels (white: none; deep orange: the largest share) and the share is written in its box.
Constants (weights) are left out: they would bury the data flow.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln.runtime.library import Library
    from kiln.runtime.profile import Profile

_W, _LINE, _GAP_X, _GAP_Y, _PAD = 300, 15, 40, 56, 8  # box width, line height, gaps, text padding (px)
_CHARS = 44  # characters of a line in a box before it is cut


def _cut(text: str) -> str:
    return text if len(text) <= _CHARS else text[: _CHARS - 3] + "..."


def _shade(share: float) -> str:
    """White at 0, deep orange (#ff8c14) at 1, as "#rrggbb" (which SVG and graphviz both read)."""
    s = max(0.0, min(1.0, share))
    return f"#ff{round(255 - 115 * s):02x}{round(255 - 235 * s):02x}"


_DOT_TIMEOUT = 60.0  # seconds dot may take before kiln lays the graph out itself
_log = logging.getLogger("kiln")
Box = tuple[str, list[str], str, str]  # (css class, lines, fill, tooltip)


def graph_svg(lib: Library, profile: Profile | None = None, engine: str = "auto") -> str:
    """The fused graph of `lib` as an SVG document (see the module doc).

    Raises:
        ValueError: an unknown `engine`; RuntimeError: `engine="graphviz"` without a working `dot`.
    """
    if engine not in ("auto", "graphviz", "kiln"):
        raise ValueError(f"engine must be 'auto', 'graphviz' or 'kiln', got {engine!r}")
    boxes, level, edges = _graph(lib, profile)
    dot = shutil.which("dot") if engine != "kiln" else None
    if dot is not None:
        try:
            done = subprocess.run([dot, "-Tsvg"], input=graph_dot(boxes, edges), capture_output=True, text=True,
                                  timeout=_DOT_TIMEOUT, check=False)
            start = done.stdout.find("<svg")
            if done.returncode == 0 and start >= 0:
                return done.stdout[start:]  # without dot's XML prolog and doctype: the same document as kiln's
            why = done.stderr.strip()[:300] or "no SVG in its output"
        except (OSError, subprocess.TimeoutExpired) as err:
            why = str(err)
        if engine == "graphviz":
            raise RuntimeError(f"graphviz's dot ({dot}) failed: {why}")
        _log.warning("graphviz's dot failed (%s); drawing the graph with kiln's own layout", why)
    elif engine == "graphviz":
        raise RuntimeError("engine='graphviz' needs graphviz's dot on PATH (apt-get install graphviz)")
    return _svg(boxes, level, edges)


def graph_dot(boxes: Sequence[Box], edges: Sequence[tuple[int, int, str]]) -> str:
    """The boxes and edges of `_graph` in graphviz's DOT language, top to bottom."""
    def esc(text: str) -> str:
        return text.replace("\\", "\\\\").replace('"', '\\"')

    def q(text: str) -> str:
        return f'"{esc(text)}"'

    out = ["digraph kiln {", "  rankdir=TB;",
           '  node [shape=box, style="rounded,filled", fontname="monospace", fontsize=10];',
           '  edge [fontname="monospace", fontsize=9, color="#555555", fontcolor="#555555"];']
    for b, (kind, lines, fill, tip) in enumerate(boxes):
        label = "".join(esc(t) + "\\l" for t in lines)  # each line left-justified
        out.append(f'  n{b} [id={q(f"{kind}-{b}")}, class={q(kind)}, label="{label}", fillcolor={q(fill)}, '
                   f"tooltip={q(tip)}];")
    for a, b, label in edges:
        out.append(f"  n{a} -> n{b} [class=\"edge\", label={q(label)}];")
    out.append("}")
    return "\n".join(out) + "\n"


def _graph(lib: Library, profile: Profile | None) -> tuple[list[Box], list[int], list[tuple[int, int, str]]]:
    """The boxes (inputs, launches, outputs), their layers and the edges (from, to, label) of `lib`'s graph."""
    from kiln.runtime.profile import made_by

    g = lib.graph
    boxes: list[Box] = []
    level: list[int] = []
    made: dict[int, int] = {}  # slot -> the box that makes it
    edges: list[tuple[int, int, str]] = []
    for s in g.inputs:
        made[s] = len(boxes)
        boxes.append(("input", [f"input {g.slots[s].name}", g.slots[s].text], "#e8f1fb", g.slots[s].name))
        level.append(0)
    shares = {t.index: t.seconds for t in profile.launches} if profile is not None else {}
    total = sum(shares.values())
    for n, launch in enumerate(g.launches):
        ops, sources = made_by(g, launch)
        reads = [made[s] for s in dict.fromkeys(launch.inputs) if s in made]
        lines = [f"#{n} {lib.kernels[launch.kernel].name}", _cut(" + ".join(ops) or "(copy)")]
        if sources:
            lines.append(_cut("at " + ", ".join(sources)))
        if launch.outputs:
            lines.append(g.slots[launch.outputs[0]].text)
        share = shares[n] / total if total > 0 and n in shares else None
        if share is not None:
            lines.append(f"{share:.1%} of the kernels' time")
        box = len(boxes)
        fill = _shade(shares[n] / max(shares.values())) if share is not None else "#ffffff"
        boxes.append(("launch", lines, fill, " + ".join(ops)))
        level.append(1 + max((level[r] for r in reads), default=0))
        edges += [(r, box, g.slots[s].text) for s, r in zip(dict.fromkeys(launch.inputs), reads, strict=False)
                  if s in made]
        for s in launch.outputs:
            made[s] = box
    for k, s in enumerate(g.outputs):
        src = made.get(s)
        boxes.append(("output", [f"output {lib.output_names[k]}", g.slots[s].text], "#eaf6ea",
                      lib.output_names[k]))
        level.append(1 + (level[src] if src is not None else 0))
        if src is not None:
            edges.append((src, len(boxes) - 1, g.slots[s].text))
    return boxes, level, edges


def _svg(boxes: Sequence[Box], level: Sequence[int],
         edges: Sequence[tuple[int, int, str]]) -> str:
    rows: dict[int, list[int]] = {}
    for b, lv in enumerate(level):
        rows.setdefault(lv, []).append(b)
    heights = {lv: max(len(boxes[b][1]) for b in bs) * _LINE + 2 * _PAD for lv, bs in rows.items()}
    width = max(len(bs) for bs in rows.values()) * (_W + _GAP_X) + _GAP_X
    pos: dict[int, tuple[float, float, float]] = {}  # box -> (x, y, height)
    y = float(_GAP_Y) / 2
    for lv in sorted(rows):
        bs = rows[lv]
        x0 = (width - len(bs) * (_W + _GAP_X) + _GAP_X) / 2
        for i, b in enumerate(bs):
            pos[b] = (x0 + i * (_W + _GAP_X), y, len(boxes[b][1]) * _LINE + 2 * _PAD)
        y += heights[lv] + _GAP_Y
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{y:.0f}" '
           f'viewBox="0 0 {width:.0f} {y:.0f}" font-family="monospace" font-size="12">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>']
    for a, b, label in edges:
        (xa, ya, ha), (xb, yb, _) = pos[a], pos[b]
        x1, y1, x2, y2 = xa + _W / 2, ya + ha, xb + _W / 2, yb
        out.append(f'<g class="edge"><line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}" stroke="#555" '
                   f'marker-end="url(#arrow)"/><text x="{(x1 + x2) / 2 + 4:.0f}" y="{(y1 + y2) / 2:.0f}" '
                   f'fill="#555" font-size="10">{escape(label)}</text></g>')
    for b, (kind, lines, fill, tip) in enumerate(boxes):
        x, y0, h = pos[b]
        spans = "".join(f'<tspan x="{x + _PAD:.0f}" dy="{_LINE}">{escape(t)}</tspan>' for t in lines)
        out.append(f'<g class="{kind}" id="{kind}-{b}"><title>{escape(tip)}</title><rect x="{x:.0f}" y="{y0:.0f}" '
                   f'width="{_W}" height="{h:.0f}" rx="6" fill="{fill}" stroke="#333"/>'
                   f'<text x="{x + _PAD:.0f}" y="{y0 + _PAD - 3:.0f}">{spans}</text></g>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def profile_html(profile: Profile, title: str = "kiln per-kernel profile") -> str:
    """The per-kernel profile as a self-contained HTML page: one bar per kernel, by time."""
    rows = []
    for k in profile.kernels:
        rows.append(f'<tr><td class="name">{escape(k.kernel)}</td><td class="num">{k.calls}</td>'
                    f'<td class="num">{k.seconds * 1e3:.3f}</td><td class="bar">'
                    f'<div style="width:{k.share * 100:.1f}%"></div><span>{k.share:.1%}</span></td>'
                    f'<td>{escape(k.fuses)}</td>'
                    f'<td>{escape(", ".join(k.outputs))}</td></tr>')
    total = sum(k.seconds for k in profile.kernels)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{escape(title)}</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:2px 8px;"
            "text-align:left;border-bottom:1px solid #ddd;font-size:13px}.num{text-align:right}"
            ".bar{width:320px;position:relative}.bar div{background:#f08c14;height:14px}"
            ".bar span{position:absolute;left:6px;top:2px;font-size:11px}</style></head><body>"
            f"<h1>{escape(title)}</h1><p>{len(profile.kernels)} kernels, {len(profile.launches)} launches: "
            f"{total * 1e3:.3f} ms in kernels, a whole run {profile.run_seconds * 1e3:.3f} ms (medians of "
            f"{profile.repeat} runs)</p><table><tr><th>kernel</th><th>calls</th><th>ms</th><th>share</th>"
            f"<th>ops (source)</th><th>output</th></tr>{''.join(rows)}</table></body></html>\n")
