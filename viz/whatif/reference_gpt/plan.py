"""What each rank of a target configuration does in a step, from a studied recording
(:mod:`viz.whatif.reference_gpt.recording`), and the assumptions that took.

Each target rank takes its parts from a *source*: the recorded rank at the same place of the
grid (its pipeline rank, TP and DP indices folded onto the recorded degrees); when the pipeline
layout changes, the first and last stages take the recorded first and last stages' work
outside passes, and the middle ones a middle stage's (else the nearer end's). Then:

- passes: the source's mean compute per (kind, chunk) while the pipeline layout and the TP
  shard stay; else the part model (:mod:`viz.whatif.reference_gpt.costs`): the chunk's layers, plus
  the embedding or the head; a TP change scales each part by the op-cost model; ZB-H1's W is the
  weight-gradient share of a layer's backward (measured where the recording had W passes);
- communication inside passes: the recorded TP collectives while the TP layout and the passes'
  kinds stay, else Megatron's (:func:`viz.whatif.reference_gpt.megatron.tp_calls`), blocking and
  spread over the pass; P2P between virtual stages by the schedule; the gradient buckets at their
  recorded places in the last backward while the parameters a rank holds stay, else at the places
  the reference GPT's bucketing gives them;
- after the last pass: the buckets' waits, then the source's compute (scaled by the
  parameters a rank holds, the optimizer's work), with the sequence-parallel and tied-embedding
  all-reduces where the recording's first one was and the loss all-reduce at the end.
"""
from __future__ import annotations

from typing import Optional

from tracer.vocab.ops import P2P_KINDS
from tracer.vocab.schedules import schedule_actions

from ...analysis.timeline.grid import Grid
from ..replay.compose import Body, Call, Programs, spread
from ..replay.graph import LAUNCH, PassKey, WAIT
from .anatomy import mean, mean_part
from .megatron import (BYTES, Shape, buckets, rank_params, role_of, roles, shape_of,
                       sp_grad_elements, tied_elements, tp_calls)
from .recording import Recording
from .targets import TargetError, changed
from .torch_plans import torch_order

LOSS_BYTES = 8                       # the reference GPT's float64 loss, all-reduced over DP


