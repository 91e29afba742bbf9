"""torchrun's options checked before anything is launched, and launch errors in one line.

torch's elastic agent rejects some values only once it starts: ``--nproc-per-node 0`` and
``--monitor-interval 0`` trip a bare ``assert`` in ``WorkerSpec`` (an empty message), a bad
``--rdzv-endpoint`` or ``--rdzv-backend`` raises inside the rendezvous handler, ``--nnodes x``
escapes as a traceback, and a static ``--node-rank`` outside ``--nnodes`` waits for a
rendezvous that can never complete. :func:`launch_config` checks every such value first and
names the option (:class:`~instrument.launch.command_line.UsageError`: one line, exit status
2), then builds torch's ``LaunchConfig`` the way ``torch.distributed.run.run`` does.
:func:`describe_launch_error` turns whatever the agent still raises into one line.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import traceback
import uuid
from typing import Any, Callable, Optional

from torch.distributed import run as torchrun
from torch.distributed.launcher.api import LaunchConfig

from tracer.recorder.compat import launcher_option
from tracer.recorder.device.cupti_direct import source as device_source

from .command_line import UsageError

DEFAULT_MASTER_PORT = 29500
DEFAULT_RDZV_PORT = 29400       # torch's default for an endpoint given without a port
_NPROC_WORDS = ("cpu", "gpu", "xpu", "auto")


def launch_config(args: argparse.Namespace) -> LaunchConfig:
    """torchrun's LaunchConfig, with the same defaulting as ``torch.distributed.run.run``;
    raises UsageError naming the option for any value torch's agent would reject."""
    check_options(args)
    if args.standalone:
        args.rdzv_backend, args.rdzv_endpoint = "c10d", "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    elif args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None:
        if torchrun.parse_min_max_nnodes(args.nnodes)[1] == 1:
            # one node and no port given: let the rendezvous pick a free port
            args.rdzv_backend, args.rdzv_endpoint = "c10d", "localhost:0"
            args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = DEFAULT_MASTER_PORT
    check_endpoint(args)
    try:
        config, _, _ = torchrun.config_from_args(args)
    except (ValueError, AssertionError, RuntimeError, OSError) as exc:
        raise UsageError(_first_line(exc)) from None
    if config.nproc_per_node < 1:      # "cpu"/"auto" on a machine that reports no cores
        raise UsageError(f"--nproc-per-node {args.nproc_per_node} means "
                         f"{config.nproc_per_node} processes; give a number")
    return config


def check_options(args: argparse.Namespace) -> None:
    """Every torchrun option whose bad value torch's agent would only find at launch."""
    _, max_nodes = _nnodes(args.nnodes)
    _nproc_per_node(args.nproc_per_node)
    if args.node_rank is None:
        args.node_rank_given, args.node_rank = False, 0
    else:
        args.node_rank_given = True
    if not 0 <= args.node_rank < max_nodes:
        allowed = "0 on a single node" if max_nodes == 1 else \
            f"between 0 and {max_nodes - 1} for --nnodes {args.nnodes}"
        raise UsageError(f"--node-rank must be {allowed} (got {args.node_rank})")
    if args.max_restarts < 0:
        raise UsageError(f"--max-restarts must be 0 or more (got {args.max_restarts})")
    if not args.monitor_interval > 0:
        raise UsageError("--monitor-interval must be a positive number of seconds "
                         f"(got {args.monitor_interval:g})")
    shutdown_timeout = launcher_option(args, "shutdown_timeout")
    if shutdown_timeout is not None and shutdown_timeout < 0:
        raise UsageError(f"--shutdown-timeout must be 0 or more (got {shutdown_timeout})")
    if args.master_port is not None and not 0 <= args.master_port < 65536:
        raise UsageError(f"--master-port must be between 0 and 65535 (got {args.master_port})")
    backends = _rendezvous_backends()
    if backends and args.rdzv_backend not in backends and not args.standalone:
        raise UsageError(f"--rdzv-backend must be one of {', '.join(sorted(backends))} "
                         f"(got {args.rdzv_backend!r})")
    _with_option("--rdzv-conf", getattr(torchrun, "_parse_rendezvous_config", None),
                 args.rdzv_conf)
    from torch.distributed.elastic.multiprocessing import Std
    _with_option("--redirects", Std.from_str, args.redirects)
    _with_option("--tee", Std.from_str, args.tee)
    if args.log_dir and os.path.exists(args.log_dir) and not os.path.isdir(args.log_dir):
        raise UsageError(f"--log-dir {args.log_dir} is a file, not a directory")
    signals = launcher_option(args, "signals_to_handle") or ""
    unknown = [name.strip() for name in signals.split(",")
               if name.strip() and not isinstance(getattr(signal, name.strip(), None), int)]
    if unknown:
        raise UsageError(f"--signals-to-handle: no signal named {', '.join(unknown)}")
    if args.local_addr:
        try:
            socket.getaddrinfo(args.local_addr, None)
        except (OSError, UnicodeError) as exc:
            raise UsageError(f"--local-addr {args.local_addr}: cannot resolve it "
                             f"({getattr(exc, 'strerror', None) or exc})") from None
    if args.local_ranks_filter:
        try:
            [int(r) for r in args.local_ranks_filter.split(",")]
        except ValueError:
            raise UsageError("--local-ranks-filter must be local ranks separated by commas, "
                             f"such as 0,1 (got {args.local_ranks_filter!r})") from None
    try:
        device_source()      # PARATRACE_DEVICE_SOURCE, read by every rank's recorder
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_reference_gpt_device(target_module: Optional[str], target_args: list[str],
                               nproc_per_node: str) -> None:
    """The reference GPT with ``--device cuda`` on a node with fewer GPUs than ranks: one line
    before anything launches (torch's launcher included), rather than a failure in every
    rank. ``nproc_per_node`` as given; a value that is not a count is left to
    :func:`launch_config` to refuse."""
    if target_module != "sample_runs.train":
        return
    choice = "auto"
    for i, arg in enumerate(target_args):
        if arg == "--device" and i + 1 < len(target_args):
            choice = target_args[i + 1]
        elif arg.startswith("--device="):
            choice = arg.split("=", 1)[1]
    if choice != "cuda":
        return                  # auto falls back to the CPU in the workers and says so
    try:
        nproc = torchrun.determine_local_world_size(nproc_per_node)
    except ValueError:
        return
    if nproc < 1:
        return
    import torch

    from sample_runs.config import ConfigError
    from sample_runs.device import choose_placement
    try:
        choose_placement(choice, gpus=torch.cuda.device_count(),
                         local_world_size=nproc)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def check_endpoint(args: argparse.Namespace) -> None:
    """The rendezvous endpoint the agent will parse: ``--rdzv-endpoint``, or for the static
    rendezvous ``--master-addr:--master-port``."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
    if args.rdzv_backend == "static" and not args.rdzv_endpoint:
        option, endpoint = "--master-addr", f"{args.master_addr}:{args.master_port}"
    else:
        option, endpoint = "--rdzv-endpoint", args.rdzv_endpoint
    try:
        parse_rendezvous_endpoint(endpoint, DEFAULT_RDZV_PORT)
    except ValueError as exc:
        raise UsageError(f"{option}: {_first_line(exc)}") from None


def rendezvous_host(config: LaunchConfig) -> str:
    """The host part of the launch's rendezvous endpoint."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
    return parse_rendezvous_endpoint(config.rdzv_endpoint, DEFAULT_RDZV_PORT)[0]


