"""Benchmark ``luxun agent``: Dory-style clients -> agent -> broker, and the same clients
writing straight to the broker with our Producer.

A program, not a test::

    .venv/bin/python perf/bench_agent.py                 # ~1 min on 2 cores
    .venv/bin/python perf/bench_agent.py --seconds 2 --clients 2 --sizes 100
    .venv/bin/python perf/bench_agent.py --help

It starts its own brokers (``--brokers``, default 1: ``python -m luxun.cli serve``, each with a
temporary data dir) and one agent (``python -m luxun.cli agent`` with all three inputs, its
status port and a ``--broker`` for each broker: AnyPartition messages are spread over them),
all on 127.0.0.1. For each transport (UNIX datagram, UNIX stream, TCP) and message size,
``--clients`` processes send pre-built Dory messages (AnyPartition, the shape ``to_dory``
and Dory's C library write) with plain ``socket`` calls, as fast as they can, for
``--seconds``, to a fresh topic. Measured:

- **client cost**: each client's CPU time (``time.process_time``) per message, and its
  wall time per message (a datagram client is held by the kernel when the agent's
  queue, ``net.unix.max_dgram_qlen`` datagrams, is full: that wait is not CPU);
- **end to end**: messages / s from the first send to the moment the agent's
  ``MsgDelivered`` counter (acknowledged by the broker) covers every message sent
  (bounded by ``--drain-seconds``);
- **agent CPU**: the agent's CPU time (user + system) per message sent, its system part,
  and the context switches of all its threads per 1000 messages (a datagram input's cost
  is mostly the kernel's: senders held after ``max_dgram_qlen`` datagrams and woken);
- **agent RSS**: the agent's peak resident set during the run (sampled every 50 ms)
  against its pool (``--max-buffer``): "bounded" means peak <= idle RSS + pool + 5 %.

Peer in the same run: the same number of processes calling ``Producer.send`` (sync,
batches of 1000, linger 5 ms) straight to the brokers for the same time, then ``flush``.
Floor of the datagram input in the same run (``reader/dgram``): the same clients sending
to a process that only drains its socket as the agent does (``recvmmsg``, 16 at a time)
and counts, with no parsing, batching or broker: what the kernel lets one Python reader
take on this machine at that moment (a UNIX datagram queue holds
``net.unix.max_dgram_qlen`` messages, so senders are held and woken every few of them);
the reader's own CPU per message is in the JSON's ``agent_cpu_us_per_msg`` of that row.

``--agent-nice N`` starts the agent under ``nice -n N`` (a deployment choice, see the
README's agent section: with the senders and the agent on the same two cores, a woken
sender preempts the agent's datagram reader); the targets are judged on the default, 0.

Targets (printed as reached or not): >= 200 k msgs/s of 100 B through the datagram input
end to end; client cost under 10 us per message; agent RSS bounded by its pool.
Results: a table on stdout and JSON in ``perf/results/bench_agent.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Any

from _common import REPO, collect_reports, dist_versions, fmt_rate, free_port, load_average, machine_info, own_broker

sys.path.insert(0, str(REPO))

from clients.agent.config import AgentConfig
from clients.agent.mmsg import batch_receiver
from clients.agent.wire import encode

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "bench_agent.json"
TARGET_RATE = 200_000
TARGET_CLIENT_US = 10.0


# -- client processes -----------------------------------------------------------------------
def agent_client(spec: dict[str, Any], start: Any, results: Any) -> None:
    try:
        msg = encode(spec["topic"].encode(), b"v" * spec["size"], timestamp_ms=int(time.time() * 1000))
        kind = spec["transport"]
        if kind == "dgram":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            s.connect(spec["dgram"])
            send = s.send
        elif kind == "stream":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(spec["stream"])
            send = s.sendall
        else:
            s = socket.create_connection(("127.0.0.1", spec["tcp_port"]))
            send = s.sendall
        start.wait()
        n = 0
        t0 = time.monotonic()
        c0 = time.process_time()
        deadline = t0 + spec["seconds"]
        limit = spec["max_messages"]
        while n < limit:
            for _ in range(500):
                send(msg)
            n += 500
            if time.monotonic() >= deadline:
                break
        t1 = time.monotonic()
        c1 = time.process_time()
        s.close()
        results.put({"sent": n, "t0": t0, "t1": t1, "cpu_s": c1 - c0})
    except Exception:
        results.put({"error": traceback.format_exc()})


def producer_client(spec: dict[str, Any], start: Any, results: Any) -> None:
    try:
        from clients.producer import Producer

        value = b"v" * spec["size"]
        with Producer(spec["broker"], batch_size=1000, linger_ms=5) as p:
            start.wait()
            n = 0
            t0 = time.monotonic()
            c0 = time.process_time()
            deadline = t0 + spec["seconds"]
            send = p.send
            topic = spec["topic"]
            while n < spec["max_messages"]:
                for _ in range(500):
                    send(topic, value)
                n += 500
                if time.monotonic() >= deadline:
                    break
            c1 = time.process_time()
            p.flush(spec["drain_seconds"])
            t1 = time.monotonic()
            dropped = sum(sum(r.values()) for r in p.metrics()["dropped"].values())
        results.put({"sent": n, "t0": t0, "t1": t1, "cpu_s": c1 - c0, "delivered_at": t1, "dropped": dropped})
    except Exception:
        results.put({"error": traceback.format_exc()})


def floor_reader(path: str, ready: Any, stop: Any, results: Any) -> None:
    """Drain a datagram socket as the agent's input does and count, nothing else."""
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(path)
        s.setblocking(False)
        size = AgentConfig().max_datagram_bytes
        rx = batch_receiver(s, size)
        receive = rx.receive if rx is not None else (lambda: [s.recv(size)])
        n = 0
        ready.set()
        while not stop.is_set():
            try:
                n += len(receive())
            except BlockingIOError:
                select.select([s], [], [], 0.05)
        results.put({"received": n, "cpu_s": time.process_time()})
    except Exception:
        results.put({"error": traceback.format_exc()})


