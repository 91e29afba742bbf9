"""The patches into FSDP2 (``fully_shard``): its parameter groups' all-gathers and
reduce-scatters, and its prefetches (what tracer/recorder/frameworks/fsdp_credit.py does with them),
now if FSDP2 is imported, else as soon as it is (importing it costs about a second: the recorder
does not).

Where: torch.distributed.fsdp._fully_shard's ``FSDPParamGroup`` (``unshard``,
``post_backward``, ``pre_backward``, the staticmethod ``_prefetch_unshard``) and ``FSDPState``
(``_pre_backward``), the same names from torch 2.6 to 2.14; an attribute a torch lacks is not
patched (Patches.wrap), and a torch without the module records FSDP as before. FSDPState's
forward hooks are bound when ``fully_shard`` runs (often before a trace starts), so they are
not patched: in forward the running module stands for them.
"""
from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING

from tracer.recorder.frameworks.fsdp_credit import FsdpCredit

from .distributed import _OnImport

if TYPE_CHECKING:
    from . import Patches

_STATE = "torch.distributed.fsdp._fully_shard._fsdp_state"     # imports the param group's
_GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group"


def install(patches: "Patches", session) -> None:
    if not session.options.record_modules:     # no module column to credit
        return
    if _STATE in sys.modules:
        _fsdp(patches, session)
        return
    finder = _OnImport(_STATE, lambda: _fsdp(patches, session))
    sys.meta_path.insert(0, finder)

    def forget() -> None:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
    patches.on_undo(forget)


def _fsdp(patches: "Patches", session) -> None:
    group = getattr(sys.modules.get(_GROUP), "FSDPParamGroup", None)
    state = getattr(sys.modules.get(_STATE), "FSDPState", None)
    if group is None:
        return
    credit = FsdpCredit(session)
    patches.wrap(group, "unshard", credit.crediting)
    patches.wrap(group, "post_backward", credit.crediting)
    patches.wrap(group, "pre_backward", functools.partial(credit.issuing, "modules"))
    patches.wrap(state, "_pre_backward", functools.partial(credit.issuing, "_modules"))
    patches.wrap(group, "_prefetch_unshard", credit.prefetching)
