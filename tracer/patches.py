"""Attributes of torch replaced while recording, and put back when the trace ends."""
from __future__ import annotations


class Patches:
    """Attributes replaced, to put back in reverse order."""

    def __init__(self):
        self._done: list = []

    def wrap(self, owner, name: str, make) -> None:
        """Replace ``owner.name`` with ``make(original)``; nothing when there is none."""
        if owner is None or not callable(getattr(owner, name, None)):
            return
        own = name in vars(owner)           # else inherited: undo removes the override
        original = vars(owner)[name] if own else getattr(owner, name)
        setattr(owner, name, make(original))
        self._done.append((owner, name, original, own))

    def undo(self) -> None:
        while self._done:
            owner, name, original, own = self._done.pop()
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
