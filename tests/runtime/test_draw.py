"""Pictures of a compiled model (`kiln.runtime.draw`): the fused graph as SVG, a box per launch with the ops
it fuses, an edge per value passed (with its dtype and shape), shaded by a profile's shares, laid out by kiln
or by graphviz's dot; the per-kernel profile as an HTML bar chart. Both are parsed back here: a picture that
is not well-formed is no picture."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from kiln import relay
from kiln.runtime.draw import profile_html

SVG = "{http://www.w3.org/2000/svg}"


def _lib() -> relay.Function:
    """x -> dense+relu -> two branches (a softmax; a sum over rows) -> two outputs."""
    x = relay.var("x", shape=(4, 16))
    h = relay.nn.relu(relay.nn.dense(x, relay.const(np.ones((8, 16), "float32"))))
    return relay.build(relay.Function([x], relay.Tuple([relay.nn.softmax(h), relay.sum(h, axis=1)])))


ENGINES = ["kiln", pytest.param("graphviz", marks=pytest.mark.skipif(shutil.which("dot") is None,
                                                                     reason="graphviz's dot is not installed"))]


def _groups(root: ET.Element, kind: str) -> list[ET.Element]:
    """The groups of class `kind` (graphviz adds its own: "node launch", "edge edge")."""
    return [g for g in root.iter(f"{SVG}g") if kind in (g.get("class") or "").split()]


def _fills(group: ET.Element) -> list[str | None]:
    return [e.get("fill") for tag in ("rect", "path", "polygon") for e in group.iter(f"{SVG}{tag}")]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_fused_graph_is_well_formed_svg_with_a_box_per_launch(tmp_path: Path, engine: str) -> None:
    lib = _lib()
    svg = lib.draw(tmp_path / "g.svg", engine=engine)
    assert (tmp_path / "g.svg").read_text() == svg
    root = ET.fromstring(svg)
    launches = _groups(root, "launch")
    assert len(launches) == len(lib.graph.launches) == 3
    assert len(_groups(root, "input")) == 1 and len(_groups(root, "output")) == 2
    texts = ["".join(g.itertext()) for g in launches]
    assert any("nn.dense" in t and "nn.relu" in t for t in texts) and any("nn.softmax" in t for t in texts)
    edges = _groups(root, "edge")
    assert len(edges) == 5  # x -> dense; dense -> softmax, sum; each to its output
    labels = {[t for t in e.itertext() if t.strip()][-1] for e in edges}
    assert labels == {"float32[4, 16]", "float32[4, 8]", "float32[4]"}
    assert all(f == "#ffffff" for g in launches for f in _fills(g) if f != "none")  # no profile


@pytest.mark.parametrize("engine", ENGINES)
def test_a_profile_shades_the_groups_and_makes_an_html_bar_chart(engine: str) -> None:
    lib = _lib()
    profile = lib.create_executor().profile(repeat=3, x=np.ones((4, 16), "float32"))
    root = ET.fromstring(lib.draw(profile=profile, engine=engine))
    fills = [f for g in _groups(root, "launch") for f in _fills(g)]
    assert "#ff8c14" in fills  # the largest share: deep orange
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


def test_without_dot_the_graph_is_laid_out_by_kiln_and_graphviz_alone_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lib = _lib()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert lib.draw() == lib.draw(engine="kiln")
    with pytest.raises(RuntimeError, match="needs graphviz's dot on PATH"):
        lib.draw(engine="graphviz")
    with pytest.raises(ValueError, match="engine must be 'auto', 'graphviz' or 'kiln', got 'neato'"):
        lib.draw(engine="neato")


def test_relay_draws_a_module_as_its_build_does() -> None:
    x = relay.var("x", shape=(4, 16))
    h = relay.nn.relu(relay.nn.dense(x, relay.const(np.ones((8, 16), "float32"))))
    func = relay.Function([x], relay.Tuple([relay.nn.softmax(h), relay.sum(h, axis=1)]))
    svg = relay.draw(relay.IRModule.from_expr(func), engine="kiln")
    assert svg == relay.build(func).draw(engine="kiln")
    assert len(_groups(ET.fromstring(svg), "launch")) == 3
