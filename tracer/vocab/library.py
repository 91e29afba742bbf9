"""Which recorded code is *library* and which is the user's (docs/trace-run.md#library-code).

A stack keeps the user's frames and, at its inner end, the boundary call into a library
(tracer.recorder.attribution.stacks); the report draws the user's frames and collapses the
library's. The code users come to see often lives in site-packages (transformers'
``modeling_gpt2.py``, Lightning's modules, torchtitan), so by default only these are library:

- torch (its distribution's packages: ``torch``, ``functorch``, ``torchgen``);
- the Python standard library (its directory, without site-packages), and generated or frozen
  code (``<string>``, ``<frozen ...>``);
- paratrace itself.

Everything else, installed or not, is the user's. A list of specs changes that (``trace-run
--library`` / ``--no-library``, ``tracer.trace(library=...)``): ``NAME`` makes an installed
package library (``accelerate``), ``-NAME`` makes it the user's (``-torch``: record torch's own
frames as the user's), and ``site-packages`` (``-site-packages``) every installed package, as
before this rule; later specs refine earlier ones, and a package named explicitly beats
``site-packages``. The rule is a list of directories and files: the longest prefix of a file's
path decides. The trace keeps it in its metadata (``library``), so the report classifies the
recorded frames as the recorder did. Torch-free: viz reads traces without torch.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from typing import Any, Iterable, Optional

DEFAULT_PACKAGES = ("torch", "functorch", "torchgen")
SITE_PACKAGES = "site-packages"
META_KEY = "library"

# the directory paratrace's packages are imported from (tracer/vocab/library.py is 3 below)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PARATRACE = tuple(os.path.join(ROOT, d) + os.sep for d in ("tracer", "instrument", "viz"))


class LibrarySpecError(ValueError):
    """A library spec naming nothing installed."""


def parse_specs(specs: Iterable[str]) -> list[tuple[str, bool]]:
    """``["accelerate", "-transformers,-torch"]`` -> ``[("accelerate", True), ("transformers",
    False), ("torch", False)]`` (comma lists allowed); raises LibrarySpecError on an empty name."""
    out = []
    for spec in specs:
        for part in str(spec).split(","):
            part = part.strip()
            name, library = (part[1:], False) if part.startswith("-") else (part, True)
            if not name or not all(p.isidentifier() for p in name.split(".")) and \
                    name != SITE_PACKAGES:
                raise LibrarySpecError(f"bad library spec {part!r}: give a package name "
                                       f"(accelerate), -NAME to make it the user's, or "
                                       f"{SITE_PACKAGES}")
            out.append((name, library))
    return out


def package_roots(name: str) -> tuple[tuple[str, ...], ...]:
    """The directories (with a trailing separator) or the file of installed package ``name``,
    found without importing it; raises LibrarySpecError if nothing is installed under it."""
    if name == SITE_PACKAGES:
        return site_packages()
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise LibrarySpecError(f"no installed package named {name!r}")
    if spec.submodule_search_locations:
        return tuple(_variants(p, directory=True) for p in spec.submodule_search_locations)
    if spec.origin and os.path.isabs(spec.origin):
        return (_variants(spec.origin, directory=False),)
    return ()                                # built into the interpreter: no file to match


def site_packages() -> tuple[tuple[str, ...], ...]:
    dirs = {sysconfig.get_paths().get(k) for k in ("purelib", "platlib")}
    dirs |= {p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)}
    return tuple(_variants(d, directory=True) for d in sorted(d for d in dirs if d))


def _variants(path: str, directory: bool) -> tuple[str, ...]:
    """A path as code objects may name it (abspath, realpath), as prefixes."""
    tail = os.sep if directory else ""
    return tuple(sorted({os.path.abspath(path) + tail, os.path.realpath(path) + tail}))


class LibraryRule:
    """The library / user rule of one recording: :meth:`is_library` on a file path."""

    def __init__(self, library: Iterable[str], user: Iterable[str],
                 specs: Optional[list[str]] = None):
        self.library = tuple(sorted(set(library)))
        self.user = tuple(sorted(set(user) - set(self.library)))
        self.specs = list(specs or [])
        # longest first; a tie (the same directory on both lists) cannot happen (above)
        self._prefixes = sorted([(p, True) for p in self.library] +
                                [(p, False) for p in self.user],
                                key=lambda item: len(item[0]), reverse=True)
        self._known: dict[str, bool] = {}    # path -> library? (viz asks per recorded frame)

    @classmethod
    def build(cls, specs: Iterable[str] = (), user_paths: Iterable[str] = (),
              always_user: Iterable[str] = ()) -> LibraryRule:
        """The rule for ``specs`` (see the module's doc) on this interpreter; ``user_paths``
        (and ``always_user``, paratrace's sample_runs) are the user's whatever the specs say."""
        parsed = parse_specs(specs)
        stdlib = {_variants(sysconfig.get_paths()[k], directory=True)
                  for k in ("stdlib", "platstdlib") if sysconfig.get_paths().get(k)}
        library = {p for v in stdlib for p in v} | set(_PARATRACE)
        user = {p for v in site_packages() for p in v}
        chosen: dict[str, bool] = {}         # package -> library?, the last spec wins
        for name in DEFAULT_PACKAGES:
            chosen[name] = True
        for name, is_lib in parsed:
            chosen.pop(name, None)
            chosen[name] = is_lib
        for name, is_lib in chosen.items():
            try:
                roots = package_roots(name)
            except LibrarySpecError:
                if name in DEFAULT_PACKAGES and (name, is_lib) not in parsed:
                    continue                   # torch's optional packages may be absent
                raise
            paths = {p for v in roots for p in v}
            if name == SITE_PACKAGES:          # the directories: a named package still wins
                (library if is_lib else user).update(paths)
                (user if is_lib else library).difference_update(paths)
                continue
            (library if is_lib else user).update(paths)
        named = {os.path.abspath(p) + os.sep for p in (*user_paths, *always_user)}
        user |= named
        library -= named
        return cls(library, user, [f"{'' if lib else '-'}{name}" for name, lib in parsed])

    def is_library(self, path: str) -> bool:
        known = self._known.get(path)
        if known is None:
            known = self._known[path] = self._decide(path)
        return known

    def _decide(self, path: str) -> bool:
        if path.startswith("<"):
            return True                        # generated or frozen code
        for prefix, library in self._prefixes:
            if path == prefix or path.startswith(prefix) and prefix.endswith(os.sep):
                return library
        return False

    def meta(self) -> dict[str, list[str]]:
        """The trace's ``library`` metadata: the specs as given, and the rule's paths."""
        return {"specs": self.specs, "library": list(self.library), "user": list(self.user)}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Optional[LibraryRule]:
        """The rule a trace recorded with, or None (a trace from before the rule existed)."""
        rule = meta.get(META_KEY) if isinstance(meta, dict) else None
        if not isinstance(rule, dict) or not isinstance(rule.get("library"), list) or \
                not isinstance(rule.get("user"), list):
            return None
        return cls([p for p in rule["library"] if isinstance(p, str)],
                   [p for p in rule["user"] if isinstance(p, str)],
                   [s for s in rule.get("specs") or [] if isinstance(s, str)])
