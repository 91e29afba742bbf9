"""The run directory's file names, defined once: the recorder and trace-run write them, viz and
the watchdog read them.

    DIR/run.json                    trace-run's record of the run (tracer.files.run_record)
    DIR/.trace-run.lock             held (flock) by the trace-run writing DIR, with its pid
    DIR/node.json                   multi-node: what this node learned at start (gather)
    DIR/summary.json, index.html    the report (viz)
    DIR/traces/rank-<R>.arrow       one trace per rank (tracer.files.format)
    DIR/traces/rank-<R>.device.arrow   its GPU activity, on CUDA (tracer.files.device_format)
    DIR/traces/rank-<R>.status.json the recorder's live status (tracer.files.status)
    DIR/traces/rank-<R>.stack.txt   Python stacks dumped on a hang (instrument.launch.bootstrap)

``tracer.trace(DIR)`` alone writes the rank files straight into DIR; readers take both layouts.
Torch-free: reading a run never imports torch.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import time
from typing import Optional

TRACES = "traces"
RUN_RECORD = "run.json"
LOCK = ".trace-run.lock"
NODE_RECORD = "node.json"
SUMMARY = "summary.json"
INDEX = "index.html"

TRACE_EXT, DEVICE_EXT, STATUS_EXT, STACK_EXT = "arrow", "device.arrow", "status.json", "stack.txt"
# ranks as the recorder writes them: rank-01.arrow is no rank file
RANK_FILE = re.compile(r"^rank-(0|[1-9]\d*)\.(arrow|device\.arrow|status\.json|stack\.txt)$")


def rank_file(rank: int, ext: str = TRACE_EXT) -> str:
    """``rank-<R>.<ext>``: the name of one of a rank's files."""
    return f"rank-{int(rank)}.{ext}"


def trace_file(traces_dir: str, rank: int) -> str:
    return os.path.join(traces_dir, rank_file(rank, TRACE_EXT))


def device_file(traces_dir: str, rank: int) -> str:
    return os.path.join(traces_dir, rank_file(rank, DEVICE_EXT))


def status_file(traces_dir: str, rank: int) -> str:
    return os.path.join(traces_dir, rank_file(rank, STATUS_EXT))


def stack_file(traces_dir: str, rank: int) -> str:
    return os.path.join(traces_dir, rank_file(rank, STACK_EXT))


def parse_rank_file(name: str, ext: Optional[str] = None) -> Optional[int]:
    """The rank of a file named ``rank-<R>.<ext>`` (any of the rank extensions when ``ext`` is
    None), else None."""
    match = RANK_FILE.match(name)
    if match is None or (ext is not None and match.group(2) != ext):
        return None
    return int(match.group(1))


def traces_dir(run_dir: str) -> str:
    """Where a run's rank files are: ``DIR/traces`` for a trace-run directory, else DIR."""
    sub = os.path.join(run_dir, TRACES)
    return sub if os.path.isdir(sub) else run_dir


def rank_files(directory: str, ext: str = TRACE_EXT) -> dict[int, str]:
    """rank -> path of every ``rank-<R>.<ext>`` file in ``directory``."""
    out = {}
    for name in os.listdir(directory):
        rank = parse_rank_file(name, ext)
        if rank is not None:
            out[rank] = os.path.join(directory, name)
    return out


class EarlierTraces(FileExistsError):
    """``tracer.trace`` given a directory holding an earlier run's trace of this rank."""


_OPENED: set[str] = set()     # trace files this process opened (a second trace would overwrite)


def open_new_trace(path: str) -> None:
    """Create ``path``'s directory for a new trace, refusing (:class:`EarlierTraces`, one line)
    to write over an earlier run's: the file exists and was written before this process
    started, or by this process's own earlier trace. A file of this run's other processes that
    started as the same rank (no RANK yet) is newer than this process: it is not refused, the
    process group renames them apart."""
    directory = os.path.dirname(path)
    try:
        written = os.stat(path).st_mtime
    except OSError:
        written = None
    started = process_started()
    if written is not None and (path in _OPENED or (started is not None and written < started)):
        raise EarlierTraces(f"tracer.trace: {directory} already holds an earlier run's trace "
                            f"({os.path.basename(path)}); give a new directory or remove the "
                            "rank-<R> files of the old run (trace-run refuses so too)")
    os.makedirs(directory, exist_ok=True)
    _OPENED.add(path)


def process_started() -> Optional[float]:
    """When this process started, in Unix seconds to a clock tick (10 ms; Linux's /proc: its
    start since boot, against the boot clock now), None where unknown."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])     # field 22, starttime
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.time() - since_boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a directory"))


def not_regular(path: str) -> Optional[str]:
    """What ``path`` is when it is no regular file (links followed), e.g. ``a FIFO (named
    pipe)``; None for a regular file or none at all. Reading one would block (a FIFO) or
    never end (a device), and its size of 0 says nothing about what it holds."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


class RunLocked(Exception):
    """Another process holds the run directory's lock; ``pid`` is its process id (0 unknown)."""

    def __init__(self, pid: int):
        super().__init__(f"held by process {pid or '(unknown)'}")
        self.pid = pid


def lock_run(run_dir: str) -> int:
    """Take ``DIR/.trace-run.lock`` for this process: one trace-run per output directory.

    An flock (not a lock file's existence) so that a SIGKILLed holder leaves no stale lock:
    the kernel drops it with the holder's last descriptor. The descriptor is close-on-exec, so
    workers started by the holder never inherit (and outlive it with) the lock. Returns the
    descriptor, to keep open while writing and :func:`os.close` after. Raises RunLocked, or
    OSError when the file cannot be created."""
    fd = os.open(os.path.join(run_dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _holder(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise RunLocked(holder) from None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def run_writer(run_dir: str) -> Optional[int]:
    """The process id of the trace-run still writing ``run_dir`` (0 if it cannot be read), or
    None when nobody holds its lock (the run ended, was killed, or never had one)."""
    try:
        fd = os.open(os.path.join(run_dir, LOCK), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        # NOTE: a shared lock taken for an instant: a trace-run taking the lock in that same
        # instant is refused (one line), never given a directory another run writes
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except OSError:
        return _holder(fd)
    finally:
        os.close(fd)


def _holder(fd: int) -> int:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0)
    except (OSError, ValueError):
        return 0
