"""The device worker: a process of its own that parses a recording's saved CUPTI windows and
appends them to ``rank-<R>.device.arrow``, so the parse (Python, a third of a second a window
on the CPU stand-in) and the Arrow write never hold the training process's GIL.

The recorder (:mod:`tracer.recorder.device.kineto_windows`) starts one per recording at its first
window (:class:`DeviceWorker`: ``sys.executable``, never multiprocessing, whose spawn would import
the training script again) and talks to it in JSON lines. On its stdin:

    {"window": N, "path": PATH}     parse the export at PATH, append it as window N, delete PATH
    {"close": true}                 close the device file and exit

On its stdout: ``{"ready": true}`` once its imports are done, then one line per window once it
is in the file (or failed): ``{"window": N, "error": null or one line, "span": [t0, t1]}``
(``time.perf_counter()`` around its parse and write: CLOCK_MONOTONIC on Linux, the recorder's
clock too; benchmarks/device_windows.py reads it).
A window that parses is appended, then its export deleted, then answered: a worker killed at
any point leaves it in the file or its export on disk (:meth:`WindowAppender.resume` reads back
what the worker wrote). It ignores SIGINT (Ctrl-C reaches the whole process group:
the recorder closes it) and leaves when its stdin ends or its parent is gone, after the windows
already sent. Torch-free.
"""
from __future__ import annotations

import collections
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Callable, Optional

import pyarrow as pa

from tracer.files.device_format import DeviceWriter, intact_batches
from tracer.kineto.chrome_trace import KinetoError, load_chrome_trace
from tracer.vocab.library import ROOT

# what the worker's interpreter runs: paratrace's root first, a failure in one line
BOOT = """import sys
sys.path.insert(0, sys.argv[1])
try:
    from tracer.recorder.device.window_worker import main
except Exception as exc:
    sys.exit(f"paratrace device worker: cannot start ({type(exc).__name__}: {exc})")
main(sys.argv[2:])
"""
PARENT_POLL_S = 1.0      # how often a worker with nothing to read checks that its parent lives
EXIT_WAIT_S = 10.0       # how long a closed worker may take to close its file and exit


class WindowAppender:
    """Parses saved windows and appends them to a rank's device file, a batch each; the file
    is made at the first window that parses. The worker's and the in-process path's code."""

    def __init__(self, path: str, rank: int):
        self.path, self.rank = path, rank
        self.writer: Optional[DeviceWriter] = None

    def append(self, index: int, export: str,
               parse: Callable = load_chrome_trace) -> Optional[str]:
        """Parse the export of window ``index``, append it, delete the export. Returns what
        went wrong in one line, or None: a window that cannot be read is left out, one read
        past damage (events dropped) is appended and its damage said."""
        try:
            try:
                records = parse(export)
            except (OSError, RuntimeError) as exc:
                return f"a device window was not saved ({exc})"
            except KinetoError as exc:
                return f"a device window was unreadable ({exc})"
            if self.writer is None:
                self.writer = DeviceWriter(self.path, {"rank": self.rank, "source": "cupti"})
            self.writer.write(records, {"window": index, "devices": records.meta.get("devices")})
            damage = records.meta.get("damage_line")
            return f"device window {index}: {damage}" if damage else None
        finally:
            if os.path.exists(export):
                os.remove(export)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    @classmethod
    def resume(cls, path: str, rank: int) -> tuple:
        """(an appender that goes on with the device file a dead worker left, the windows in
        it): its complete batches are written again and a batch cut short is dropped (a
        stream cannot be appended to once its writer is gone)."""
        appender, done = cls(path, rank), set()
        try:
            reader = pa.ipc.open_stream(pa.memory_map(path, "r"))
        except (pa.ArrowInvalid, OSError):      # none, or cut short in its header: start anew
            return appender, done
        fresh = path + ".resume"
        writer = DeviceWriter(fresh, {"rank": rank, "source": "cupti"})
        for records, meta in intact_batches(reader, []):   # up to the batch it was writing
            writer.write(records, meta or {})
            done.add((meta or {}).get("window"))
        del reader
        os.replace(fresh, path)
        writer.path, appender.writer = path, writer
        return appender, done


