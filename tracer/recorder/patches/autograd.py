"""The patches into autograd, checkpointing and the optimizers: where phases.py's rules see the
recomputation (non-reentrant and reentrant), the gradient seed and the optimizer steps
(docs/phases.md)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.utils.checkpoint as _checkpoint

if TYPE_CHECKING:
    from . import Patches


def install(patches: "Patches", session) -> None:
    rules = session.rules
    _optimizer_steps(patches, rules, session.optimizer_post)
    _recomputation(patches, rules, session.memory)
    _reentrant_replay(patches, rules)
    # loss.backward() makes the gradient seed (ones_like) before the autograd engine runs
    patches.wrap(torch.autograd, "_make_grads", rules.as_gradient_seed)


def _optimizer_steps(patches: "Patches", rules, after_step) -> None:
    """Every optimizer's step: the optimizer phase and its closure (phases.py); the step
    boundary after it (the session)."""
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)
    patches.on_undo(register_optimizer_step_pre_hook(rules.optimizer_step_begins).remove)
    patches.on_undo(register_optimizer_step_post_hook(after_step).remove)


def _recomputation(patches: "Patches", rules, memory) -> None:
    """Checkpointing's frame and recomputation hook as subclasses: the frame keeps the modules
    of the forward, the hook tells the rules a recomputation runs, under those modules, and the
    memory recorder (when there is one) that the inputs it recomputes from are activations."""
    frame_cls = getattr(_checkpoint, "_CheckpointFrame", None)
    hook_cls = getattr(_checkpoint, "_recomputation_hook", None)
    if frame_cls is None or hook_cls is None:   # another torch: recomputation stays backward
        return

    class Frame(frame_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.paratrace_modules = rules.forward_modules()

    class Recomputation(hook_cls):
        def __init__(self, target_frame_ref, gid):
            super().__init__(target_frame_ref, gid)
            frame = target_frame_ref()
            self._paratrace_stack = getattr(frame, "paratrace_modules", None)
            if memory is not None and frame is not None:
                memory.recomputes(frame)

        def __enter__(self):
            self._paratrace_saved = rules.recompute_begins(self._paratrace_stack)
            return super().__enter__()

        def __exit__(self, *exc):
            try:
                return super().__exit__(*exc)
            finally:
                rules.recompute_ends(self._paratrace_saved)

    patches.wrap(_checkpoint, "_CheckpointFrame", lambda _: Frame)
    patches.wrap(_checkpoint, "_recomputation_hook", lambda _: Recomputation)


def _reentrant_replay(patches: "Patches", rules) -> None:
    """Reentrant checkpointing's Function (``use_reentrant=True``): its forward hands the rules
    the function its backward replays (phases.py)."""
    function = getattr(_checkpoint, "CheckpointFunction", None)
    if function is None or not isinstance(vars(function).get("forward"), staticmethod):
        return      # another torch: the replay stays backward

    def make(original):
        forward = original.__func__

        def checkpointed(ctx, run_function, *args):
            return rules.reentrant_checkpoint(forward, ctx, run_function, args)
        return staticmethod(checkpointed)
    patches.wrap(function, "forward", make)
