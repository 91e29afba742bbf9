"""Reading a torch.profiler (Kineto) Chrome-trace export as a stream: one event at a time.

An export is one JSON object, ``{"traceEvents": [...], "distributedInfo": {...},
"baseTimeNanoseconds": ..., ...}``, up to gigabytes when expanded. :class:`ExportStream` never
holds it whole: it reads the file (``.json`` or ``.json.gz``) a chunk at a time into a sliding
text buffer and decodes each event with the standard library's C scanner
(``json.JSONDecoder.scan_once``, what ``raw_decode`` runs), so memory stays at a chunk plus the
event being decoded, whatever the file's size. Measured on 2 cores against orjson, msgspec,
ijson (yajl2_c) and pysimdjson, it is the fastest reader that streams, with no dependency
(docs/kineto.md has the numbers).

Numbers stay exact: a JSON number with a fraction is handed over as its text
(:class:`Decimal text <ExactNumber>`), never as a float64, which cannot hold an epoch time in
nanoseconds. ``Infinity`` and ``NaN`` become :data:`NON_FINITE`.

Damage is reported, not raised, where what came before is still good: a truncated or
corrupt tail, or reading stopped at the size limit, ends the stream with ``problem`` saying
where; :class:`KinetoError` (one line naming the file) is raised only when nothing of the file
can be used. JSON never runs code, so an export from someone else is safe to read.
"""
from __future__ import annotations

import codecs
import json
import os
import re
import zlib
from typing import Any, BinaryIO, Callable, Generator, Iterator, Optional, Union, cast

from tracer.files.format import TraceError

CHUNK = 1 << 20
MAX_EVENT = 16 << 20          # one event longer than this is no torch.profiler event
GZIP_RATIO = 64               # a .gz may expand to this many times its size ...
MIN_LIMIT = 64 << 20          # ... or to this much, whichever is more (real exports: 18-29x)
_SPACE = re.compile(r"[ \t\n\r]*")
_SPACE_COMMA = re.compile(r"[ \t\n\r,]*")


class KinetoError(TraceError):
    """A file that is not a usable torch.profiler Chrome trace; one line naming it."""


class ExactNumber(str):
    """A JSON number with a fraction or an exponent, kept as its text."""

    __slots__ = ()


class _NonFinite:
    def __repr__(self) -> str:
        return "NON_FINITE"


NON_FINITE = _NonFinite()          # Infinity, -Infinity, NaN


def _non_finite(_text: str) -> _NonFinite:
    return NON_FINITE


_DECODER = json.JSONDecoder(parse_float=ExactNumber, parse_constant=_non_finite)
# (value, end) of the JSON value at a position; set by JSONDecoder.__init__, not in its stubs
_SCAN_ONCE: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
# the patterns of spaces match the empty string too: at any position, a match
_Spaces = Callable[[str, int], re.Match[str]]


def size_limit(path: str, limit: Optional[int] = None) -> Optional[int]:
    """How many bytes of JSON ``path`` may expand to: ``limit`` when given, else for a .gz
    the larger of GZIP_RATIO times its size and MIN_LIMIT; None for plain JSON (its size)."""
    if limit is not None:
        return limit
    if not str(path).endswith(".gz"):
        return None
    try:
        return max(GZIP_RATIO * os.path.getsize(path), MIN_LIMIT)
    except OSError:
        return MIN_LIMIT


