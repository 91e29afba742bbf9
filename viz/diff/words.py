"""What changed in communication, said in plain words.

Counts say that 6 all-reduces went and 6 reduce-scatters and 6 all-gathers came; a reader
wants "the gradient all-reduce over the DP group became reduce-scatter + all-gather (same
bytes)". :func:`describe` reads one scope's communication changes (per kind, phase and group,
the group named by its grid axes) and the modules that issue them, and tells:

- a kind that went (or fell) replaced by kinds that came over the same group moving as many
  bytes: "became" (bytes as nccl-tests' bus bytes count them: ZeRO's reduce-scatter +
  all-gather move what the all-reduce moved, so do sequence parallelism's);
- kinds that came over a group with nothing gone: "appear", with where (module paths with
  layer indices folded: ``GPTChunk.blocks.*.mlp``);
- P2P that came over a group that is not the pipeline: "a ring of P2P";
- kinds that went or fell otherwise: "disappear"; that came to another group as often:
  "moved";
- any other kind that changed: "rise" (more calls), "carry" (other bytes) or "change phase"
  (the same calls elsewhere in the step), so every kind that differs is named (FSDP's
  all-gathers beside DDP's one at setup, too).
"""
from __future__ import annotations

import re
from collections import defaultdict

from ..analysis.callgraphs.module_tree import NO_MODULE
from ..analysis.crossrank.matching import bus_factor, collective_size
from .result import ScopeDiff

_PLURAL = {"all_reduce": "all-reduces", "all_gather": "all-gathers",
           "reduce_scatter": "reduce-scatters", "all_to_all": "all-to-alls",
           "broadcast": "broadcasts", "send": "sends", "recv": "receives",
           "barrier": "barriers", "reduce": "reduces", "gather": "gathers",
           "scatter": "scatters"}
_P2P = ("send", "recv")


def _name(kind: str) -> str:
    return kind.replace("_", "-")


def _fold(module: str) -> str:
    """Layer indices folded: ``GPTChunk.blocks.3.mlp.fc1`` -> ``GPTChunk.blocks.*.mlp.fc1``."""
    return re.sub(r"\.\d+(?=\.|$)", ".*", module)


def _where(scope: ScopeDiff, kinds: set, side: str) -> str:
    """The modules (folded, shallowest first) issuing ``kinds`` on ``side`` ('a' or 'b') more
    than on the other side."""
    found = set()
    for (module, kind, _), va, vb in scope.module_comm:
        grew = vb > va if side == "b" else va > vb
        if kind in kinds and grew and module != NO_MODULE:
            found.add(_fold(module))
    if not found:
        return ""
    shallow = sorted(found, key=lambda m: (m.count("."), m))
    # keep the outermost of nested paths: GPTChunk.blocks.*.mlp covers its .fc1
    outer = [m for m in shallow if not any(m.startswith(o + ".") for o in shallow if o != m)]
    return " in " + ", ".join(outer[:3]) + (" and others" if len(outer) > 3 else "")


def _size(group: str) -> int:
    match = re.search(r"group of (\d+)$", group)
    return int(match.group(1)) if match else 0


def _moved(kind: str, nbytes: int, n: int) -> float:
    """Bytes a rank moves over the network for what it handed in, as nccl-tests' bus
    bandwidth counts them (a ring): all-reduce 2(n-1)/n S, the others (n-1)/n S."""
    return collective_size(kind, nbytes, n) * bus_factor(kind, n) if n else nbytes


def _moved_between_groups(by_group: dict) -> list:
    """A kind that left one group and came to another as often: it moved (DP to DP x CP).
    Both entries are taken out of ``by_group``."""
    out = []
    for src in sorted(by_group):
        for kind, f in list(by_group[src].items()):
            if not (f[0] > 0 and f[1] == 0):
                continue
            for dst in sorted(by_group):
                g = by_group[dst].get(kind)
                if dst != src and g is not None and g[0] == 0 and g[1] == f[0]:
                    out.append(f"the {_PLURAL.get(kind, kind)} moved from the {src} to the "
                               f"{dst} ({f[0]})")
                    del by_group[src][kind], by_group[dst][kind]
                    break
    return out