def is_this_machine(host: str) -> bool:
    """Whether ``host`` names this machine (torch's own test, as the c10d rendezvous uses it to
    decide which agent hosts its store)."""
    try:
        from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname
    except ImportError:   # pragma: no cover - a torch without the helper
        return host in ("localhost", "127.0.0.1", "::1")
    try:
        return _matches_machine_hostname(host)
    except OSError:
        return False


def describe_launch_error(exc: BaseException, config: Optional[LaunchConfig] = None) -> str:
    """One line for an exception torch's agent raised while launching (rendezvous, spawning):
    what went wrong with the rendezvous, else its type and first line, else where it came
    from (torch raises some without a message)."""
    from torch.distributed.elastic.rendezvous import api as rdzv
    name = type(exc).__name__
    if config is not None and isinstance(exc, rdzv.RendezvousError):
        at = f"the rendezvous at {config.rdzv_endpoint} (--rdzv-endpoint)"
        nodes = config.min_nodes if config.min_nodes == config.max_nodes else \
            f"{config.min_nodes} to {config.max_nodes}"
        if isinstance(exc, rdzv.RendezvousTimeoutError):
            return f"{at} timed out waiting for {nodes} nodes to join ({name})"
        if isinstance(exc, rdzv.RendezvousClosedError):
            return (f"{at} is closed: a run with --rdzv-id {config.run_id} has already "
                    f"finished there ({name})")
        if isinstance(exc, rdzv.RendezvousConnectionError):
            cause = exc.__cause__ or exc.__context__
            why = _first_line(cause) if cause is not None else _first_line(exc)
            return f"cannot reach {at}: {why} ({name})"
    text = _first_line(exc)
    if text != name:
        return f"{name}: {text}"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" in {frames[-1].name} ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{name} with no message{where}"


def _nnodes(value: str) -> tuple[int, int]:
    try:
        min_nodes, max_nodes = torchrun.parse_min_max_nnodes(value)
    except (ValueError, RuntimeError):
        min_nodes = max_nodes = -1
    if not 0 < min_nodes <= max_nodes:
        raise UsageError(f"--nnodes must be N or MIN:MAX with 0 < MIN <= MAX (got {value!r})")
    return min_nodes, max_nodes


def _nproc_per_node(value: str) -> None:
    try:
        count = int(value)
    except ValueError:
        if value in _NPROC_WORDS:
            _with_option(f"--nproc-per-node {value}", torchrun.determine_local_world_size, value)
            return
        count = None
    if count is None or count < 1:
        raise UsageError("--nproc-per-node must be a number of processes of at least 1, or "
                         f"one of {', '.join(_NPROC_WORDS)} (got {value!r})")


def _with_option(option: str, check: Optional[Callable[[Any], object]], value: Any) -> None:
    """Run torch's own parser of an option's value; its complaint becomes one line naming it."""
    if check is None:
        return
    try:
        check(value)
    except (ValueError, RuntimeError, AssertionError) as exc:
        raise UsageError(f"{option}: {_first_line(exc)}") from None


def _rendezvous_backends() -> set[str]:
    """Registered rendezvous backends (c10d, static, etcd, ... plus plug-ins); empty when this
    torch hides its registry, and then the agent's own error names the backend."""
    from torch.distributed.elastic.rendezvous import registry
    registered = getattr(registry.handler_registry, "_registry", None)
    return set(registered) if isinstance(registered, dict) else set()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
