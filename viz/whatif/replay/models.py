"""Models fitted on a recording, each saying how well it describes the recording it came from.

- :class:`LinkModel`: a P2P message's transfer time, alpha + beta x bytes, fitted on the
  recorded sends matched with their receives;
- :class:`CollectiveModel`: a collective's transfer time (from the last member's arrival to the
  completion), alpha + beta x bytes per (kind, group size), fitted on the recording's matched
  collectives; a (kind, size) the recording lacks is derived from what it has, by the ring
  algorithm's step counts and bus factors (nccl-tests' ``busbw``), and says so; on gloo a
  reduce-scatter is what ProcessGroupGloo runs, an all-reduce of its whole input;
- :class:`OpCostModel`: an op's time against its work (FLOPs where :mod:`viz.analysis.callgraphs.flops` has a
  formula, else the elements of its largest input), a + b x work per op kind, fitted on the
  recording's op groups (count-weighted).

Each fit keeps its samples' count and its error over them (:attr:`Fit.error`): the sum of
``|model - measured|`` over the samples divided by the sum of ``measured``, so a model that
misses the long samples counts more than one that misses the short ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ...analysis.callgraphs.flops import flops as op_flops, parse_shapes, base_name

RING_KINDS = ("all_reduce", "all_gather", "reduce_scatter")   # the ring's step counts apply
# A fit over fewer samples is named so where a derived kind leans on it: a pp 2 recording's one
# tied-embedding all-reduce a step (5 in a benchmark run) fitted 1.0 to 2.1 ms over six runs
FEW_SAMPLES = 20


@dataclass(frozen=True)
class Fit:
    """time = alpha + beta * x, fitted on ``samples`` points (weighted)."""

    alpha: float
    beta: float
    samples: int
    error: Optional[float]          # time-weighted mean |model - measured| / measured

    def __call__(self, x: float) -> float:
        return max(self.alpha + self.beta * x, 0.0)

    def describe(self, unit: str) -> str:
        err = "n/a" if self.error is None else f"{100 * self.error:.0f}%"
        return (f"{self.alpha / 1e3:.1f} us + {self.beta:.3g} ns/{unit}, {self.samples} "
                f"samples, {err} mean error on them")


def fit_line(x, y, w=None) -> Fit:
    """Weighted least squares of y = alpha + beta x (beta >= 0; one distinct x: the mean)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    w = np.ones_like(x) if w is None else np.asarray(w, float)
    if not len(x):
        return Fit(0.0, 0.0, 0, None)
    mean_x, mean_y = np.average(x, weights=w), np.average(y, weights=w)
    spread = np.average((x - mean_x) ** 2, weights=w)
    beta = np.average((x - mean_x) * (y - mean_y), weights=w) / spread if spread > 0 else 0.0
    if beta < 0:              # more bytes never cost less: the mean is the better model
        beta = 0.0
    alpha = mean_y - beta * mean_x
    model = alpha + beta * x
    total = float((w * y).sum())
    error = float((w * np.abs(model - y)).sum() / total) if total > 0 else None
    return Fit(float(alpha), float(beta), int(len(x)), error)


def ring_steps(kind: str, n: int) -> float:
    """Latency steps of the ring algorithm over n ranks."""
    return 2.0 * (n - 1) if kind == "all_reduce" else float(n - 1)


def ring_volume(kind: str, n: int) -> float:
    """Bytes each rank moves per byte it hands in (nccl-tests' bus factor, all_gather's
    relative to the shard it hands in)."""
    if n < 2:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind == "all_gather":
        return float(n - 1)
    return (n - 1) / n


@dataclass
class LinkModel:
    """A P2P message's transfer time from its size."""

    fit: Fit

    @classmethod
    def from_graph(cls, graph) -> "LinkModel":
        samples = [(c.nbytes, c.transfer[c.dst]) for c in graph.comms
                   if c.kind == "p2p" and len(c.members) == 2]
        return cls(fit_line([b for b, _ in samples], [t for _, t in samples]))

    def __call__(self, nbytes: int) -> float:
        return self.fit(nbytes)

    def describe(self) -> str:
        return f"P2P link: {self.fit.describe('byte')}"


