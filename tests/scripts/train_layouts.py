"""Train several layouts of the reference GPT one after another in the same processes: one
launch per world size instead of one per layout (most of a launch is starting processes and
importing torch). Each layout gets its own process groups, its own seed and its own --dump,
and its own trace when it names a directory for one (made inside it, as under trace-run: the
groups, the recorded configuration, the training); what the reporting rank prints goes to the
dump's ``.stdout`` beside it.

    torchrun --nproc-per-node N tests/scripts/train_layouts.py SPEC.json
    python tests/scripts/train_layouts.py SPEC.json               # one process

SPEC.json: ``[[name, [train flags...], trace directory or null], ...]``, each with its own
``--dump FILE`` (or none, for a traced layout whose trace is all that is wanted).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tracer  # noqa: E402
from sample_runs.config import parse_config  # noqa: E402
from sample_runs.parallel.process_groups import build_groups, single_process_groups  # noqa: E402
from sample_runs.train import train  # noqa: E402


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    world = dist.get_world_size() if distributed else 1
    for name, argv, trace_dir in spec:
        cfg = parse_config(argv, world_size=world)
        torch.manual_seed(cfg.seed)
        printed = io.StringIO()
        with tracer.trace(trace_dir) if trace_dir else contextlib.nullcontext():
            groups = build_groups(tp=cfg.tp, dp=cfg.dp, pp=cfg.pp, cp=cfg.cp, ep=cfg.ep) \
                if distributed else single_process_groups()
            tracer.record_config(**cfg.tracer_config())
            with contextlib.redirect_stdout(printed):
                train(cfg=cfg, groups=groups, device=torch.device("cpu"))
        if printed.getvalue() and cfg.dump:
            Path(cfg.dump).with_suffix(".stdout").write_text(printed.getvalue())
        if distributed:
            dist.barrier()        # the next layout's groups are made by every rank together
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
