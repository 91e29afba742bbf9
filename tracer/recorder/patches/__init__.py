"""Every patch the recorder makes into torch and os, in one place: :func:`install` puts them all
in when a trace starts and the :class:`Patches` it returns takes them all out, in reverse
order, when the trace ends (viztracer's patch.py). The recorder's other modules say what
happens (phases, compiled, hops, pipelining, comm, exits); this package says where torch is
patched and wires the wrapper to that behaviour. One module per patched part:

- ``autograd``: torch.utils.checkpoint's ``_CheckpointFrame`` and ``_recomputation_hook``
  (recomputation), ``CheckpointFunction.forward`` (the reentrant replay),
  ``torch.autograd._make_grads`` (the gradient seed), and the optimizer step hooks
  (phases.py);
- ``distributed``: ``init_process_group`` and ``destroy_process_group`` (in
  torch.distributed and its distributed_c10d), ``Work.wait`` (comm.py), DDP's constructor and
  ``Reducer._rebuild_buckets`` (phases.py), torch.distributed.pipelining's stages and
  schedules (pipelining.py), now or when it is imported;
- ``dynamo``: ``OptimizedModule.__call__``, ``convert_frame._compile`` and
  ``OutputGraph.call_user_compiler`` (compiled.py) and ``TagActivationCheckpoint.__call__``
  (hops.py);
- ``process``: ``os._exit`` (exits.py), and the handler that detaches a forked child;
- ``storage``: ``torch.UntypedStorage.resize_`` while memory is recorded (memory_recorder.py);
- ``profiler``: ``torch.autograd.profiler._prepare_profiler``: a user's torch.profiler
  starting ends the device recording under way first (device_notes.py);
- ``fsdp``: FSDP2's parameter groups' ``unshard``, ``post_backward``, ``pre_backward``,
  ``_prefetch_unshard`` and its state's ``_pre_backward`` (fsdp_credit.py), now or when it is
  imported.

Where a torch lacks an attribute (another version), nothing is patched there and the recording
does without it, as each function says.

What is not here, on purpose: the global module hooks, which the session turns on and off with
each recorded window (modules.py); the hooks on one compiled graph's autograd node, made per
call (compiled.py); and the marks that tell Dynamo how to run paratrace's own functions
(``_mode.RecordingMode.skip_dynamo``, ``compiled.prepare``): decorators in effect, they change
nothing torch does for other code and are never undone.
"""
from __future__ import annotations

from typing import Callable

from . import autograd, distributed, dynamo, fsdp, process, profiler, storage


class Patches:
    """Attributes replaced (and hooks registered), to put back in reverse order."""

    def __init__(self):
        # (owner, name, original, whether owner held it itself, replacement), or (fn,): undo calls
        self._done: list = []

    def wrap(self, owner, name: str, make):
        """Replace ``owner.name`` with ``make(original)``; returns the replacement, or None
        when there is no such callable (another torch: nothing is replaced)."""
        if owner is None or not callable(getattr(owner, name, None)):
            return None
        own = name in vars(owner)           # else inherited: undo removes the override
        original = vars(owner)[name] if own else getattr(owner, name)
        replacement = make(original)
        setattr(owner, name, replacement)
        self._done.append((owner, name, original, own, replacement))
        return replacement

    def on_undo(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` at undo, in the same reverse order: a registered hook's ``remove``."""
        self._done.append((fn,))

    def replaced(self) -> list:
        """(owner, name) of every attribute replaced now, in the order it was."""
        return [(done[0], done[1]) for done in self._done if len(done) > 1]

    def undo(self) -> None:
        """Put everything back. NOTE: an attribute someone replaced after us (a wrapper of
        ours) is theirs, and stays: putting the original back would drop their wrapper."""
        while self._done:
            done = self._done.pop()
            if len(done) == 1:
                done[0]()
                continue
            owner, name, original, own, replacement = done
            if vars(owner).get(name) is not replacement:
                continue
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)


def install(session) -> Patches:
    """Put every patch in for ``session``; ``undo()`` on the result takes them all out."""
    patches = Patches()
    autograd.install(patches, session)
    distributed.install(patches, session)
    dynamo.install(patches, session, compiled=session.options.compiled != "eager")
    process.install(patches, session)
    fsdp.install(patches, session)
    storage.install(patches, session)
    profiler.install(patches, session)
    return patches