class ExportStream:
    """The top-level fields and the events of one export, read once, in file order.

    ``for event in stream.events(): ...`` yields each item of ``traceEvents`` as decoded;
    ``stream.top`` holds the other top-level fields (those after ``traceEvents``, such as
    ``baseTimeNanoseconds``, once the events are read); ``stream.problem`` says why reading
    stopped early (None when the file was read whole); ``stream.bytes_read`` counts the JSON
    read."""

    def __init__(self, path: str, limit: Optional[int] = None):
        self.path = str(path)
        self.limit = size_limit(self.path, limit)
        self.top: dict[str, Any] = {}
        self.problem: Optional[str] = None
        self.items = 0
        self.bytes_read = 0
        self._fh: Optional[Union[_Gunzip, BinaryIO]] = None
        self._text = codecs.getincrementaldecoder("utf-8")()
        self._buf = ""
        self._i = 0
        self._eof = False
        self._events_seen = False

    # ------------------------------------------------------------------ file
    def _open(self) -> None:
        try:
            self._fh = _Gunzip(self.path) if self.path.endswith(".gz") else open(self.path, "rb")
        except FileNotFoundError:
            raise KinetoError(f"{self.path}: no such file") from None
        except IsADirectoryError:
            raise KinetoError(f"{self.path}: a directory, not a torch.profiler export") from None
        except OSError as exc:
            raise KinetoError(f"{self.path}: cannot be read ({exc.strerror})") from None

    def _more(self, want: int = CHUNK) -> bool:
        """Append the next chunk to the buffer (dropping what was consumed); False at the end
        of the file, or when it cannot be read further (``problem`` says why)."""
        if self._eof:
            return False
        if self.limit is not None and self.bytes_read >= self.limit:
            self._stop(f"stopped at the size limit of {self.limit >> 20} MiB of JSON "
                       f"(--kineto-max-mb raises it)")
            return False
        assert self._fh is not None, "read before _open"
        try:
            raw = self._fh.read(want)
        except (EOFError, OSError, zlib.error) as exc:
            self._stop(f"the compressed file is cut short or corrupt ({_short(exc)})")
            return False
        self.bytes_read += len(raw)
        try:
            text = self._text.decode(raw, final=not raw)
        except UnicodeDecodeError:
            self._stop(f"not UTF-8 text at byte {self.bytes_read - len(raw):,}")
            return False
        self._buf = self._buf[self._i:] + text
        self._i = 0
        if not raw:
            self._eof = True
        return bool(raw) or bool(text)

    def _stop(self, why: str) -> None:
        self._eof = True
        if self.problem is None:
            self.problem = why

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()

    # ------------------------------------------------------------------ tokens
    def _skip(self, pattern: re.Pattern[str] = _SPACE) -> str:
        """The next significant character ('' at the end of the file)."""
        match = cast(_Spaces, pattern.match)
        while True:
            self._i = match(self._buf, self._i).end()
            if self._i < len(self._buf):
                return self._buf[self._i]
            if not self._more():
                return ""

    def _value(self) -> Any:
        """Decode the JSON value at the cursor, reading more while it is incomplete. Raises
        _Cut when the file ends inside it, ValueError when it is not JSON."""
        want = CHUNK
        while True:
            try:
                value, end = _SCAN_ONCE(self._buf, self._i)
                self._i = end
                return value
            except StopIteration as stop:
                if stop.value < len(self._buf):
                    raise ValueError(f"no JSON value at char {self._at(stop.value):,}") \
                        from None
                if self._eof:
                    raise _Cut() from None
            except json.JSONDecodeError as exc:
                incomplete = _incomplete(exc, len(self._buf))
                if not incomplete:
                    raise ValueError(f"{exc.msg} at char {self._at(exc.pos):,}") from None
                if self._eof:
                    raise _Cut() from None
            if len(self._buf) - self._i > MAX_EVENT:
                raise ValueError(f"a value longer than {MAX_EVENT >> 20} MiB at char "
                                 f"{self._at(self._i):,}")
            if not self._more(want) and self.problem:
                raise _Stopped()
            want = min(want * 2, MAX_EVENT)

    def _at(self, pos: int) -> int:
        """A buffer position as a position in the file's text (approximately, for messages)."""
        return self.bytes_read - (len(self._buf) - pos)

    # ------------------------------------------------------------------ the object
    def events(self) -> Generator[Any, None, None]:
        """Every item of ``traceEvents``; the other top-level fields land in ``top``."""
        self._open()
        try:
            yield from self._object()
        finally:
            self.close()

    def _object(self) -> Iterator[Any]:
        if self._skip() == "\ufeff":
            self._i += 1
        first = self._skip()
        if first != "{":
            what = {"[": "a JSON array", "": "empty"}.get(first, "not JSON")
            if self.problem and not self.bytes_read:
                what = self.problem
            raise KinetoError(f"{self.path}: not a torch.profiler export ({what}; torch."
                              "profiler writes a JSON object with a traceEvents list)")
        self._i += 1
        try:
            while self._skip(_SPACE_COMMA) not in ("}", ""):
                key = self._value()
                if not isinstance(key, str) or self._skip() != ":":
                    raise ValueError(f"expected a field name at char {self._at(self._i):,}")
                self._i += 1
                if self._skip() == "[" and key == "traceEvents":
                    self._i += 1
                    self._events_seen = True
                    yield from self._items()
                else:
                    self.top[key] = self._value()
            if self._skip() == "":
                self._stop(self.problem or "the file ends before the JSON object closes")
        except _Stopped:
            pass
        except _Cut:
            self._stop(f"the file ends inside traceEvents, after {self.items:,} events"
                       if self._events_seen else "the file ends before the JSON object closes")
        except ValueError as exc:
            if not self._events_seen and not self.items:
                raise KinetoError(f"{self.path}: not a torch.profiler export (not valid JSON: "
                                  f"{exc})") from None
            self._stop(f"not valid JSON after {self.items:,} events ({exc})")
        if not self._events_seen and self.problem is None:
            raise KinetoError(f"{self.path}: not a torch.profiler export (no traceEvents list)")

    def _items(self) -> Iterator[Any]:
        scan, space = _SCAN_ONCE, cast(_Spaces, _SPACE_COMMA.match)
        while True:
            # NOTE: the fast path, events whole inside the buffer, on locals: it runs once per
            # event, and the calls it saves are a third of the reading time
            buf, i, count = self._buf, self._i, 0
            end = len(buf)
            try:
                while True:
                    i = space(buf, i).end()
                    if i >= end or buf[i] == "]":
                        break
                    item, i = scan(buf, i)
                    count += 1
                    yield item
            except (StopIteration, ValueError):
                pass                          # cut at the buffer's end, or not JSON: below
            finally:
                self._i = i
                self.items += count
            c = self._skip(_SPACE_COMMA)
            if c == "]":
                self._i += 1
                return
            if c == "":
                self._stop(self.problem or f"the file ends inside traceEvents, after "
                           f"{self.items:,} events")
                raise _Stopped()
            item = self._value()
            self.items += 1
            yield item


