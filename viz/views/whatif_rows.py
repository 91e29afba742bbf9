"""trace-whatif's ranking for people: the recorded configuration measured and replayed, then
every target by predicted step time, each with its change against the measurement, bubbles,
exposed communication, slowest rank and largest peak memory; as rows (whatif.html) and as a
table on the terminal. Reads only the viz.whatif.WhatIf it is given."""
from __future__ import annotations

from typing import Optional

from .formatters import fmt_bytes, fmt_time


def _row(name: str, measures: dict, base_step, kind: str, memory=None, **extra) -> dict:
    step = measures.get("step_s")
    peaks = [(int(r), m["peak_bytes"]) for r, m in (memory or {}).items() if m]
    change = (step / base_step - 1) if step is not None and base_step else None
    return {"name": name, "kind": kind, "step_s": step, "change": change,
            "bubble": measures.get("bubble_fraction"),
            "pipeline": measures.get("pipeline_bubble_fraction"),
            "exposed_s": measures.get("exposed_comm_s"),
            "ranks": sorted(measures.get("ranks", {}).items(), key=lambda kv: int(kv[0])),
            # the largest peak memory of any rank (recorded by default), and which rank
            "memory": max(peaks, key=lambda p: p[1]) if peaks else None,
            **extra}


def ranking(result, replay_svg: Optional[str] = None, target_svg=None) -> list:
    """The base (measured, replayed) and every target, fastest predicted step first;
    ``replay_svg``, ``target_svg(i)``: their timelines' paths, where written."""
    base = result.measured.get("step_s")
    replayed = {"svg": replay_svg} if replay_svg else {}
    out = [_row("recorded configuration, measured", result.measured, base, "measured",
                result.memory),
           _row("recorded configuration, replayed", result.replayed, base, "replayed",
                result.memory_replayed, **replayed)]
    targets = [_row(t.title, t.measures, base, "predicted", t.memory,
                    assumptions=t.assumptions, config=t.config,
                    **({"svg": target_svg(i)} if target_svg else {}))
               for i, t in enumerate(result.targets)]
    targets.sort(key=lambda r: (r["step_s"] is None, r["step_s"] or 0.0))
    for place, row in enumerate(targets, start=1):
        row["place"] = place
    return out + targets


def recorded_text(result) -> str:
    """What the recorded configuration was, in words: the reference GPT's options it names,
    else the setup read from the recording (viz.whatif.recorded.setup), else that none is known."""
    if result.setup:
        return result.setup
    keys = ("tp", "sp", "pp", "dp", "schedule", "virtual_stages", "microbatches")
    named = [f"{k} {result.config[k]}" for k in keys if result.config.get(k) is not None]
    return ", ".join(named) if named else "no configuration recorded"


def ranking_table(result) -> str:
    """The ranking as a table for the terminal."""
    lines = [f"what if: recorded {recorded_text(result)}",
             f"{'#':>2}  {'configuration':<44} {'step':>10} {'vs measured':>11} "
             f"{'no-compute':>10} {'exposed comm':>12} {'peak memory':>12}"]
    for row in ranking(result):
        change = f"{100 * row['change']:+.1f}%" if row["change"] is not None else ""
        memory = fmt_bytes(row["memory"][1]) if row["memory"] else "n/a"
        step = fmt_time(row["step_s"] * 1e9) if row["step_s"] is not None else "n/a"
        bubble = f"{100 * row['bubble']:.0f}%" if row["bubble"] is not None else "n/a"
        exposed = fmt_time(row["exposed_s"] * 1e9) if row["exposed_s"] is not None else "n/a"
        lines.append(f"{row.get('place', ''):>2}  {row['name'][:44]:<44} {step:>10} "
                     f"{change:>11} {bubble:>10} {exposed:>12} {memory:>12}")
    return "\n".join(lines)