@dataclass
class CollectiveModel:
    """A collective's transfer time per (kind, group size), and the link model for what the
    recording has no collective of."""

    fits: dict                       # (kind, n) -> Fit
    link: LinkModel
    jitters: dict = None             # (kind, n, role) -> mean jitter (ns) of its prompt ones
    backend: Optional[str] = None    # the recording's, when every rank had the same

    @classmethod
    def from_graph(cls, graph, link: LinkModel, backend: Optional[str] = None,
                   role_of: Optional[Callable] = None) -> "CollectiveModel":
        """Fitted on the matched collectives some member waited for (a completion no one
        waited for may have been reported late: viz.whatif.replay.waits), each taken from its last
        member's launch to the earliest completion; their jitter (:func:`jitter`) apart, per
        role (``role_of(comm)``: tp, dp, embedding, ...): how late the last member comes
        depends on what the members did before, a gradient bucket launched amid a backward
        (milliseconds) or a blocking TP collective a few ops after the last (microseconds)."""
        extra = jitter(graph.comms)
        samples: dict = {}
        noise: dict = {}
        for cid, c in enumerate(graph.comms):
            if c.kind == "p2p" or len(c.members) < 2 or c.kind == "barrier":
                continue
            key = (c.kind, len(c.group))
            samples.setdefault(key, []).append((c.nbytes, min(c.transfer.values()), c.waited))
            if cid in extra:
                role = role_of(c) if role_of is not None else None
                noise.setdefault(key + (role,), []).append(extra[cid])
        samples = {key: [(b, t) for b, t, w in s if w] or [(b, t) for b, t, _ in s]
                   for key, s in samples.items()}
        fits = {key: fit_line([b for b, _ in s], [t for _, t in s])
                for key, s in sorted(samples.items())}
        return cls(fits, link, {key: float(np.mean(v)) for key, v in noise.items()}, backend)

    def time(self, kind: str, n: int, nbytes: int, role: Optional[str] = None) -> tuple:
        """(ns, how: None when fitted on this very kind and size, else a sentence); the
        jitter of the recorded collectives of this kind, size and ``role`` is added."""
        if n < 2:
            return 0.0, None
        if (kind, n) in self.fits:
            extra = (self.jitters or {}).get((kind, n, role), 0.0)
            return self.fits[(kind, n)](nbytes) + extra, None
        if kind == "reduce_scatter" and self.backend == "gloo":
            # ProcessGroupGloo.reduce_scatter_tensor_coalesced all-reduces a clone of the whole
            # input and copies the rank's chunk out: its time is that all-reduce's (without
            # the all-reduces' jitter, which belongs to where they ran, as for any derived kind)
            if ("all_reduce", n) in self.fits:
                ns, how = self.fits[("all_reduce", n)](nbytes), None
            else:
                ns, how = self.time("all_reduce", n, nbytes)
            return ns, (f"reduce_scatter over {n} ranks: gloo runs it as an all_reduce of its "
                        "input; " + (how or f"from the all_reduce fit over {n} ranks"
                                     f"{self._few(('all_reduce', n))}"))
        same_kind = sorted((k for k in self.fits if k[0] == kind), key=lambda k: abs(k[1] - n))
        if same_kind:
            return self._rescaled(same_kind[0], kind, n, nbytes), (
                f"{kind} over {n} ranks: from the {kind} fit over {same_kind[0][1]} ranks"
                f"{self._few(same_kind[0])}, scaled by the ring's steps and bus factor")
        others = sorted(self.fits, key=lambda k: (k[0] not in RING_KINDS,
                                                  abs(k[1] - n)))
        if others:
            base = others[0]
            return self._rescaled(base, kind, n, nbytes), (
                f"{kind} over {n} ranks: no {kind} recorded; from the {base[0]} fit over "
                f"{base[1]} ranks{self._few(base)}, scaled by the ring's steps and bus factors")
        if self.link.fit.samples:
            # a ring of n-1 (twice for all-reduce) P2P steps of the per-step chunk
            chunk = nbytes * ring_volume(kind, n) / max(ring_steps(kind, n), 1)
            return ring_steps(kind, n) * self.link(chunk), (
                f"{kind} over {n} ranks: no collective recorded; as a ring of P2P messages "
                "on the fitted link")
        raise ValueError(f"no communication recorded to model a {kind} over {n} ranks from")

    def _few(self, key: tuple) -> str:
        """Words for a fit that rests on few samples, when a derivation leans on it."""
        samples = self.fits[key].samples
        return f" ({samples} samples only)" if samples < FEW_SAMPLES else ""

    def _rescaled(self, base: tuple, kind: str, n: int, nbytes: int) -> float:
        fit = self.fits[base]
        ran = "all_reduce" if base[0] == "reduce_scatter" and self.backend == "gloo" else base[0]
        steps = ring_steps(kind, n) / max(ring_steps(ran, base[1]), 1)
        volume = ring_volume(kind, n) / max(ring_volume(ran, base[1]), 1e-12)
        return max(fit.alpha * steps + fit.beta * nbytes * volume, 0.0)

    def describe(self) -> list:
        jitters = self.jitters or {}

        def noise(kind, n):
            found = [f"{j / 1e3:.1f} us" + (f" ({role})" if role else "")
                     for (k, m, role), j in sorted(jitters.items(), key=str)
                     if (k, m) == (kind, n)]
            return f"; jitter {', '.join(found)}" if found else ""
        return [f"{kind} over {n} ranks: {fit.describe('byte')}{noise(kind, n)}"
                for (kind, n), fit in self.fits.items()]