class Plan:
    """The programs of one target; :attr:`assumptions` says what they took for granted."""

    def __init__(self, rec: Recording, cfg: dict):
        if rec.grid is None:
            raise TargetError(f"the recorded config (tp {rec.config.get('tp')}, pp "
                              f"{rec.config.get('pp')}, dp {rec.config.get('dp')}) does not "
                              f"describe its world of {rec.world} ranks")
        missing = [r for r in range(rec.world) if r not in rec.anatomies]
        if missing:
            raise TargetError(f"rank(s) {missing} of the recording have no readable trace: a "
                              "prediction needs every rank's steps (only the replay can be "
                              "predicted)")
        self.rec, self.cfg = rec, cfg
        self.grid = Grid(tp=int(cfg["tp"]), dp=int(cfg["dp"]), pp=int(cfg["pp"]))
        self.shape: Optional[Shape] = shape_of(cfg)
        self.v = int(cfg.get("virtual_stages") or 1)
        self.m = int(cfg["microbatches"])
        self.m0 = int(rec.config.get("microbatches") or 1)
        self.has_w = cfg["schedule"] == "zb-h1"
        self.had_w = any(p.kind == "W" for a in rec.anatomies.values() for p in a.passes)
        self.same_layout = not changed(rec.config, cfg, "pp", "virtual_stages")
        self.same_tp = not changed(rec.config, cfg, "tp") and (
            int(cfg["tp"]) < 2 or not changed(rec.config, cfg, "sp"))
        # torch.distributed.pipelining's interleaved schedules follow their own plan
        self.torch_plans = cfg["schedule"] in ("interleaved", "zb-h1") and any(
            p.source in ("schedule", "record_function") for p in rec.graph.passes)
        self.assumptions: list = []
        self._noted: set = set()
        self.program = Programs(rec.graph.clock)
        self._bodies: dict = {}          # (rank, kind, chunk) -> (compute, idle, inner calls)
        self._message: Optional[tuple] = None

    # ------------------------------------------------------------------ the programs
    def build(self):
        """The target's ExecutionGraph."""
        if not any(a.passes for a in self.rec.anatomies.values()):
            raise TargetError("the recording has no F/B passes (annotations or pipelining "
                              "labels): only its replay can be predicted")
        if not (self.same_layout and self.same_tp) and (self.rec.costs is None
                                                        or self.shape is None):
            raise TargetError("re-splitting the layers needs the reference GPT's module paths "
                              "(GPTChunk.blocks.<layer>) and model sizes in the recording")
        for rank in range(self.grid.world):
            self._rank(rank)
        graph = self.program.graph
        graph.config = dict(self.cfg)
        graph.pipeline_groups = {r: self.grid.pipeline(r) if self.grid.pp > 1 else (r,)
                                 for r in range(self.grid.world)}
        return graph

    def _rank(self, rank: int) -> None:
        pp_i = self.grid.coords(rank)[3]
        src = self._source(rank)
        anat = self.rec.anatomies[src]
        plan = torch_order if self.torch_plans else schedule_actions
        order = plan(self.cfg["schedule"], stages=self.grid.pp, rank=pp_i,
                     microbatches=self.m, chunks=self.v)
        pre = mean_part(anat.pre)
        pre_body = Body(pre.compute * self.m / self.m0, pre.idle)
        after = mean([p.after.compute for p in anat.passes if p.after is not None] or [0.0])
        self.program.start(rank)
        for step in range(max(anat.steps, 1) + 1):
            self.program.step(rank, step)
            self.program.work(rank, pre_body)
            pending = []
            for i, action in enumerate(order):
                body = self._pass(rank, src, action, step)
                key = PassKey(rank, step, action.kind, action.microbatch, action.chunk)
                pending += self.program.work(rank, body, key)
                if i < len(order) - 1 and after >= 1:
                    self.program.work(rank, Body(after))
            for call, cid in pending:
                if call.role == "bucket":
                    self.program.wait(rank, cid)
            self.program.work(rank, self._post(rank, src))

    def _source(self, rank: int) -> int:
        tp_i, _, dp_i, pp_i = self.grid.coords(rank)
        g = self.rec.grid
        if self.same_layout:
            pp_src = pp_i
        elif pp_i == 0:
            pp_src = 0
        elif pp_i == self.grid.pp - 1:
            pp_src = g.pp - 1
        else:
            pp_src = 1 if g.pp > 2 else (0 if 2 * pp_i < self.grid.pp else g.pp - 1)
        return g.rank(tp_i % g.tp, 0, dp_i % g.dp, pp_src)

    def note(self, text: str) -> None:
        if text not in self._noted:
            self._noted.add(text)
            self.assumptions.append(text)

    # ------------------------------------------------------------------ passes
    def _pass(self, rank: int, src: int, action, step: int) -> Body:
        tp_i, _, dp_i, pp_i = self.grid.coords(rank)
        stages = self.grid.pp * self.v
        vs = action.chunk * self.grid.pp + pp_i
        kind, mb = action.kind, action.microbatch
        if (rank, kind, action.chunk) not in self._bodies:   # the same for every mb and step
            self._bodies[(rank, kind, action.chunk)] = self._compute(rank, src, kind,
                                                                     action.chunk, vs)
        compute, idle, inner = self._bodies[(rank, kind, action.chunk)]
        body = Body(compute, idle, list(inner))

        def peer(stage: int) -> tuple:
            return (self.grid.rank(tp_i, 0, dp_i, stage % self.grid.pp),)
        nbytes, ns = self._message_of()
        if kind == "F" and vs > 0:
            body.calls.insert(0, (0.0, Call("recv", peer(vs - 1), nbytes, ns, "pp",
                                            (step, "F", mb, vs, tp_i, dp_i), 0.0)))
        if kind == "B" and vs < stages - 1:
            body.calls.insert(0, (0.0, Call("recv", peer(vs + 1), nbytes, ns, "pp",
                                            (step, "B", mb, vs, tp_i, dp_i), 0.0)))
        if kind == "F" and vs < stages - 1:
            body.calls.append((compute, Call("send", peer(vs + 1), nbytes, ns, "pp",
                                             (step, "F", mb, vs + 1, tp_i, dp_i))))
        if kind == "B" and vs > 0:
            body.calls.append((compute, Call("send", peer(vs - 1), nbytes, ns, "pp",
                                             (step, "B", mb, vs - 1, tp_i, dp_i))))
        if mb == self.m - 1 and kind == ("W" if self.has_w else "B") and self.grid.dp > 1:
            body.calls += self._buckets(rank, src, action.chunk, compute)
        return body

    def _compute(self, rank: int, src: int, kind: str, chunk: int, vs: int) -> tuple:
        """(compute, idle, inner calls) of one pass of the target."""
        anat = self.rec.anatomies[src]
        shape = self.shape
        samples = anat.of(kind, chunk) if self.same_layout else []
        costs = self.rec.costs
        if self.same_layout and self.same_tp and self.has_w == self.had_w and samples:
            part = mean_part([p.body for p in samples], keep=lambda e: self._inner(e[2]))
            return part.compute, part.idle, self._recorded_calls(rank, src, part, False)
        first, last = vs == 0, vs == self.grid.pp * self.v - 1
        layers = shape.layers_of(vs) if shape is not None else range(0)
        base = "B" if kind == "W" else kind
        if self.same_layout and (anat.of(base, chunk) or anat.of(kind, chunk)):
            measured = mean_part([p.body for p in anat.of(base, chunk)])
            if self.had_w and base == "B":
                measured.compute = mean(p.body.compute for p in anat.of("B", chunk)) + \
                    mean([p.body.compute for p in anat.of("W", chunk)] or [0.0])
            compute = measured.compute * self._tp_ratio(base, len(layers), first, last)
            idle = measured.idle
            self.note("pass compute: each rank's measured mean per pass kind and chunk"
                      + ("" if self.same_tp else ", scaled by the op-cost model to the new "
                         "TP shard"))
        else:
            scale = costs.tp_scale(self.rec.ops, self.rec.shape, shape) if not self.same_tp \
                else None
            compute = costs.pass_compute(base, len(layers), first, last, scale)
            idle = mean([p.body.idle for a in self.rec.anatomies.values() for p in a.passes
                         if p.kind == base] or [0.0])
            self.note("pass compute from the recorded per-module compute: every transformer "
                      "layer costs the recorded mean, the embedding and the head as recorded"
                      + ("" if self.same_tp else ", each op scaled by the op-cost model to "
                         "its work on the new TP shard"))
        compute = self._split_w(kind, compute, len(layers), base)
        calls = spread(self._tp_calls(rank, kind, layers, first, last), compute)
        return compute, idle, calls

    def _split_w(self, kind: str, compute: float, layers: int, base: str) -> float:
        """The B or W share of a whole backward's compute under ZB-H1."""
        if base != "B" or not self.has_w:
            return compute
        costs = self.rec.costs
        if costs is None:
            raise TargetError("--schedule zb-h1 needs the per-module compute of the reference "
                              "GPT to split backward passes into B and W")
        whole = costs.pass_compute("B", layers, False, False) or 1.0
        share = layers * costs.layer["B"] * costs.weight_share / whole if layers else 0.0
        share = min(share, 1.0)
        self.note(f"ZB-H1: W takes {100 * costs.weight_share:.0f}% of each layer's backward ("
                  + ("as the recorded W passes did)" if costs.weight_share_measured else
                     "half of its linear layers' backward: input and weight gradients have "
                     "equal FLOPs)"))
        return compute * (share if kind == "W" else 1 - share)

    def _tp_ratio(self, kind: str, layers: int, first: bool, last: bool) -> float:
        if self.same_tp:
            return 1.0
        costs = self.rec.costs
        scale = costs.tp_scale(self.rec.ops, self.rec.shape, self.shape)
        old = costs.pass_compute(kind, layers, first, last)
        return costs.pass_compute(kind, layers, first, last, scale) / old if old > 0 else 1.0

    def _inner(self, cid: int) -> bool:
        comm = self.rec.graph.comms[cid]
        return comm.kind != "p2p" and comm.kind not in P2P_KINDS

    def _recorded_calls(self, rank: int, src: int, part, buckets: bool) -> list:
        """The recorded collectives of a part, on the target's groups (those over the data-
        parallel group left out unless ``buckets``: in a pass, _buckets places them)."""
        mine = roles(self.rec.grid, src)
        waits = {cid: at for at, op, cid in part.events if op == WAIT}
        out = []
        for at, op, cid in part.events:
            comm = self.rec.graph.comms[cid]
            if op != LAUNCH or not self._inner(cid):
                continue
            role = role_of(comm.group, mine)
            if role == "dp" and not buckets:
                continue
            group = self._group(rank, role, comm.group)
            if group is None:
                continue
            ns = self._collective_ns(comm.kind, len(group), comm.nbytes, role)
            out.append((at, Call(comm.kind, group, comm.nbytes, ns, role,
                                 wait=waits.get(cid, part.compute))))
        return out

    def _tp_calls(self, rank: int, kind: str, layers: range, first: bool, last: bool) -> list:
        if self.shape is None or self.grid.tp < 2:
            return []
        shape = Shape(**{**self.shape.__dict__, "schedule": self.cfg["schedule"]})
        self.note("TP collectives inside passes by Megatron's rules (docs/oracles.md), "
                  "blocking, spread evenly over each pass")
        group = roles(self.grid, rank)["tp"]
        return [Call(c.kind, group, c.nbytes,
                     self._collective_ns(c.kind, self.grid.tp, c.nbytes, "tp"), "tp")
                for c in tp_calls(shape, kind, layers, first, last)]

    # ------------------------------------------------------------------ gradient buckets
    def _buckets(self, rank: int, src: int, chunk: int, compute: float) -> list:
        """The DP gradient buckets the last backward of ``chunk`` launches (async)."""
        group = roles(self.grid, rank)["dp"]
        if self.same_layout and self.same_tp and self.rec.grid.dp > 1:
            recorded = self._recorded_buckets(src, chunk)
            if recorded:
                self.note("gradient buckets: the recorded ones, at their places in the last "
                          "backward")
            return [(share * compute, Call("all_reduce", group, nbytes,
                                           self._collective_ns("all_reduce", len(group), nbytes,
                                                               "dp"),
                                           "bucket")) for share, nbytes in recorded]
        if self.shape is None:
            raise TargetError("--dp needs the model sizes in the recorded config to size the "
                              "gradient buckets")
        pp_i = self.grid.coords(rank)[3]
        self.note(f"gradient buckets: the reference GPT's ({self.shape.bucket_size} elements "
                  "each, filled in reverse parameter order), launched as their parameters' "
                  "last gradients are ready, in proportion to parameters")
        return [(share * compute, Call("all_reduce", group, n * BYTES,
                                       self._collective_ns("all_reduce", len(group), n * BYTES,
                                                           "dp"),
                                       "bucket"))
                for n, owner, share in buckets(self.shape, pp_i) if owner == chunk]

    def _recorded_buckets(self, src: int, chunk: int) -> list:
        """(share of the pass, bytes) of the DP all-reduces the source's last backward of
        ``chunk`` launched (none: the recording reduced its gradients after the passes)."""
        anat = self.rec.anatomies[src]
        mine = roles(self.rec.grid, src)
        last = [p for p in anat.passes if p.chunk == chunk and p.kind in ("B", "W")]
        for p in reversed(last):
            found = [(at / p.body.compute if p.body.compute else 1.0,
                      self.rec.graph.comms[cid].nbytes) for at, op, cid in p.body.events
                     if op == LAUNCH and role_of(self.rec.graph.comms[cid].group, mine) == "dp"]
            if found:
                return found
        return []

    # ------------------------------------------------------------------ after the passes
    def _post(self, rank: int, src: int) -> Body:
        """The work after the last pass: compute (scaled by the parameters held), the
        sequence-parallel and tied-embedding all-reduces, the loss all-reduce."""
        anat = self.rec.anatomies[src]
        post = mean_part(anat.post)
        if self.same_layout and self.same_tp and not changed(self.rec.config, self.cfg, "dp"):
            return Body(post.compute, post.idle, self._recorded_calls(rank, src, post, True))
        compute = post.compute * self._params_ratio(rank, src)
        first_launch = next((at for at, op, _ in post.events if op == LAUNCH), None)
        share = first_launch / post.compute if first_launch is not None and post.compute else 0.1
        pp_i = self.grid.coords(rank)[3]
        mine = roles(self.grid, rank)
        calls = []
        sp_bytes = self._post_bytes(src, post, "tp",
                                    lambda s: sp_grad_elements(s, pp_i) * BYTES)
        if sp_bytes and self.grid.tp > 1:
            calls.append(Call("all_reduce", mine["tp"], sp_bytes,
                              self._collective_ns("all_reduce", self.grid.tp, sp_bytes, "tp"),
                              "tp"))
        if self.grid.pp > 1 and pp_i in (0, self.grid.pp - 1):
            tied = self._post_bytes(src, post, "embedding",
                                    lambda s: tied_elements(s) * BYTES)
            if tied:
                calls.append(Call("all_reduce", mine["embedding"], tied,
                                  self._collective_ns("all_reduce", 2, tied, "embedding"),
                                  "embedding"))
        out = Body(compute, post.idle, [(compute * share, Call(c.kind, c.group, c.nbytes, c.ns,
                                                              c.role, wait=compute * share))
                                        for c in calls])
        if pp_i == self.grid.pp - 1 and self.grid.dp > 1:
            out.calls.append((compute, Call("all_reduce", mine["dp"], LOSS_BYTES,
                                            self._collective_ns("all_reduce", self.grid.dp,
                                                                LOSS_BYTES, "dp"), "dp",
                                            wait=compute)))
        return out

    def _post_bytes(self, src: int, post, role: str, rule) -> int:
        """Bytes of the post part's all-reduce of ``role``: the recorded one's while the
        parameters a rank holds stay, else the rule's on the target shape (0: none)."""
        if self.same_layout and self.same_tp:
            mine = roles(self.rec.grid, src)
            for _, op, cid in post.events:
                comm = self.rec.graph.comms[cid]
                if op == LAUNCH and comm.kind == "all_reduce" and \
                        role_of(comm.group, mine) == role:
                    return comm.nbytes
            if self.rec.shape is None:
                return 0
        if self.shape is None:
            return 0
        return int(rule(self.shape))

    def _params_ratio(self, rank: int, src: int) -> float:
        if self.shape is None or self.rec.shape is None or (self.same_layout and self.same_tp):
            return 1.0
        new = sum(n for n, _ in rank_params(self.shape, self.grid.coords(rank)[3]))
        old = sum(n for n, _ in rank_params(self.rec.shape, self.rec.pp_rank(src)))
        self.note("work after the passes (optimizer, gradient copies) in proportion to the "
                  "parameters a rank holds")
        return new / old if old else 1.0

    # ------------------------------------------------------------------ communication
    def _group(self, rank: int, role: str, recorded: tuple) -> Optional[tuple]:
        """The target's group of ``role`` for ``rank`` (None: gone, a group of one)."""
        if role in ("self", "other"):
            if all(r < self.grid.world for r in recorded) and len(recorded) > 1:
                return tuple(recorded)
            return None
        group = roles(self.grid, rank).get(role)
        return tuple(group) if group is not None and len(group) > 1 else None

    def _collective_ns(self, kind: str, n: int, nbytes: int, role: str) -> float:
        ns, how = self.rec.collectives.time(kind, n, nbytes, role)
        if how:
            self.note(how)
        return ns

    def _message_of(self) -> tuple:
        """(bytes, ns) of one P2P message between stages."""
        if self._message is None:
            if self.shape is not None:
                nbytes = self.shape.activation_bytes
            else:
                nbytes = int(mean(c.nbytes for c in self.rec.graph.comms if c.kind == "p2p"))
            ns = self.rec.link(nbytes) if self.rec.link.fit.samples else \
                self._link_fallback(nbytes)
            self._message = (nbytes, ns)
        return self._message

    def _link_fallback(self, nbytes: int) -> float:
        """A P2P message's time when the recording has none: half the latency of a two-rank
        all-reduce of the same size, the same bandwidth term."""
        ns, _ = self.rec.collectives.time("all_reduce", 2, nbytes)
        self.note("P2P messages: no P2P recorded; a message costs a two-rank all-reduce of "
                  "its size less one of its two latencies (the all-reduce's alpha-beta fit)")
        return max(ns - 0.5 * self.rec.collectives.time("all_reduce", 2, 0)[0], 0.0)
