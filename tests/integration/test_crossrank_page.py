"""The cross-rank page, drawn (graphviz; the unit checks: tests/unit/test_crossrank.py)."""
from __future__ import annotations

from support.constructed.synthetic import SyntheticRank, write_run


U = 1_000                  # units of the constructed clocks: 1 us


MB = 1 << 20


def ranks(world: int, group=None):
    return [SyntheticRank(r, world, unit_ns=U) for r in range(world)]


def site(rank: int):
    return [(f"/src/train_{rank}.py", 40 + rank, "step", "step")]


def test_cross_rank_page(tmp_path):
    """The report's page: the straggler first, the heat map's hottest cells on the ranks that
    waited, the bandwidth row with its source line, the critical path."""
    import re

    from viz.cli import build
    rs = ranks(3)
    for r in rs:
        r.op(-20, -10)
        r.next_step(0)
        for i in range(3):
            t = 100 * i
            arrive = t + (60 if r.rank == 1 else 0)
            r.op(t, arrive, stack=site(r.rank))
            r.comm("all_reduce", arrive, arrive + 1, t + 70, group=(0, 1, 2), nbytes=MB,
                   stack=site(r.rank))
        r.next_step(300)
        r.op(300, 310)
    write_run(tmp_path / "traces", rs)
    build(str(tmp_path), str(tmp_path / "out"), warn=lambda line: None)
    html = (tmp_path / "out" / "crossrank.html").read_text()
    assert "3 collectives matched" in html
    stragglers = re.findall(r'<td><a href="ranks/rank-(\d)\.html">', html)
    assert stragglers[0] == "1"
    cells = re.findall(r'<tr><th>(\d)</th>(.*?)</tr>', html)
    colour = {rank: re.findall(r"rgba\(198, 40, 40, ([\d.]+)\)", row) for rank, row in cells}
    assert colour["1"] == ["0"] and float(colour["0"][0]) > 0.5 and float(colour["2"][0]) > 0.5
    assert "all_reduce" in html and "train_1.py:41" in html
    assert '<h2 id="critical-path">' in html and "rank 1" in html
    assert 'href="crossrank.html"' in (tmp_path / "out" / "index.html").read_text()
    # the timeline draws ranks 0 and 2 waiting for rank 1, and the critical path
    svg = (tmp_path / "out" / "timeline.svg").read_text()
    waits = re.findall(r'class="commwait"[^>]*><title>rank (\d) waiting [^<]* for rank (\d)', svg)
    assert sorted(set(waits)) == [("0", "1"), ("2", "1")] and len(waits) == 6
    assert 'class="path"' in svg
