"""CommDebugMode's collective counts, whole or section by section, for the test scripts that
compare paratrace's phases with what torch counts in the same run."""
from torch.distributed.tensor.debug import CommDebugMode


def counts(mode: CommDebugMode) -> dict:
    """Collective name (``all_gather_into_tensor``...) -> calls so far."""
    return {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}


class Sections:
    """CommDebugMode's counts between consecutive calls of :meth:`done`."""

    def __init__(self, mode):
        self.mode, self.seen, self.debug = mode, {}, {}

    def done(self, name: str) -> None:
        now = counts(self.mode)
        self.debug[name] = {k: v - self.seen.get(k, 0) for k, v in now.items()
                            if v - self.seen.get(k, 0)}
        self.seen = now