class DeviceWorker:
    """The recorder's end of its worker: windows sent and not yet answered, in order, and the
    answers' errors. Used by one thread at a time (the recorder's write lock)."""

    def __init__(self, device_path: str, rank: int):
        # NOTE: -c with the package's own root first (BOOT): `-m` would put the working
        # directory first, where another `tracer` may be. One BLAS thread: it needs none.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BOOT, ROOT, device_path, str(rank), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.sent: collections.OrderedDict = collections.OrderedDict()  # window -> export
        self.errors: list = []          # (window, error line), as answered
        self.ended = False              # its stdout ended: it exited or is exiting
        self._buffer = b""

    def send(self, index: int, export: str) -> bool:
        """Hand window ``index`` over; False when the worker is gone (nothing was sent)."""
        if self.ended or self.proc.poll() is not None:
            return False
        try:
            self.proc.stdin.write(json.dumps({"window": index, "path": export}).encode() + b"\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):          # a broken pipe: it died
            return False
        self.sent[index] = export
        return True

    def poll(self, timeout: float = 0.0) -> None:
        """Take the answers that arrive within ``timeout`` seconds (0: those there now)."""
        if self.ended:
            return
        fd = self.proc.stdout.fileno()
        # NOTE: poll, not select: a training process may hold more than select's 1024 fds
        waiter = select.poll()
        waiter.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while not self.ended:
            if not waiter.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                return
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.ended = True
                return
            *lines, self._buffer = (self._buffer + chunk).split(b"\n")
            for line in lines:
                self._answered(line)
            if timeout:
                return                          # the caller's loop decides whether to wait on

    def _answered(self, line: bytes) -> None:
        try:
            answer = json.loads(line)
        except ValueError:
            return
        if not isinstance(answer, dict) or "window" not in answer:
            return                              # {"ready": true}
        self.sent.pop(answer["window"], None)
        if answer.get("error"):
            self.errors.append((answer["window"], answer["error"]))

    def wait(self, timeout: float) -> bool:
        """Wait until every window sent is answered; False if the worker ended first or
        ``timeout`` seconds passed."""
        deadline = time.monotonic() + timeout
        self.poll()
        while self.sent and not self.ended:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.poll(left)
        return not self.sent

    def alive(self) -> bool:
        return not self.ended and self.proc.poll() is None

    def exit_status(self) -> str:
        code = self.proc.poll()
        return "still running" if code is None else \
            f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    def close(self) -> None:
        """Ask it to close the device file and exit; killed if it has not within
        EXIT_WAIT_S."""
        try:
            self.proc.stdin.write(b'{"close": true}\n')
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
        self._close_pipes()

    def kill(self) -> None:
        """Kill it and take the answers it wrote before it died: nothing writes the device
        file after this."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        deadline = time.monotonic() + EXIT_WAIT_S     # (its end of the pipe is closed now)
        while not self.ended and time.monotonic() < deadline:
            self.poll(deadline - time.monotonic())
        self._close_pipes()

    def _close_pipes(self) -> None:
        self.ended = True
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


def messages(fd: int, parent: int):
    """The JSON objects sent on ``fd``, a line each, until it ends or, once nothing is left to
    read, the parent ``parent`` is gone (a rank killed while another process, a fork of it,
    still holds the pipe)."""
    buffer = b""
    while True:
        ready, _, _ = select.select([fd], [], [], PARENT_POLL_S)
        if not ready:
            if os.getppid() != parent:
                return
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        *lines, buffer = (buffer + chunk).split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                message = None
            if isinstance(message, dict):
                yield message
            elif line.strip():
                print(f"paratrace device worker: not a message, ignored: {line[:80]!r}",
                      file=sys.stderr, flush=True)


def main(argv: list) -> None:
    """``DEVICE_FILE RANK PARENT_PID``: serve the recorder on stdin and stdout (the module
    docstring). The parent's pid comes from the parent: one that died while this process
    was still importing has already left it to another."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if len(argv) != 3 or not (argv[1].isdigit() and argv[2].isdigit()):
        sys.exit("paratrace device worker: arguments DEVICE_FILE RANK PARENT_PID")
    parent = int(argv[2])
    appender = WindowAppender(argv[0], int(argv[1]))
    say({"ready": True})
    try:
        for message in messages(sys.stdin.fileno(), parent):
            if message.get("close"):
                break
            index, export = message.get("window"), message.get("path")
            if type(index) is not int or not isinstance(export, str):
                continue
            t0 = time.perf_counter()
            try:
                error = appender.append(index, export)
            except Exception as exc:             # the Arrow write: this window, not the rest
                error = f"a device window was not written ({type(exc).__name__}: {exc})"
            say({"window": index, "error": error, "span": [t0, time.perf_counter()]})
    except Exception as exc:                     # never a traceback on the rank's stderr
        sys.exit(f"paratrace device worker: {type(exc).__name__}: {exc}")
    finally:
        appender.close()


def say(answer: dict) -> None:
    """One line to the recorder; nothing if it is gone (its windows still go to the file)."""
    try:
        os.write(1, json.dumps(answer).encode() + b"\n")
    except OSError:
        pass