class _Gunzip:
    """A .gz file read a chunk at a time, giving every byte it can decompress: a file cut short
    yields all it holds, then EOFError (gzip.GzipFile drops the last chunk's bytes with it)."""

    def __init__(self, path: str):
        self._raw = open(path, "rb")
        self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._fed = False            # the current member has had input
        self._cut = False            # the file ended inside a member: EOFError next
        self._end = False

    def read(self, n: int) -> bytes:
        if self._cut:
            raise EOFError("the file ends before its compressed stream does")
        out, size = [], 0
        while size < n and not self._end:
            data = self._z.unconsumed_tail or self._raw.read(1 << 16)
            if not data:
                self._end = True
                self._cut = self._fed             # ended inside a member
                break
            self._fed = True
            piece = self._z.decompress(data, n - size)
            out.append(piece)
            size += len(piece)
            if self._z.eof:                       # a member ended: another may follow
                rest = self._z.unused_data
                self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._fed = False
                if rest:
                    self._raw.seek(-len(rest), 1)
        if not out and self._cut:
            raise EOFError("the file ends before its compressed stream does")
        return b"".join(out)

    def close(self) -> None:
        self._raw.close()


class _Stopped(Exception):
    """Reading stopped early; ``problem`` says why."""


class _Cut(Exception):
    """The file ends inside a value."""


def _incomplete(exc: json.JSONDecodeError, end: int) -> bool:
    """Whether a decoding error may only mean the buffer ends too soon (read more), rather
    than text that is not JSON."""
    if exc.msg.startswith("Unterminated string"):
        return True
    return exc.pos >= end - 16         # a token cut at the end: 'tru', '-Infinit', '12.'


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:120]
