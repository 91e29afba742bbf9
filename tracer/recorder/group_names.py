"""How the recorder names process groups: the trace's text of a group (its ranks, and torch's
name where another group spans the same ranks) and what the user or DeviceMesh called it, which
the flusher writes into the trace's ``process_groups`` metadata: ``desc``, the group's
``group_desc``, and ``mesh_dims``, the DeviceMesh dimensions it is the group of. A dimension
that spans the world gets torch's default group (``group_desc`` ``default_pg``), a dimension of
size 1 groups of one rank: DeviceMesh's own word is the one that names them
(patches/distributed.py hands them over as DeviceMesh gives them out)."""
from __future__ import annotations

import threading
from typing import Optional

import torch.distributed as dist

from tracer.vocab.groups import group_text


class GroupNames:
    """group text -> its names, ``{"desc": str, "mesh_dims": [str, ...]}``; the changed entries
    are taken by the flusher (:meth:`take_renamed`). Named from the training thread, taken from
    the flusher's."""

    def __init__(self):
        self._entries: dict[str, dict] = {}
        self._renamed: set[str] = set()
        self._lock = threading.Lock()
        # (torch's group name, dimension) already named: DTensor asks for a mesh dimension's
        # group at every redistribution, and naming it scans every group
        self._meshed: set[tuple] = set()

    def desc(self, text: str, pg) -> None:
        """The ``group_desc`` of ``pg``, recorded as ``text``, if it has one."""
        desc = group_desc(pg)
        if desc is not None:
            self._name(text, "desc", desc)

    def mesh_group(self, pg, dim: str) -> None:
        """``pg`` is the group of DeviceMesh dimension ``dim`` on this rank, whatever torch
        named it."""
        key = (getattr(pg, "group_name", id(pg)), dim)
        if key in self._meshed:
            return
        self._meshed.add(key)
        try:
            ranks = tuple(dist.get_process_group_ranks(pg))
        except Exception:          # not a process group this rank belongs to
            return
        if ranks:
            self._name(group_text_of(pg, ranks), "mesh_dims", dim)

    def _name(self, text: str, key: str, name: str) -> None:
        with self._lock:
            entry = self._entries.setdefault(text, {})
            if key == "desc":
                if entry.get("desc") == name:
                    return
                entry["desc"] = name
            else:
                dims = entry.setdefault(key, [])
                if name in dims:
                    return
                dims.append(name)
            self._renamed.add(text)

    def take_renamed(self) -> dict[str, dict]:
        """The groups named since the last call: text -> its whole entry (the reader merges
        ``process_groups`` entry by entry)."""
        with self._lock:
            out = {text: dict(self._entries[text]) for text in self._renamed}
            self._renamed.clear()
        return out


def group_text_of(pg, ranks) -> str:
    """How a trace names a process group (:func:`tracer.vocab.groups.group_text`): its global ranks,
    ``0,1,2,3``; for a process group over the same ranks as one created before it (Megatron's
    tensor-parallel group spanning the world, say), the ranks and torch's name for it, ``0,1@2``,
    so that its collectives are matched apart from the other's. Which process group over a set
    of ranks came first is the same on every member (process groups are created in the same
    order everywhere), so every member names it alike."""
    try:
        from torch.distributed.distributed_c10d import _world
        members = set(ranks)
        for other, mapping in list(_world.pg_group_ranks.items()):
            if set(mapping) == members:
                return group_text(ranks, name=None if other.group_name == pg.group_name
                                      else pg.group_name)
    except Exception:          # a torch without these internals: the ranks alone
        pass
    return group_text(ranks)


def group_desc(pg) -> Optional[str]:
    """The ``group_desc`` a process group was given (``new_group(group_desc=...)``;
    DeviceMesh gives ``mesh_<dim name>``), or None: none given, or a torch without it."""
    desc = getattr(pg, "group_desc", None) if pg is not None else None
    return desc if isinstance(desc, str) and desc and desc != "undefined" else None