# -- the agent -------------------------------------------------------------------------------
class Agent:
    def __init__(self, brokers: list[str], max_buffer: str, nice: int = 0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="bench-agent-"))
        self.dgram = str(self.dir / "dg")
        self.stream = str(self.dir / "st")
        self.status_port = free_port()
        self.log = self.dir / "agent.log"
        cmd = [sys.executable, "-m", "luxun.cli", "agent", *(a for b in brokers for a in ("--broker", b)),
               "--dgram", self.dgram, "--stream",
               self.stream, "--tcp-port", "0", "--status-port", str(self.status_port), "--max-buffer", max_buffer,
               "--log-level", "WARNING"]  # fmt: skip
        if nice:
            cmd = ["nice", "-n", str(nice), *cmd]
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, cwd=REPO)
        self.tcp_port = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited: {self.log.read_text()}")
            with contextlib.suppress(OSError):
                info = self.get("/server_info/json")
                self.tcp_port = int(info["inputs"]["tcp_port"])
                return
            time.sleep(0.1)
        raise RuntimeError("agent did not start")

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.status_port}{path}", timeout=10) as r:
            return json.loads(r.read())

    def counters(self) -> dict[str, int]:
        return {c["name"]: c["value"] for c in self.get("/counters/json")["counters"]}

    def rss_bytes(self) -> int:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def cpu_s(self) -> tuple[float, float]:
        """The agent's (user, system) CPU time so far."""
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            tick = os.sysconf("SC_CLK_TCK")
            return int(fields[11]) / tick, int(fields[12]) / tick
        return 0.0, 0.0

    def packs_per_broker(self) -> list[int]:
        """Packs each broker acknowledged so far, in the order of ``--broker``."""
        return [int(b["produce_ok"]) for b in self.get("/server_info/json")["brokers"]]

    def context_switches(self) -> int:
        """Context switches (voluntary + not) of all the agent's threads so far."""
        n = 0
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    for line in (task / "status").read_text().splitlines():
                        if "ctxt_switches:" in line:
                            n += int(line.split()[1])
        return n

    def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        text = self.log.read_text(errors="replace")
        shutil.rmtree(self.dir, ignore_errors=True)
        m = re.search(r"agent stopped: (\{.*\})", text)
        return {"exit_code": self.proc.returncode, "summary": json.loads(m.group(1)) if m else None}


def run_clients(target: Any, specs: list[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
    ctx = mp.get_context("fork")
    start = ctx.Event()
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(spec, start, results), daemon=True) for spec in specs]
    for p in procs:
        p.start()
    time.sleep(0.5)  # connected and waiting
    start.set()
    return collect_reports(procs, results, timeout_s, "client")


