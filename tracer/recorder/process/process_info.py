"""Who is recording: the process's rank and world size before a process group exists, the
metadata a trace starts with, and the source files its stacks name (docs/trace-format.md)."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import sys
import time
from typing import Optional

import torch
import torch.distributed as dist

from tracer.files.format import FORMAT_VERSION

# How this recorder stamps a collective's completion (docs/trace-format.md, ``completion``):
# 2: where it happens, the first of its work future's callback, an op started once that future
# is done, and the end of Work.wait(), the ops a backend runs inside Work.wait() not recorded.
# Traces without the key came before that: their completion could be the callback alone, which
# waits for the GIL and can land after the rank went on (viz.whatif.replay.waits corrects those).
COMPLETION = 2


def rank_and_world() -> tuple:
    """From torch.distributed once it is initialized, else RANK / WORLD_SIZE, else 0 / 1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return env_int("RANK") or 0, env_int("WORLD_SIZE") or 1


def env_int(name: str) -> Optional[int]:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def start_meta(rank: int, world_size: int, options: dict, clock_pairs: list,
               hot_path: str) -> dict:
    """The metadata of a trace's first batch (``hot_path``: "c" or "python", _native.py)."""
    return {
        "format_version": FORMAT_VERSION, "rank": rank, "world_size": world_size,
        "pid": os.getpid(), "host": socket.gethostname(), "start_ns": time.perf_counter_ns(),
        "start_unix": time.time(), "argv": list(sys.argv), "options": options,
        "torch": torch.__version__, "python": sys.version.split()[0], "hot_path": hot_path,
        "local_rank": env_int("LOCAL_RANK"), "node_rank": env_int("GROUP_RANK"),
        "clock_pairs": clock_pairs, "source_roots": source_roots(), "completion": COMPLETION,
    }


def source_roots() -> dict:
    """Where the recording's own code lives: its working directory and the script's directory
    (``sys.path[0]``, as ``python script.py`` and trace-run's bootstrap set it)."""
    script = sys.path[0] if sys.path and sys.path[0] else os.getcwd()
    return {"cwd": os.getcwd(), "script": os.path.abspath(script)}


MAX_SOURCE_BYTES = 2_000_000     # larger files get no hash, so reports show no text of them
MAX_SOURCE_FILES = 5_000


class SourceHashes:
    """The content hash and size of each source file the recorded stacks name, with the root
    it lies under (``cwd``, ``script``, or ``path``: the ``sys.path`` entry it was imported
    from, e.g. site-packages for a package), for the trace's ``sources`` metadata. A report
    shows a file's text only where the file it finds still has this hash
    (viz/analysis/callgraphs/source_files.py): a trace from elsewhere that names a local file gets
    nothing of it, and a file edited since the run is said to be changed rather than shown against
    the wrong lines. Hashed as stacks appear (at each flush, new files only), so a rank killed later
    keeps them."""

    def __init__(self):
        self.roots = source_roots()
        self._seen_stacks = 0
        self._files: set = set()

    def fresh(self, stack_values: list) -> dict:
        """path -> {"sha256", "size", "root", "under"} of the files first named by the stacks
        interned since the last call (``stack_values``: the stack dictionary, JSON texts)."""
        out = {}
        end = len(stack_values)
        for text in stack_values[self._seen_stacks:end]:
            for frame in json.loads(text):
                path = frame[0]
                if path in self._files or len(self._files) >= MAX_SOURCE_FILES:
                    continue
                self._files.add(path)
                entry = self._hash(path)
                if entry is not None:
                    out[path] = entry
        self._seen_stacks = end
        return out

    def _hash(self, path: str) -> Optional[dict]:
        if not (path.endswith(".py") and os.path.isabs(path)):
            return None
        try:
            with open(path, "rb") as fh:
                info = os.fstat(fh.fileno())
                if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SOURCE_BYTES:
                    return None
                digest = hashlib.sha256(fh.read()).hexdigest()
        except OSError:
            return None
        root, under = self._root_of(path)
        return {"sha256": digest, "size": info.st_size, "root": root, "under": under}

    def _root_of(self, path: str) -> tuple:
        own = [name for name in ("script", "cwd") if _inside(path, self.roots[name])]
        if own:                                   # the more specific of the two
            name = max(own, key=lambda n: len(self.roots[n]))
            return name, self.roots[name]
        entries = [os.path.abspath(p) for p in sys.path if p and _inside(path, os.path.abspath(p))]
        if entries:
            return "path", max(entries, key=len)
        return "file", os.path.dirname(path)


def _inside(path: str, directory: str) -> bool:
    return path.startswith(directory.rstrip(os.sep) + os.sep)
