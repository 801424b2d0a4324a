"""Pictures of a compiled model (`kiln.runtime.draw`): the fused graph as SVG, a box per launch with the ops
it fuses, an edge per value passed (with its dtype and shape), shaded by a profile's shares; the per-kernel
profile as an HTML bar chart. Both are parsed back here: a picture that is not well-formed is no picture."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np

from kiln import relay
from kiln.runtime.draw import profile_html

SVG = "{http://www.w3.org/2000/svg}"


def _lib() -> relay.Function:
    """x -> dense+relu -> two branches (a softmax; a sum over rows) -> two outputs."""
    x = relay.var("x", shape=(4, 16))
    h = relay.nn.relu(relay.nn.dense(x, relay.const(np.ones((8, 16), "float32"))))
    return relay.build(relay.Function([x], relay.Tuple([relay.nn.softmax(h), relay.sum(h, axis=1)])))


def _groups(root: ET.Element, kind: str) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == kind]


def test_the_fused_graph_is_well_formed_svg_with_a_box_per_launch(tmp_path: Path) -> None:
    lib = _lib()
    svg = lib.draw(tmp_path / "g.svg")
    assert (tmp_path / "g.svg").read_text() == svg
    root = ET.fromstring(svg)
    launches = _groups(root, "launch")
    assert len(launches) == len(lib.graph.launches) == 3
    assert len(_groups(root, "input")) == 1 and len(_groups(root, "output")) == 2
    texts = ["".join(g.itertext()) for g in launches]
    assert any("nn.dense" in t and "nn.relu" in t for t in texts) and any("nn.softmax" in t for t in texts)
    edges = _groups(root, "edge")
    assert len(edges) == 5  # x -> dense; dense -> softmax, sum; each to its output
    assert {"".join(e.itertext()) for e in edges} >= {"float32[4, 16]", "float32[4, 8]", "float32[4]"}
    assert all(r.get("fill") == "#ffffff" for g in launches for r in g.iter(f"{SVG}rect"))  # no profile


def test_a_profile_shades_the_groups_and_makes_an_html_bar_chart() -> None:
    lib = _lib()
    profile = lib.create_executor().profile(repeat=3, x=np.ones((4, 16), "float32"))
    root = ET.fromstring(lib.draw(profile=profile))
    fills = [r.get("fill") for g in _groups(root, "launch") for r in g.iter(f"{SVG}rect")]
    assert "rgb(255,140,20)" in fills  # the largest share: deep orange
    assert all("% of the kernels' time" in "".join(g.itertext()) for g in _groups(root, "launch"))

    class Rows(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.rows = 0
            self.open: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.rows += tag == "tr"
            if tag not in ("meta", "br"):
                self.open.append(tag)

        def handle_endtag(self, tag: str) -> None:
            assert self.open.pop() == tag, f"</{tag}> closes another element"

    page = Rows()
    page.feed(profile_html(profile, "a <test> model"))
    page.close()
    assert page.rows == 1 + len(profile.kernels) and not page.open
    assert "a &lt;test&gt; model" in profile_html(profile, "a <test> model")