def measure_agent(agent: Agent, transport: str, size: int, args: argparse.Namespace, run_id: str) -> dict[str, Any]:
    topic = f"agent-{transport}-{size}-{run_id}"
    before = agent.counters()
    base_delivered = before.get("MsgDelivered", 0)
    base_discards = sum(v for k, v in before.items() if k.startswith(("Discard", "InputAgentDiscard")))
    peak_rss = [agent.rss_bytes()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak_rss[0] = max(peak_rss[0], agent.rss_bytes())
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    cpu0 = agent.cpu_s()
    switches0 = agent.context_switches()
    packs0 = agent.packs_per_broker()
    spec = {"transport": transport, "size": size, "topic": topic, "dgram": agent.dgram, "stream": agent.stream,
            "tcp_port": agent.tcp_port, "seconds": args.seconds, "max_messages": args.max_messages}  # fmt: skip
    reports = run_clients(agent_client, [spec] * args.clients, args.seconds + 60)
    sent = sum(r["sent"] for r in reports)
    t0 = min(r["t0"] for r in reports)
    deadline = time.monotonic() + args.drain_seconds
    delivered = discarded = 0
    while time.monotonic() < deadline:
        c = agent.counters()
        delivered = c.get("MsgDelivered", 0) - base_delivered
        discarded = sum(v for k, v in c.items() if k.startswith(("Discard", "InputAgentDiscard"))) - base_discards
        if delivered + discarded >= sent:
            break
        time.sleep(0.02)
    t_done = time.monotonic()
    cpu1 = agent.cpu_s()
    agent_user, agent_sys = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    switches = agent.context_switches() - switches0
    packs = [n - n0 for n, n0 in zip(agent.packs_per_broker(), packs0, strict=True)]
    stop.set()
    sampler.join()
    send_s = max(r["t1"] for r in reports) - t0
    return {
        "path": f"agent/{transport}",
        "size": size,
        "clients": args.clients,
        "sent": sent,
        "delivered": delivered,
        "discarded": discarded,
        "send_seconds": round(send_s, 3),
        "end_to_end_seconds": round(t_done - t0, 3),
        "end_to_end_msgs_per_s": round(delivered / (t_done - t0)),
        "client_send_msgs_per_s": round(sent / send_s),
        "client_cpu_us_per_msg": round(1e6 * sum(r["cpu_s"] for r in reports) / sent, 2),
        "client_wall_us_per_msg": round(1e6 * sum(r["t1"] - r["t0"] for r in reports) / sent, 2),
        "agent_peak_rss_mib": round(peak_rss[0] / 2**20, 1),
        "agent_cpu_us_per_msg": round(1e6 * (agent_user + agent_sys) / max(1, sent), 2),
        "agent_sys_us_per_msg": round(1e6 * agent_sys / max(1, sent), 2),
        "agent_context_switches_per_1k_msgs": round(1000 * switches / max(1, sent), 1),
        "packs_per_broker": packs,
        "complete": delivered + discarded >= sent,
    }


#: The agent's columns of a row that measured no agent.
NO_AGENT = {"agent_peak_rss_mib": None, "agent_cpu_us_per_msg": None, "agent_sys_us_per_msg": None,
            "agent_context_switches_per_1k_msgs": None, "packs_per_broker": None}  # fmt: skip


def measure_floor(size: int, args: argparse.Namespace) -> dict[str, Any]:
    """The same clients as measure_agent's, sending datagrams to floor_reader."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-floor-"))
    try:
        ctx = mp.get_context("fork")
        ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
        reader = ctx.Process(target=floor_reader, args=(str(tmp / "dg"), ready, stop, results), daemon=True)
        reader.start()
        if not ready.wait(30):
            raise RuntimeError("the floor reader did not start")
        spec = {"transport": "dgram", "size": size, "topic": "floor", "dgram": str(tmp / "dg"),
                "seconds": args.seconds, "max_messages": args.max_messages}  # fmt: skip
        reports = run_clients(agent_client, [spec] * args.clients, args.seconds + 60)
        time.sleep(0.2)  # the last datagrams queued
        stop.set()
        (got,) = collect_reports([reader], results, 30, "floor reader")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    row = client_row("reader/dgram", size, reports, got["received"], 0, None, wall=True)
    # the reader's CPU in the agent's column (it stands where the agent stands)
    row["agent_cpu_us_per_msg"] = round(1e6 * got["cpu_s"] / max(1, got["received"]), 2)
    print(f"  {'reader/dgram':<16} {size:>5} B: {fmt_rate(row['end_to_end_msgs_per_s'])} msgs/s, "
          f"reader {row['agent_cpu_us_per_msg']} us cpu/msg", file=sys.stderr)  # fmt: skip
    return row


def client_row(path: str, size: int, reports: list[dict[str, Any]], delivered: int, discarded: int,
               done_at: float | None, *, wall: bool) -> dict[str, Any]:  # fmt: skip
    """A result row of clients that sent to something other than the agent (``done_at``:
    when everything sent was delivered; None: when the last client stopped sending)."""
    sent = sum(r["sent"] for r in reports)
    t0 = min(r["t0"] for r in reports)
    send_s = max(r["t1"] for r in reports) - t0
    e2e_s = send_s if done_at is None else done_at - t0
    return {
        "path": path,
        "size": size,
        "clients": len(reports),
        "sent": sent,
        "delivered": delivered,
        "discarded": discarded,
        "send_seconds": round(send_s, 3),
        "end_to_end_seconds": round(e2e_s, 3),
        "end_to_end_msgs_per_s": round(delivered / e2e_s),
        "client_send_msgs_per_s": round(sent / send_s),
        "client_cpu_us_per_msg": round(1e6 * sum(r["cpu_s"] for r in reports) / sent, 2),
        "client_wall_us_per_msg": round(1e6 * sum(r["t1"] - r["t0"] for r in reports) / sent, 2) if wall else None,
        **NO_AGENT,
        "complete": delivered + discarded >= sent,
    }


def measure_producer(broker: str, size: int, args: argparse.Namespace, run_id: str) -> dict[str, Any]:
    spec = {"broker": broker, "size": size, "topic": f"producer-{size}-{run_id}", "seconds": args.seconds,
            "max_messages": args.max_messages, "drain_seconds": args.drain_seconds}  # fmt: skip
    reports = run_clients(producer_client, [spec] * args.clients, args.seconds + args.drain_seconds + 60)
    sent = sum(r["sent"] for r in reports)
    dropped = sum(r["dropped"] for r in reports)
    done_at = max(r["delivered_at"] for r in reports)
    return client_row("producer/direct", size, reports, sent - dropped, dropped, done_at, wall=False)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0, help="sending time per configuration (default 3)")
    p.add_argument("--clients", type=int, default=2, help="client processes (default 2)")
    p.add_argument("--brokers", type=int, default=1, help="brokers the agent (and the peer) send to (default 1)")
    p.add_argument("--sizes", default="100,1000", help="message sizes in bytes (default 100,1000)")
    p.add_argument("--transports", default="dgram,stream,tcp", help="default dgram,stream,tcp")
    p.add_argument("--max-messages", type=int, default=2_000_000, help="per client at most (default 2000000)")
    p.add_argument("--drain-seconds", type=float, default=30.0, help="wait for delivery at most (default 30)")
    p.add_argument("--max-buffer", default="64m", help="the agent's pool (default 64m)")
    p.add_argument("--no-peer", action="store_true", help="skip the Producer-direct peer and the datagram floor")
    p.add_argument(
        "--agent-nice",
        type=int,
        default=0,
        help="start the agent under nice -n N (a negative N needs root; default 0: as is)",
    )
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    args = p.parse_args(argv)
    if args.clients < 1 or args.brokers < 1:
        p.error("--clients and --brokers must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    transports = [t for t in args.transports.split(",") if t]
    machine = machine_info(None, versions=dist_versions(("thriftpy2", "python-snappy")))
    try:
        qlen = Path("/proc/sys/net/unix/max_dgram_qlen").read_text().strip()
    except OSError:
        qlen = "unknown"
    print(f"machine: {machine['cpu']}, {machine['cores']} cores ({machine['cores_usable']} usable), "
          f"{machine['ram_gib']} GiB, {machine['os']}, Python {machine['python']}, "
          f"load {machine['load_average_start']}, net.unix.max_dgram_qlen={qlen}; "
          f"{args.clients} client process(es), {args.brokers} broker(s)")  # fmt: skip
    rows: list[dict[str, Any]] = []
    run_id = str(os.getpid())
    started = time.monotonic()
    pool_bytes = int(args.max_buffer[:-1]) * (2**20 if args.max_buffer.endswith("m") else 1024) \
        if args.max_buffer[-1] in "km" else int(args.max_buffer)  # fmt: skip
    with contextlib.ExitStack() as brokers:
        addresses = [f"{b.host}:{b.port}" for b in
                     (brokers.enter_context(own_broker(None, "bench_agent")) for _ in range(args.brokers))]  # fmt: skip
        agent = Agent(addresses, args.max_buffer, args.agent_nice)
        idle_rss = agent.rss_bytes()
        try:
            for size in sizes:
                for transport in transports:
                    row = measure_agent(agent, transport, size, args, run_id)
                    rows.append(row)
                    rate = fmt_rate(row["end_to_end_msgs_per_s"])
                    print(f"  {row['path']:<16} {size:>5} B: {rate} msgs/s end to end, "
                          f"client {row['client_cpu_us_per_msg']} us cpu/msg, agent {row['agent_cpu_us_per_msg']} us "
                          f"cpu/msg ({row['agent_sys_us_per_msg']} system), "
                          f"{row['agent_context_switches_per_1k_msgs']} context switches per 1000 msgs"
                          + (f", packs per broker {row['packs_per_broker']}" if args.brokers > 1 else ""),
                          file=sys.stderr)  # fmt: skip
                if not args.no_peer:
                    if "dgram" in transports:
                        rows.append(measure_floor(size, args))
                    rows.append(measure_producer(",".join(addresses), size, args, run_id))
        finally:
            stopped = agent.stop()
    print()
    head = (f"{'path':<16} {'size':>5} {'clients':>7} {'sent':>9} {'delivered':>9} {'discard':>7} "
            f"{'e2e msgs/s':>11} {'send msgs/s':>11} {'cpu us/msg':>10} {'wall us/msg':>11} "
            f"{'agent RSS MiB':>13}")  # fmt: skip
    print(head)
    for r in rows:
        wall = "-" if r["client_wall_us_per_msg"] is None else f"{r['client_wall_us_per_msg']:.2f}"
        rss = "-" if r["agent_peak_rss_mib"] is None else f"{r['agent_peak_rss_mib']:.1f}"
        print(f"{r['path']:<16} {r['size']:>5} {r['clients']:>7} {r['sent']:>9} {r['delivered']:>9} "
              f"{r['discarded']:>7} {r['end_to_end_msgs_per_s']:>11} {r['client_send_msgs_per_s']:>11} "
              f"{r['client_cpu_us_per_msg']:>10.2f} {wall:>11} {rss:>13}")  # fmt: skip
    dg100 = next((r for r in rows if r["path"] == "agent/dgram" and r["size"] == 100), None)
    agent_rows = [r for r in rows if r["path"].startswith("agent/")]
    peak = max((r["agent_peak_rss_mib"] for r in agent_rows), default=0.0)
    targets = {
        "dgram_100B_end_to_end_msgs_per_s": {
            "target": TARGET_RATE,
            "measured": dg100["end_to_end_msgs_per_s"] if dg100 else None,
            "reached": bool(dg100 and dg100["end_to_end_msgs_per_s"] >= TARGET_RATE),
        },
        "client_cpu_us_per_msg": {
            "target": TARGET_CLIENT_US,
            "measured": max((r["client_cpu_us_per_msg"] for r in agent_rows), default=None),
            "reached": all(r["client_cpu_us_per_msg"] < TARGET_CLIENT_US for r in agent_rows),
        },
        "agent_rss_bounded_by_pool": {
            "target_mib": round((idle_rss + pool_bytes) / 2**20, 1),
            "idle_rss_mib": round(idle_rss / 2**20, 1),
            "pool_mib": round(pool_bytes / 2**20, 1),
            "measured_peak_mib": peak,
            "tolerance": "5% of the pool",
            "reached": peak * 2**20 <= idle_rss + pool_bytes * 1.05,
        },
    }
    print()
    for name, t in targets.items():
        print(f"target {name}: {'REACHED' if t['reached'] else 'NOT reached'} ({t})")
    if args.agent_nice:
        print(f"(the agent ran under nice -n {args.agent_nice}, not as it starts by default)")
    machine["load_average_end"] = load_average()
    report = {
        "benchmark": "bench_agent",
        "machine": machine,
        "net_unix_max_dgram_qlen": qlen,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "duration_s": round(time.monotonic() - started, 1),
        "agent_stop": stopped,
        "targets": targets,
        "results": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nresults written to {args.json} ({report['duration_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
