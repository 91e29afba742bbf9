"""Multi-node gathering: every node's trace files end up in the DIR of one node, the collector.

Nodes share no disk, and a worker may die (SIGKILL) or destroy its process group before the end,
so the transfer is not done by workers over the training process group. Instead:

1. Each trace-run process listens on a TCP port (:class:`Collector`) and passes its address, a
   random token and its claim to collect to its workers (``PARATRACE_COLLECTOR=host:port#token``,
   ``PARATRACE_CLAIM``); uploads without the token are refused, and the token only travels
   through the agent's store.
2. At start, local rank 0 of every node meets the others in the torch elastic agent's store
   (``MASTER_ADDR:MASTER_PORT``, up for sure while the workers start): each publishes its
   trace-run's address and claim, reads everybody's, and all agree on one collector
   (:func:`choose_collector`): the trace-run given ``--node-rank 0``; without ``--node-rank``,
   the one on the rendezvous endpoint's host; the lowest group rank among equal claims. torch
   assigns group ranks itself (c10d ignores ``--node-rank``), so the collector need not hold
   global rank 0. Each writes what it learned to ``DIR/node.json`` (:class:`NodeRecord`:
   :func:`announce` writes it, :func:`read_node` reads it).
3. After the run, each other node's trace-run sends all files of its ``DIR/traces`` (including
   partial traces of killed ranks) and its ranks' exit statuses to the collector
   (:func:`send`); the collecting trace-run writes them into its own ``DIR/traces``.

Wire format (no pickle): one JSON header line ``{"schema": "paratrace.gather/1", "token",
"node_rank", "ranks", "files": [{"name", "size"}]}``; the collector accepts or refuses it with
one JSON line (``{"ok": true}`` / ``{"ok": false, "error"}``), then the sender streams the
files' bytes back to back and the collector confirms with ``{"ok": true, "dir": ...}``. File
names are checked against ``rank-<R>.<ext>``.
"""
from __future__ import annotations

import io
import json
import os
import secrets
import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from enum import IntEnum
from typing import Any, Optional, TypedDict

from tracer.files import rundir
from tracer.files.run_record import RankOutcome

SCHEMA = "paratrace.gather/1"
ENV_COLLECTOR = "PARATRACE_COLLECTOR"
ENV_CLAIM = "PARATRACE_CLAIM"
_MAX_HEADER = 1 << 20
_CHUNK = 1 << 20


class Claim(IntEnum):
    """How strongly a trace-run claims to collect: given --node-rank 0 > on the rendezvous host >
    none (written to node.json and the agent's store as the number)."""

    NONE = 0
    RENDEZVOUS_HOST = 1
    NODE_RANK_0 = 2


class NodeRecord(TypedDict, total=False):
    """``DIR/node.json``: what this node learned when the nodes met (:func:`announce` writes every
    key; a single-node run has no file, and trace-run takes ``group_rank`` 0 of 1, collecting).
    ``claim``: this node's :class:`Claim`; ``rival_claims``: how many other nodes claimed as
    strongly as the one chosen."""

    group_rank: int
    group_world_size: int
    collector: str
    collector_node: int
    collects: bool
    claim: int
    rival_claims: int


class GatherError(Exception):
    """A transfer that failed; the message is one line."""


@dataclass
class Upload:
    """What one node sent to the collector."""

    node_rank: int
    peer: str
    ranks: dict[str, RankOutcome]
    files: list[str]


class FileEntry(TypedDict):
    """A file in an upload's header: its name (``rank-<R>.<ext>``) and size in bytes."""

    name: str
    size: int


