"""``luxun agent``: a local agent that speaks Dory's input protocol and sends to luxun brokers.

Applications written for Dory (its C/C++ library, ``to_dory``, a few lines of ``socket``)
hand messages to the agent over a UNIX datagram socket, a UNIX stream socket or TCP on
127.0.0.1, fire and forget; the agent batches them per topic into message packs and
delivers them with acknowledged ``produce``. See :mod:`clients.agent.core` for the threads,
routing, the memory pool and what is counted, :mod:`clients.agent.wire` for the bytes,
:mod:`clients.agent.config` for the Dory config subset, :mod:`clients.agent.status` for the
HTTP pages. Imports nothing from ``luxun``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

from ..connection import parse_broker_list
from .config import AgentConfig, AgentConfigError, load_dory_config
from .core import Agent
from .status import StatusServer

_M_ARENA_MAX = -8  # glibc mallopt parameters
_M_MMAP_THRESHOLD = -3
_M_TRIM_THRESHOLD = -1
_SWITCH_INTERVAL_S = 0.0005
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``luxun agent``."""
    p.add_argument("--broker", action="append", default=[],
                   help="a luxun broker host:port (repeat for several; PartitionKey picks key %% n in this order); "
                        "default: the config's initialBrokers")  # fmt: skip
    p.add_argument("--dgram", help="UNIX datagram socket path (replaced at start)")
    p.add_argument("--stream", help="UNIX stream socket path (replaced at start)")
    p.add_argument("--tcp-port", type=int, help="TCP port on 127.0.0.1 (0: any free port, printed at start)")
    p.add_argument("--config", help="a Dory XML config file (doryConfig); options given here override it")
    p.add_argument("--status-port", type=int, help="status HTTP port on 127.0.0.1 (default 9090; 0: off)")
    p.add_argument("--max-buffer", help="memory pool size, e.g. 128m (Dory's maxBuffer)")
    p.add_argument("--discard-log", help="a file with one line per discarded message (Dory's discardLogging path)")
    p.add_argument("--shutdown-max-delay-ms", type=int, help="delivery time allowed at SIGTERM (default 30000)")
    p.add_argument("--log-level", default="INFO", help=f"{', '.join(_LEVELS)} (default INFO)")


def build_config(args: argparse.Namespace) -> AgentConfig:
    """The config from ``--config`` and the options.

    Raises:
        AgentConfigError: a bad option or config file (one line naming it).
    """
    from .config import parse_size

    cfg = AgentConfig()
    if args.broker:
        try:
            cfg = cfg.with_(brokers=tuple(parse_broker_list(args.broker)))
        except ValueError as exc:
            raise AgentConfigError(f"--broker: {exc}") from exc
    if args.config:
        try:
            cfg = load_dory_config(args.config, cfg)
        except AgentConfigError:
            raise
        except ValueError as exc:
            raise AgentConfigError(f"{args.config}: {exc}") from exc
    changes: dict[str, Any] = {}
    if args.dgram is not None:
        changes["dgram_path"] = args.dgram
    if args.stream is not None:
        changes["stream_path"] = args.stream
    if args.tcp_port is not None:
        changes["tcp_port"] = args.tcp_port
    if args.status_port is not None:
        changes["status_port"] = args.status_port
    if args.max_buffer is not None:
        changes["max_buffer_bytes"] = parse_size(args.max_buffer, "--max-buffer")
    if getattr(args, "discard_log", None) is not None:
        changes["discard_log_path"] = args.discard_log
    if args.shutdown_max_delay_ms is not None:
        changes["shutdown_max_delay_ms"] = args.shutdown_max_delay_ms
    cfg = cfg.with_(**changes)
    if not cfg.brokers:
        raise AgentConfigError("no broker: give --broker host:port (or initialBrokers in --config)")
    if not (cfg.dgram_path or cfg.stream_path or cfg.tcp_port is not None):
        raise AgentConfigError("no input: give --dgram PATH, --stream PATH or --tcp-port N (or inputSources)")
    return cfg


def _switch_interval() -> float:
    """The GIL switch interval: ``LUXUN_AGENT_SWITCH_S`` (seconds; a tuning knob, unset or
    empty: 0.5 ms, which measured best: 0.1 ms gave 10 % fewer datagrams per second)."""
    raw = os.environ.get("LUXUN_AGENT_SWITCH_S", "").strip()
    if not raw:
        return _SWITCH_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise AgentConfigError(f"LUXUN_AGENT_SWITCH_S={raw!r}: give seconds above 0 and at most 1")
    return value


def _tune_process(switch_s: float) -> None:
    """Before any thread starts: at most 2 glibc malloc arenas (each thread would otherwise
    get its own, each keeping freed memory, and RSS would grow well past the pool), a fixed
    mmap threshold (glibc's moving one ends up serving packs and reads from the heap, which
    then stays fragmented), and a
    short GIL switch interval, so that the datagram thread, which gives the GIL up at
    every ``recv``, gets it back soon while the router and senders compute."""
    if "MALLOC_ARENA_MAX" not in os.environ:
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.mallopt(_M_ARENA_MAX, 2)
            libc.mallopt(_M_MMAP_THRESHOLD, 128 * 1024)  # fixed: big buffers (packs, reads) go back at free
            libc.mallopt(_M_TRIM_THRESHOLD, 1024 * 1024)
    sys.setswitchinterval(switch_s)


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT; exit code 0, or 2 for a bad config or a socket that
    cannot be bound (one line on stderr)."""
    level = str(args.log_level).strip().upper()
    if level not in _LEVELS:
        print(f"luxun: --log-level {args.log_level!r} is not one of {', '.join(_LEVELS)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("luxun.agent")
    try:
        cfg = build_config(args)
        switch_s = _switch_interval()
        agent = Agent(cfg)
    except (AgentConfigError, ValueError) as exc:
        print(f"luxun: {exc}", file=sys.stderr)
        return 2
    _tune_process(switch_s)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        status = StatusServer(agent, cfg.status_port) if cfg.status_port else None
    except OSError as exc:
        print(f"luxun: cannot listen on status port 127.0.0.1:{cfg.status_port}: {exc.strerror or exc}",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        agent.start()
    except OSError as exc:
        if status:
            status.close()
        print(f"luxun: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if status:
        status.start()
    for line in cfg.ignored:
        log.info("config setting not used: %s", line)
    inputs = [f"dgram {cfg.dgram_path}" if cfg.dgram_path else "", f"stream {cfg.stream_path}" if cfg.stream_path
              else "", f"tcp 127.0.0.1:{agent.tcp_port}" if agent.tcp_port is not None else ""]  # fmt: skip
    log.info("agent serving %s -> brokers %s; status %s; pool %d bytes", ", ".join(i for i in inputs if i),
             ",".join(cfg.brokers), f"http://127.0.0.1:{status.port}" if status else "off",
             cfg.max_buffer_bytes)  # fmt: skip
    stop.wait()
    log.info("stopping: delivering what is buffered (up to %d ms)", cfg.shutdown_max_delay_ms)
    summary = agent.stop()
    if status:
        status.close()
    log.info("agent stopped: %s", json.dumps(summary, sort_keys=True))
    return 0


__all__ = ["Agent", "AgentConfig", "AgentConfigError", "add_arguments", "build_config", "load_dory_config", "run"]
