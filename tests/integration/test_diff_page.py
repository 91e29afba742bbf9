"""trace-diff's page drawn with graphviz (the unit checks: tests/unit/test_diff_units.py)."""
from __future__ import annotations

import json
import re
from collections import Counter
from viz.render import render_all
from viz.render.diff import FILES, DiffInput
from viz.diff.diffgraph import build_diff_graph
from viz.diff.result import ALL_RANKS, DiffResult, RunSide, compare
from viz.analysis.callgraphs.op_groups import Frame
from support.diff_profiles import group, profile


def test_page_escapes_recorded_text_and_stays_offline(tmp_path):
    # Config values, qualnames and module paths come from someone else's trace.
    evil = "<script>alert(1)</script>"
    a = [group(0, [Frame("/r/pkg/model.py", 1, "f", f"f{evil}")], module=evil, count=2)]
    b = [group(0, [Frame("/r/pkg/model.py", 1, "f", f"f{evil}")], module=evil, count=3)]
    paths = {"/r/pkg/model.py": "pkg/model.py"}
    prof_a = profile(0, ops=Counter({(evil, "aten.mm.default", "forward"): 2}))
    prof_b = profile(0, ops=Counter({(evil, "aten.mm.default", "forward"): 3}))
    side = RunSide(str(tmp_path / "a"), 1, (0,), {"note": evil}, (0,))
    result = DiffResult(side, RunSide(str(tmp_path / "b"), 1, (0,), {"note": "x"}, (0,)),
                        "same-index ranks", [("note", evil, "x")],
                        [compare("rank 0", prof_a, prof_b)], [], [],
                        compare(ALL_RANKS, prof_a, prof_b),
                        [build_diff_graph(ALL_RANKS, a, paths, b, paths)])
    assert result.structural_change
    *_, page = render_all(FILES, DiffInput(result), str(tmp_path / "out"))
    html = open(page, encoding="utf-8").read()
    assert evil not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    # the one script is the report's own pan/zoom file: nothing from a trace becomes a script
    assert re.findall(r"<script[^>]*>", html) == ['<script src="svgview.js">']
    assert "https://" not in html
    svg = (tmp_path / "out" / "diff-callgraph.svg").read_text()
    assert evil not in svg and "&lt;script&gt;" in svg
    data = json.loads((tmp_path / "out" / "diff.json").read_text())
    assert data["roles"][0]["ops"] == [{"module": evil, "op": "aten.mm.default",
                                        "phase": "forward", "a": 2, "b": 3}]