def describe(scope: ScopeDiff) -> list:
    """Plain sentences for the communication changes of ``scope`` (A -> B): every kind that
    appears, disappears or changes on a group gets one (or shares one)."""
    by_group = defaultdict(lambda: defaultdict(lambda: [0, 0, 0, 0]))  # group -> kind -> figs
    phases = defaultdict(dict)           # (group, kind) -> phase -> (A calls, B calls)
    for (kind, phase, group), ca, cb, ba, bb in scope.comm:
        figs = by_group[group][kind]
        figs[0] += ca
        figs[1] += cb
        figs[2] += ba
        figs[3] += bb
        phases[(group, kind)][phase] = (ca, cb)
    sentences = _moved_between_groups(by_group)
    for group in sorted(by_group):
        kinds = by_group[group]
        told, said = _replaced(scope, group, kinds)
        sentences += said
        gone = {k for k, f in kinds.items() if f[0] > 0 and f[1] == 0}
        fell = {k for k, f in kinds.items() if f[1] < f[0]} - told
        came = {k for k, f in kinds.items() if f[0] == 0 and f[1] > 0} - told
        p2p = came & set(_P2P)
        if p2p and not group.startswith("pp"):
            sends = kinds.get("send", [0, 0])[1]
            sentences.append(f"a ring of P2P appears over the {group}{_where(scope, p2p, 'b')} "
                             f"({sends} sends)")
            came -= p2p
        for kind in sorted(came):
            sentences.append(f"{_PLURAL.get(kind, kind)} appear over the {group}"
                             f"{_where(scope, {kind}, 'b')} ({kinds[kind][1]})")
        for kind in sorted(fell):
            f = kinds[kind]
            what = _PLURAL.get(kind, kind) if kind in gone else \
                f"{f[0] - f[1]} of the {f[0]} {_PLURAL.get(kind, kind)}"
            sentences.append(f"{what} over the {group} disappear{_where(scope, {kind}, 'a')}"
                             + (f" ({f[0]})" if kind in gone else ""))
        for kind in sorted(set(kinds) - told - came - fell - p2p):
            sentences.append(_changed(kind, group, kinds[kind], phases[(group, kind)], scope))
    return sentences


def _replaced(scope: ScopeDiff, group: str, kinds: dict) -> tuple:
    """(kinds told, [the sentence]) when kinds that fell on ``group`` were replaced by kinds
    that rose there: an all-reduce split into its two halves (ZeRO, FSDP, sequence
    parallelism), or as many bytes moved (within a tenth)."""
    fell = {k for k, f in kinds.items() if f[1] < f[0]}
    rose = sorted(k for k, f in kinds.items() if f[1] > f[0] and k not in _P2P)
    split = "all_reduce" in fell and {"reduce_scatter", "all_gather"} <= set(rose)
    if split:
        fell = {"all_reduce"}       # the others that fell are said apart
    n = _size(group)
    before = sum(_moved(k, kinds[k][2] - kinds[k][3], n) for k in fell)
    after = sum(_moved(k, kinds[k][3] - kinds[k][2], n) for k in rose)
    if not (fell and rose and before and (split or abs(after / before - 1) <= 0.1)):
        return set(), []
    bytes_text = "the same traffic" if abs(after / before - 1) < 0.01 else \
        f"{after / before:.2g}x the traffic"
    what = "the " + " + ".join(_name(k) for k in sorted(fell))
    if any(kinds[k][1] for k in fell):
        what = " + ".join(f"{kinds[k][0] - kinds[k][1]} of the {kinds[k][0]} "
                          f"{_PLURAL.get(k, k)}" for k in sorted(fell))
    return fell | set(rose), [f"{what} over the {group} became "
                              f"{' + '.join(_name(k) for k in rose)} "
                              f"({bytes_text}){_where(scope, set(rose), 'b')}"]


def _changed(kind: str, group: str, figs: list, phases: dict, scope: ScopeDiff) -> str:
    """A kind on ``group`` that neither appeared nor disappeared: more calls, other bytes, or
    the same calls in other phases."""
    name = _PLURAL.get(kind, kind)
    a, b, bytes_a, bytes_b = figs
    if b > a:
        return f"{name} over the {group} rise from {a} to {b}{_where(scope, {kind}, 'b')}"
    if bytes_a != bytes_b:
        ratio = f"{bytes_b / bytes_a:.2g}x" if bytes_a else "more"
        return f"{name} over the {group} carry {ratio} the bytes ({a} calls in each run)"
    moves = ", ".join(f"{phase} {ca} -> {cb}" for phase, (ca, cb) in sorted(phases.items())
                      if ca != cb)
    return f"{name} over the {group} change phase ({moves})"
