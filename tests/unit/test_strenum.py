"""The closed sets of words are str Enums whose members write as the plain strings they replaced:
in JSON (values and keys), str(), format() with a spec, %-formatting, pyarrow columns, and as
ties in the report's orderings. Stored codes keep their order: the expected words and codes are
docs/trace-format.md's tables, not the program's own tuples."""
from __future__ import annotations

import json

import pyarrow as pa

from tracer.files.format import MEMORY_CATEGORIES, MEMORY_KINDS, MemoryCategory, MemoryKind
from tracer.vocab.labels import PHASE_CODES, PHASES, PassSource, Phase
from tracer.vocab.outcomes import FailureKind, RankStatus, TraceStatus
from viz.analysis.callgraphs.callgraph import NodeType
from viz.analysis.crossrank.critical_path import SegmentKind
from viz.analysis.crossrank.dimensions import DimensionSource
from viz.analysis.crossrank.matching import MismatchKind
from viz.analysis.memory.live_bytes import Scope
from viz.analysis.run_analysis import RankVerdict
from viz.analysis.timeline.lanes import Clock
from viz.views.pages import _summarise

ENUMS = (Phase, PassSource, MemoryKind, MemoryCategory, Scope, Clock, MismatchKind, SegmentKind,
         DimensionSource, RankVerdict, NodeType, FailureKind, RankStatus, TraceStatus)


def test_stored_codes_keep_their_words_and_order():
    # docs/trace-format.md: the phase column's codes, mem_kind's and mem_category's
    assert PHASES == ("other", "forward", "backward", "recompute", "grad_sync", "optimizer")
    assert MEMORY_KINDS == ("alloc", "free", "reclass")
    assert MEMORY_CATEGORIES == ("temporaries", "comm", "activations", "optimizer_state",
                                 "gradients", "parameters")
    assert PHASE_CODES["grad_sync"] == 4 and PHASE_CODES[Phase.GRAD_SYNC] == 4


def test_every_member_writes_as_its_plain_string():
    for enum in ENUMS:
        for member in enum:
            word = member.value
            assert type(word) is str and member == word and hash(member) == hash(word)
            assert json.dumps({member: [member]}) == json.dumps({word: [word]})
            assert json.dumps([member], indent=1, sort_keys=True) == json.dumps([word], indent=1)
            assert str(member) == word and type(str(member)) is str
            assert f"{member}|{member:>20}|{member:.3}" == f"{word}|{word:>20}|{word:.3}"
            assert "%s %-12s" % (member, member) == "%s %-12s" % (word, word)
            assert "{} {!s}".format(member, member) == f"{word} {word}"
            assert pa.array([member]).equals(pa.array([word]))


def test_report_line_ties_order_as_plain_strings():
    """A source line's ops with equal counts are ordered by their (op, phase) text; a phase
    read as a pass's name from the trace is a plain string, one decoded from the phase column a
    member: mixed, they order as they did when both were strings (backward before forward)."""
    class W:
        ops, time_ns = 64, 0.0

    entries = {("permute", "forward"): W(), ("permute", Phase.BACKWARD): W()}
    assert _summarise(entries, lambda k, w: str(k[1])) == ["backward", "forward"]