def jitter(comms: list) -> dict:
    """comm id -> how much later its last member launched than a simulation would have it
    (added, as the mean over a kind and group size, to the predictions of that very kind
    and size; a kind derived from another's fit has none).

    A simulation gives each rank its own mean work, so a rank that is steadily late (a
    slower stage, a slower process) is late there too; what it cannot have is the noise of
    each collective: the last member's lateness over the members' mean launch, less the
    lateness the steadiest-late member has on average over its group's collectives. Only for
    collectives waited for in the part (pass, or the work around passes) that launched them:
    a gradient bucket launched in a backward and waited for after it hides the lateness. On a
    TP run, with dozens of blocking collectives a pass, that noise sets the pace."""
    by_group: dict = {}
    for cid, c in enumerate(comms):
        if c.lateness and c.prompt:
            by_group.setdefault(c.group, []).append(cid)
    out = {}
    for group, ids in by_group.items():
        steady = {}
        for cid in ids:
            for r, late in comms[cid].lateness.items():
                steady.setdefault(r, []).append(late)
        baseline = max(sum(v) / len(v) for v in steady.values())
        for cid in ids:
            out[cid] = max(max(comms[cid].lateness.values()) - baseline, 0.0)
    return out


def work_of(op: str, shapes: Optional[str]) -> float:
    """An op's work: its FLOPs (viz.analysis.callgraphs.flops) where a formula applies, else the elements of
    its largest input tensor."""
    f = op_flops(op, shapes)
    if f:
        return float(f)
    largest = 0
    for arg in parse_shapes(shapes):
        for shape in (arg if isinstance(arg, list) else [arg]):
            if isinstance(shape, tuple):
                largest = max(largest, int(np.prod(shape)) if shape else 1)
    return float(largest)


@dataclass
class OpCostModel:
    """Time of one call of an op against its work, per op kind (``aten.mm`` -> ``mm``)."""

    fits: dict                       # base op name -> Fit
    overall: Optional[float]         # time-weighted mean error over every group

    @classmethod
    def from_groups(cls, groups: list) -> "OpCostModel":
        """Fit on op groups (viz.analysis.callgraphs.op_groups.OpGroup: op, shapes, count, time_ns) of
        compute ops."""
        by_kind: dict = {}
        for g in groups:
            if g.kind is None and g.count > 0 and g.time_ns > 0:
                by_kind.setdefault(base_name(g.op), []).append(
                    (work_of(g.op, g.shapes), g.time_ns / g.count, g.count))
        fits = {k: fit_line([w for w, _, _ in s], [t for _, t, _ in s], [n for _, _, n in s])
                for k, s in sorted(by_kind.items())}
        miss = total = 0.0
        for k, s in by_kind.items():
            for w, t, n in s:
                miss += n * abs(fits[k](w) - t)
                total += n * t
        return cls(fits, miss / total if total > 0 else None)

    def ratio(self, op: str, work: float, new_work: float) -> float:
        """How much longer a call takes with ``new_work`` instead of ``work`` (1 for an op kind
        the model does not know)."""
        fit = self.fits.get(base_name(op))
        if fit is None or fit(work) <= 0:
            return 1.0
        return fit(new_work) / fit(work)

    def describe(self) -> str:
        err = "n/a" if self.overall is None else f"{100 * self.overall:.0f}%"
        sized = sum(1 for f in self.fits.values() if f.beta > 0)
        return (f"time against work per op kind: {len(self.fits)} kinds ({sized} with a "
                f"size term), {err} time-weighted mean error over the recorded op groups")
