"""The storages torch.distributed.pipelining keeps itself, beside the model's, on a pipeline
rank (read from torch 2.10's, 2.11's, 2.13's and 2.14.1's ``stage.py`` and ``schedules.py``,
the same in all four for the schedules here), as lives on the rank's pass axis
(viz.whatif.pipeline.pp_memory.PassAxis):

- receive buffers (``_RecvInfo.buffer``, ``_make_tensor_from_meta``): at the first step, one
  per micro-batch for the activation a stage receives (all but the first stage) and one per
  micro-batch for the gradient it receives (all but the last), each of one micro-batch's
  tensor; kept for the run. An activation buffer is the stage's input itself (made a leaf with
  ``requires_grad_``), saved for backward where the stage's first op saves its input;
- a stage's output: in ``fwd_cache`` from its forward until its backward has run, and in its
  send's ``P2POp`` and ``Work`` (gloo's keeps its tensor) as long as the schedule keeps
  those: under GPipe (``fwd_sends_to_wait``) and ScheduleInterleaved1F1B (``send_ops``,
  waited at the step's end) until the schedule returns; under 1F1B (stage s of p runs
  w = min(m, p - s) forwards before its first backward) the warm-up's fired sends stay in
  ``send_work`` until the next one is fired, the last fired (micro-batch w - 2) until the
  steady phase ends (after backward m - w), and a steady forward's ``fwd_sends`` (the last
  warm-up one's too) until the next forward has made its own, the last until the schedule
  returns. On the last stage, in ``output_chunks`` until the next step's
  ``clear_runtime_states``, and ``step()`` returns them merged (``merge_chunks``: a
  ``torch.cat`` of all micro-batches, after the last pass);
- the gradient of a stage's input (``stage_backward`` takes it off the leaf, ``bwd_cache``
  then the send's ``P2POp`` and ``Work`` hold it): under GPipe (``bwd_sends_to_wait``) and
  ScheduleInterleaved1F1B (``send_ops``) until the schedule returns; under 1F1B the
  ``bwd_sends`` list of ``P2POp`` s holds it until the stage's next backward has made the
  next one, the last until the schedule returns.

The first step also runs shape inference unless the stages were given their shapes, and
gloo's P2P warm-up: neither outlives it.
"""
from __future__ import annotations

from ..memory.memory_replay import Life

# order of what happens at one instant at the end of the passes: the merged output is made,
# then the schedule returns (its works and lists of sends go), then the merged output is freed
MERGED, RETURNED, MERGE_FREED = -50, -40, -30


def receive_buffers(stage: int, stages: int, microbatches: int, in_bytes: int,
                    out_bytes: int, in_category: str) -> list:
    """A stage's receive buffers, made before the step and kept after it."""
    out = []
    if stage > 0:
        out += [Life(in_category, in_bytes, None, None) for _ in range(microbatches)]
    if stage < stages - 1:
        out += [Life("temporaries", out_bytes, None, None) for _ in range(microbatches)]
    return out


def output_freed(axis, schedule: str, stage: int, stages: int, microbatch: int,
                 microbatches: int) -> tuple:
    """Where a non-last stage's output of ``microbatch`` goes (module docstring)."""
    if schedule != "1f1b":
        return axis.post(RETURNED)
    warmup = min(microbatches, stages - stage)
    if microbatch == warmup - 2:            # send_work keeps its works through the steady phase
        held = axis.end("B", microbatches - warmup, stage)
    elif microbatch + 1 < microbatches:
        held = axis.end("F", microbatch + 1, stage)
    else:
        held = axis.post(RETURNED)
    return max(axis.end("B", microbatch, stage), held)


def input_grad_freed(axis, schedule: str, stage: int, microbatch: int,
                     microbatches: int) -> tuple:
    """Where the gradient a stage sends back for ``microbatch`` goes (module docstring)."""
    if schedule == "1f1b" and microbatch + 1 < microbatches:
        return axis.end("B", microbatch + 1, stage)
    return axis.post(RETURNED)


def last_stage_outputs(axis, microbatches: int, nbytes: int, category: str) -> list:
    """The previous step's outputs in ``output_chunks`` until the step's first pass, and the
    merged output of this step, for an instant after its last pass."""
    out = [Life(category, nbytes, None, axis.first_pass()) for _ in range(microbatches)]
    out.append(Life("temporaries", nbytes * microbatches, axis.post(MERGED),
                    axis.post(MERGE_FREED)))
    return out
