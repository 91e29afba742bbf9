"""The Perfetto export of a real run (the tiny GPT under DDP, 2 ranks, gloo, --memory: the
session's ``wrapped_runs``), as the report writes it (timeline.json), against the Chrome trace
event format (support.chrome_trace_checks): args on every op, one flow per collective matched
across the ranks, a memory counter track per rank whose parameters reach what torch counts."""
from __future__ import annotations

import importlib.util
import json

from support.chrome_trace_checks import check_chrome_trace, check_counters, check_op_args
from support.wrapped_runs import RANKS, SCRIPT
from viz.analysis import analyse
from viz.render.report import ReportInput, timeline
from viz.run import open_run


def parameter_bytes() -> int:
    """The tiny GPT's parameters in bytes, as torch counts them (float32)."""
    spec = importlib.util.spec_from_file_location("tiny_gpt_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return 4 * sum(p.numel() for p in module.TinyGPT().parameters())


def test_timeline_json_has_op_args_collective_flows_and_memory(wrapped_runs, tmp_path):
    analysis = analyse(open_run(wrapped_runs["ddp"]))
    timeline.render(ReportInput(analysis), str(tmp_path))
    events = json.loads((tmp_path / ReportInput.TIMELINE_FILES["chrome_trace"]).read_text()
                        )["traceEvents"]
    matched = [m for m in analysis.cross.matched if len(m.spans) > 1]
    kinds = {m.kind for m in matched}
    assert {"all_reduce", "broadcast"} <= kinds           # DDP's gradients and its setup
    check_chrome_trace(events, expected_flows=len(analysis.timeline.links) + len(matched))
    ops = check_op_args(events)
    # the model's matmuls name their module on the unwrapped model's path and the script's line
    linear = [e["args"] for e in ops if e["name"] == "aten.addmm.default"
              and e["args"]["phase"] == "forward"]
    assert linear and all(a["source"].split(":")[0].endswith("ddp_train.py") for a in linear)
    assert {"DistributedDataParallel.module.blocks.0.mlp.fc1",
            "DistributedDataParallel.module.head"} <= {a["module"] for a in linear}
    assert all(a["shapes"].startswith("f32[") for a in linear)
    counters = check_counters(events)
    assert sorted(counters) == list(range(RANKS))
    for series in counters.values():
        assert set(series[0]["args"]) == {"parameters", "gradients", "optimizer_state",
                                          "activations", "temporaries", "comm"}
        assert max(e["args"]["parameters"] for e in series) == parameter_bytes()