@dataclass
class Collector:
    """TCP receiver of other nodes' trace files, writing into ``traces_dir``."""

    traces_dir: str
    host: str
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    uploads: dict[int, Upload] = field(default_factory=dict)     # by node rank
    incoming: set[int] = field(default_factory=set)     # ranks of every accepted upload so far
    errors: list[str] = field(default_factory=list)
    _server: Optional[socketserver.ThreadingTCPServer] = None
    _arrived: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> str:
        """Listen on an ephemeral port; returns ``host:port#token`` for the other nodes."""
        collector = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                try:
                    upload = collector._receive(self.rfile, self.wfile,
                                                f"{self.client_address[0]}")
                    reply = {"ok": True, "dir": os.path.dirname(collector.traces_dir)}
                except (GatherError, OSError, ValueError) as exc:
                    collector.errors.append(str(exc))
                    upload, reply = None, {"ok": False, "error": str(exc)}
                self.wfile.write((json.dumps(reply) + "\n").encode())
                if upload is not None:
                    with collector._arrived:
                        collector.uploads[upload.node_rank] = upload
                        collector._arrived.notify_all()

        socketserver.ThreadingTCPServer.daemon_threads = True
        self._server = socketserver.ThreadingTCPServer(("0.0.0.0", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="paratrace-collector",
                         daemon=True).start()
        return f"{self.host}:{self._server.server_address[1]}#{self.token}"

    def wait(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` nodes have uploaded; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self.uploads) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._arrived.wait(left)
        return True

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _receive(self, rfile: io.BufferedIOBase, wfile: io.BufferedIOBase, peer: str) -> Upload:
        line = rfile.readline(_MAX_HEADER)
        header = json.loads(line)
        if header.get("schema") != SCHEMA:
            raise GatherError(f"upload from {peer}: not a paratrace gather header")
        if not secrets.compare_digest(str(header.get("token")), self.token):
            raise GatherError(f"upload from {peer}: wrong token (not a node of this run)")
        files = header.get("files") or []
        for item in files:
            if not isinstance(item, dict) or not isinstance(item.get("size"), int) or \
                    item["size"] < 0 or rundir.parse_rank_file(str(item.get("name"))) is None:
                raise GatherError(f"upload from {peer}: refused file entry {item!r}")
        os.makedirs(self.traces_dir, exist_ok=True)
        # known before any file lands, so the local run never mistakes them for its own ranks
        self.incoming.update(rank for item in files
                             if (rank := rundir.parse_rank_file(item["name"])) is not None)
        wfile.write(b'{"ok": true}\n')
        wfile.flush()
        for item in files:
            left = int(item["size"])
            tmp = os.path.join(self.traces_dir, item["name"] + ".part")
            with open(tmp, "wb") as out:
                while left:
                    chunk = rfile.read(min(left, _CHUNK))
                    if not chunk:
                        raise GatherError(f"upload from {peer}: connection closed mid-file")
                    out.write(chunk)
                    left -= len(chunk)
            os.replace(tmp, os.path.join(self.traces_dir, item["name"]))
        return Upload(int(header.get("node_rank", -1)), peer, header.get("ranks") or {},
                      [item["name"] for item in files])


def announce(run_dir: str, timeout: float = 120.0) -> None:
    """In a worker: meet the other nodes, agree on the collector; local rank 0 writes node.json.

    Does nothing on single-node runs or outside torchrun.
    """
    env = os.environ
    if int(env.get("GROUP_WORLD_SIZE", "1")) <= 1 or env.get("LOCAL_RANK") != "0":
        return
    from torch.distributed import TCPStore

    group_rank, nodes = int(env["GROUP_RANK"]), int(env["GROUP_WORLD_SIZE"])
    prefix = (f"paratrace/{env.get('TORCHELASTIC_RUN_ID', '')}/"
              f"{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/node")
    store = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                     timeout=timedelta(seconds=timeout))
    mine: dict[str, Any] = {"group_rank": group_rank, "collector": env.get(ENV_COLLECTOR, ""),
                            "claim": int(env.get(ENV_CLAIM, Claim.NONE))}
    store.set(f"{prefix}/{group_rank}", json.dumps(mine))
    keys = [f"{prefix}/{n}" for n in range(nodes)]
    store.wait(keys, timedelta(seconds=timeout))
    everyone = [json.loads(store.get(key)) for key in keys]
    chosen = choose_collector(everyone)
    node: NodeRecord = {
        "group_rank": group_rank, "group_world_size": nodes, "collector": chosen["collector"],
        "collector_node": chosen["group_rank"], "collects": chosen["group_rank"] == group_rank,
        "claim": mine["claim"],
        "rival_claims": sum(n["claim"] == chosen["claim"] for n in everyone) - 1}
    tmp = os.path.join(run_dir, rundir.NODE_RECORD + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(node, fh)
    os.replace(tmp, os.path.join(run_dir, rundir.NODE_RECORD))


def choose_collector(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The node that collects: the strongest claim, then the lowest group rank. Every node runs
    this on the same list, so all agree."""
    return min(nodes, key=lambda n: (-int(n.get("claim", Claim.NONE)), int(n["group_rank"])))


def read_node(run_dir: str) -> Optional[NodeRecord]:
    """node.json written by :func:`announce`, or None (single node, or workers died first)."""
    try:
        with open(os.path.join(run_dir, rundir.NODE_RECORD)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def send(collector: str, traces_dir: str, node_rank: int, ranks: dict[str, RankOutcome],
         timeout: float = 120.0) -> str:
    """Send every trace file of ``traces_dir`` to ``host:port#token``; returns its run
    directory."""
    address, _, token = collector.partition("#")
    host, _, port = address.rpartition(":")
    names = sorted(n for n in os.listdir(traces_dir) if rundir.parse_rank_file(n) is not None)
    files: list[FileEntry] = [{"name": n, "size": os.path.getsize(os.path.join(traces_dir, n))}
                              for n in names]
    header = {"schema": SCHEMA, "token": token, "node_rank": node_rank, "ranks": ranks,
              "files": files}
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            replies = sock.makefile("rb")
            sock.sendall((json.dumps(header) + "\n").encode())
            accepted = json.loads(replies.readline(_MAX_HEADER) or b"{}")
            if not accepted.get("ok"):
                raise GatherError(f"collector {address} refused the traces: "
                                  f"{accepted.get('error')}")
            for item in files:
                with open(os.path.join(traces_dir, item["name"]), "rb") as fh:
                    sent = 0
                    while sent < item["size"]:
                        chunk = fh.read(min(_CHUNK, item["size"] - sent))
                        if not chunk:
                            raise GatherError(f"{item['name']} shrank while being sent")
                        sock.sendall(chunk)
                        sent += len(chunk)
            reply = json.loads(replies.readline(_MAX_HEADER) or b"{}")
    except (OSError, ValueError) as exc:
        raise GatherError(f"sending traces to {address} failed: {exc}") from None
    if not reply.get("ok"):
        raise GatherError(f"collector {address} refused the traces: {reply.get('error')}")
    return reply["dir"]
