"""docs/architecture.md's picture of the tree: the SVG is what graphviz made of the .dot beside
it (the same nodes and edges), and it draws every room of tracer/ and every layer of viz/."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from support.paths import REPO

DOT = REPO / "docs" / "images" / "architecture.dot"
SVG = REPO / "docs" / "images" / "architecture.svg"
SVG_NS = "{http://www.w3.org/2000/svg}"
ROOMS = ("vocab", "files", "kineto", "recorder")
VIZ_LAYERS = ("inputs", "analysis", "diff", "whatif", "views", "render", "cli")


def dot_graph(text: str) -> tuple:
    """(node ids, (tail, head) edges) of a dot file: ``a -> b`` statements and ``id [...]``."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)         # labels may hold anything
    edges = set(re.findall(r"\b(\w+)\s*->\s*(\w+)", text))
    nodes = set(re.findall(r"^\s*(\w+)\s*\[", text, re.M)) - {"graph", "node", "edge"}
    return nodes | {n for e in edges for n in e}, edges


def svg_graph(path) -> tuple:
    """(node titles, edges) graphviz wrote into an SVG."""
    root = ET.parse(path).getroot()
    nodes, edges = set(), set()
    for group in root.iter(f"{SVG_NS}g"):
        title = group.find(f"{SVG_NS}title")
        if title is None:
            continue
        if group.get("class") == "node":
            nodes.add(title.text)
        elif group.get("class") == "edge":
            edges.add(tuple(title.text.split("->")))
    return nodes, edges


def test_the_svg_is_the_dot_drawn():
    assert svg_graph(SVG) == dot_graph(DOT.read_text())


def test_the_picture_draws_every_room_and_layer_and_is_shown():
    nodes, edges = dot_graph(DOT.read_text())
    assert set(ROOMS) | set(VIZ_LAYERS) <= nodes
    # the one-way flow: recorder and importer write the trace files, which only viz reads
    assert {("recorder", "arrow"), ("kineto", "arrow"), ("arrow", "inputs"),
            ("inputs", "analysis"), ("views", "render")} <= edges
    assert "images/architecture.svg" in (REPO / "docs" / "architecture.md").read_text()


def test_the_comparison_sees_a_picture_out_of_date(tmp_path):
    stale = tmp_path / "stale.svg"
    stale.write_text(SVG.read_text().replace("<title>views&#45;&gt;render</title>",
                                             "<title>views&#45;&gt;analysis</title>"))
    assert svg_graph(stale) != dot_graph(DOT.read_text())
