"""Broker metrics: cheap counters on the call path, Prometheus text and a status page.

Counting costs a few dict operations per call; the text is built only when scraped.
The HTTP endpoint (default 127.0.0.1:9093) serves ``/metrics`` (Prometheus text format
0.0.4), ``/`` (a plain status page for people: topics, groups, lag, disk use) and
``/topics.json`` (the same data for tools such as ``luxun topics``).

Thread-safety: ``observe`` may be called from any thread (a lock guards the maps).
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import gc
import html
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map

from .logs import RateLimitedLog

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

#: Latency histogram bucket upper bounds, in seconds.
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)

#: errorCode names by value (from the IDL).
_ERROR_NAMES = (
    "INTERNAL_ERROR",
    "TOPIC_NOT_EXIST",
    "INDEX_OUT_OF_BOUNDS",
    "INVALID_TOPIC",
    "TOPIC_IS_EMPTY",
    "AUTHENTICATION_FAILURE",
    "MESSAGE_SIZE_TOO_LARGE",
    "ALL_MESSAGE_CONSUMED",
)


class _CallStats:
    __slots__ = ("buckets", "count", "errors", "sum_s")

    def __init__(self) -> None:
        self.count = 0
        self.sum_s = 0.0
        self.buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.errors: dict[int, int] = {}


#: The TCP floor's counters and gauges (luxun.net, both doors): (name, type, help, attribute).
_SERVER_FAMILIES: Final = (
    ("luxun_connections_open", "gauge", "Client connections open now.", "connections_open"),
    ("luxun_connections_total", "counter", "Client connections accepted.", "connections_total"),
    (
        "luxun_connections_refused_total",
        "counter",
        "Connections closed at once: over the connection limit, or out of file descriptors.",
        "connections_refused",
    ),
    ("luxun_bad_frames_total", "counter", "Connections closed for a malformed or oversized frame.", "bad_frames"),
    (
        "luxun_accept_failures_total",
        "counter",
        "accept() calls that failed (e.g. out of file descriptors).",
        "accept_failures",
    ),
    (
        "luxun_input_buffer_bytes",
        "gauge",
        "Receive buffer bytes held by connections (the input budget used).",
        "input_buffer_bytes",
    ),
    (
        "luxun_input_buffer_waits_total",
        "counter",
        "Times a connection stopped reading for the input budget.",
        "input_buffer_waits",
    ),
    (
        "luxun_input_buffer_closed_total",
        "counter",
        "Connections closed because the input budget stayed full.",
        "input_buffer_closed",
    ),
    (
        "luxun_output_buffer_bytes",
        "gauge",
        "Reply bytes read for Kafka Fetch answers and not sent yet (the output budget used).",
        "output_buffer_bytes",
    ),
    (
        "luxun_output_buffer_short_total",
        "counter",
        "Kafka Fetch answers made smaller (or empty) because the output budget was spent.",
        "output_buffer_short",
    ),
    (
        "luxun_busy_polls_total",
        "counter",
        "Times a lone connection polled for its next call (busy.poll.us).",
        "busy_polls",
    ),
    (
        "luxun_busy_poll_hits_total",
        "counter",
        "Busy polls that got the next call before they gave up.",
        "busy_poll_hits",
    ),
    (
        "luxun_async_batch_waits_total",
        "counter",
        "Times a lone connection streaming asyncProduce calls waited for more before reading (async.batch.us).",
        "async_batch_waits",
    ),
    (
        "luxun_cpu_follows_total",
        "counter",
        "Times the Thrift loop moved to the CPU a lone client's calls came in on (follow.client.cpu).",
        "cpu_follows",
    ),
    (
        "luxun_compiled_loop_calls_total",
        "counter",
        "Thrift calls (produce, one-item consume) answered by the compiled loop (luxun._netloop).",
        "compiled_loop_calls",
    ),
    (
        "luxun_compiled_loop_in_place_total",
        "counter",
        "Of those, calls served without the handler: items appended or read by bigarray._fastpath.",
        "compiled_loop_in_place",
    ),
)


class Metrics:
    """Per-call counts, errors by code and latency histograms, plus connection counts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, _CallStats] = {}
        self.connections_open = 0
        self.connections_total = 0
        self.connections_refused = 0
        self.bad_frames = 0
        self.accept_failures = 0
        self.input_buffer_bytes = 0
        self.input_buffer_waits = 0
        self.input_buffer_closed = 0
        self.output_buffer_bytes = 0
        self.output_buffer_short = 0
        #: Busy polling (luxun.thrift.server): times a connection polled for its next call, and
        #: times the call came while it polled.
        self.busy_polls = 0
        self.busy_poll_hits = 0
        #: Times a lone connection streaming asyncProduce calls waited before its next read.
        self.async_batch_waits = 0
        #: Times the shared loop moved to the CPU a lone client's calls came in on (follow.client.cpu).
        self.cpu_follows = 0
        #: Calls answered by the compiled loop (luxun._netloop, through luxun.thrift.server).
        self.compiled_loop_calls = 0
        #: ... and of those, calls it served without the handler (QueueHandler.in_place_calls).
        self.compiled_loop_in_place = 0
        self.started = time.time()
        #: Kafka port: requests by (API key, version) and error codes answered.
        self.kafka_requests: dict[tuple[int, int], int] = {}
        self.kafka_errors: dict[int, int] = {}
        #: The Kafka port's group coordinator (``luxun.kafka.groups.GroupCoordinator``)
        #: when the broker runs one: its ``group_states()`` and ``rebalances_total``.
        self.kafka_groups: Any = None
        #: The broker's topic manager (``luxun.topics.TopicManager``): its topics open now,
        #: ``max_open_topics``, ``opens_total`` and ``lru_closes_total``.
        self.topic_manager: Any = None

    def count_kafka_request(self, api_key: int, version: int) -> None:
        key = (api_key, version)
        with self._lock:
            self.kafka_requests[key] = self.kafka_requests.get(key, 0) + 1

    def count_kafka_requests(self, counts: dict[tuple[int, int], int]) -> None:
        """Several :meth:`count_kafka_request` at once: ``{(api_key, version): n}``."""
        with self._lock:
            for key, n in counts.items():
                self.kafka_requests[key] = self.kafka_requests.get(key, 0) + n

    def count_kafka_error(self, code: int) -> None:
        with self._lock:
            self.kafka_errors[code] = self.kafka_errors.get(code, 0) + 1

    def observe(self, call: str, seconds: float, error_code: int | None, count: int = 1) -> None:
        """Record ``count`` calls that took ``seconds`` each and, when they failed,
        their errorCode (oneway produces are handled in batches: one record each).
        luxun/_netloop.c's observe_here is its twin for one successful call: keep them in step."""
        with self._lock:
            stats = self._calls.get(call)
            if stats is None:
                stats = self._calls[call] = _CallStats()
            stats.count += count
            stats.sum_s += seconds * count
            stats.buckets[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += count
            if error_code is not None:
                stats.errors[error_code] = stats.errors.get(error_code, 0) + count

    def render(self, topics: Iterable[Any]) -> str:
        """The Prometheus text exposition of every metric."""
        out: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        with self._lock:
            calls = {k: (v.count, v.sum_s, list(v.buckets), dict(v.errors)) for k, v in self._calls.items()}
        family("luxun_requests_total", "counter", "QueueService calls handled, by method.")
        for call, (count, _, _, _) in sorted(calls.items()):
            out.append(f'luxun_requests_total{{method="{call}"}} {count}')
        family("luxun_request_errors_total", "counter", "Calls answered with an error code, by method and code.")
        for call, (_, _, _, errors) in sorted(calls.items()):
            for code, n in sorted(errors.items()):
                out.append(f'luxun_request_errors_total{{method="{call}",code="{_error_name(code)}"}} {n}')
        family("luxun_request_duration_seconds", "histogram", "Time spent handling a call, by method.")
        for call, (count, total, buckets, _) in sorted(calls.items()):
            running = 0
            for bound, n in zip(LATENCY_BUCKETS_S, buckets, strict=False):
                running += n
                out.append(f'luxun_request_duration_seconds_bucket{{method="{call}",le="{bound}"}} {running}')
            out.append(f'luxun_request_duration_seconds_bucket{{method="{call}",le="+Inf"}} {count}')
            out.append(f'luxun_request_duration_seconds_sum{{method="{call}"}} {total}')
            out.append(f'luxun_request_duration_seconds_count{{method="{call}"}} {count}')
        for name, kind, help_text, attribute in _SERVER_FAMILIES:
            family(name, kind, help_text)
            out.append(f"{name} {getattr(self, attribute)}")
        with self._lock:
            kafka_requests, kafka_errors = dict(self.kafka_requests), dict(self.kafka_errors)
        family("luxun_kafka_requests_total", "counter", "Kafka-protocol requests, by API key and version.")
        for (api_key, version), n in sorted(kafka_requests.items()):
            out.append(f'luxun_kafka_requests_total{{api_key="{api_key}",version="{version}"}} {n}')
        family("luxun_kafka_errors_total", "counter", "Kafka-protocol error codes answered, by code.")
        for code, n in sorted(kafka_errors.items()):
            out.append(f'luxun_kafka_errors_total{{code="{code}",name="{_kafka_error_name(code)}"}} {n}')
        if self.kafka_groups is not None:
            family("luxun_kafka_groups", "gauge", "Kafka consumer groups known to the coordinator, by state.")
            for state, n in sorted(self.kafka_groups.group_states().items()):
                out.append(f'luxun_kafka_groups{{state="{state}"}} {n}')
            family("luxun_kafka_group_rebalances_total", "counter", "Kafka group rebalances completed (generations).")
            out.append(f"luxun_kafka_group_rebalances_total {self.kafka_groups.rebalances_total}")

        family("python_gc_collections_total", "counter", "Passes of the cyclic garbage collector, by generation.")
        passes = gc.get_stats()
        for generation, stats in enumerate(passes):
            out.append(f'python_gc_collections_total{{generation="{generation}"}} {stats["collections"]}')
        family("python_gc_objects_collected_total", "counter", "Objects the cyclic collector freed, by generation.")
        for generation, stats in enumerate(passes):
            out.append(f'python_gc_objects_collected_total{{generation="{generation}"}} {stats["collected"]}')
        family(
            "luxun_gc_frozen_objects",
            "gauge",
            "Objects the broker held when it started, left out of the collector's passes (gc.freeze).",
        )
        out.append(f"luxun_gc_frozen_objects {gc.get_freeze_count()}")

        manager = self.topic_manager
        if manager is not None:
            family("luxun_topics_open", "gauge", "Topics (Kafka partitions included) open now.")
            out.append(f"luxun_topics_open {manager.open_count()}")
            family("luxun_topics_open_limit", "gauge", "Most topics kept open at once (max.open.topics).")
            out.append(f"luxun_topics_open_limit {manager.max_open_topics}")
            family("luxun_topic_opens_total", "counter", "Topics opened from their files (created or reopened).")
            out.append(f"luxun_topic_opens_total {manager.opens_total}")
            family(
                "luxun_topic_lru_closes_total",
                "counter",
                "Topics closed to make room for another (max.open.topics): reopened on their next use.",
            )
            out.append(f"luxun_topic_lru_closes_total {manager.lru_closes_total}")

        rows = [_topic_row(t) for t in topics]
        per_topic = (
            ("luxun_topic_items_in_total", "counter", "Items appended to the topic.", "items_in"),
            ("luxun_topic_bytes_in_total", "counter", "Bytes appended to the topic.", "bytes_in"),
            ("luxun_topic_items_out_total", "counter", "Items handed out by consume.", "items_out"),
            ("luxun_topic_bytes_out_total", "counter", "Bytes handed out by consume.", "bytes_out"),
            ("luxun_topic_size_items", "gauge", "Items retained (head - tail).", "size"),
            ("luxun_topic_disk_bytes", "gauge", "Disk space of index and data page files (allocated).", "disk"),
        )
        for name, kind, help_text, key in per_topic:
            family(name, kind, help_text)
            for row in rows:
                out.append(f'{name}{{topic="{_label(row["name"])}"}} {row[key]}')
        family("luxun_group_lag_items", "gauge", "Items a consumer group has still to read.")
        for row in rows:
            for group, lag in row["groups"]:
                out.append(f'luxun_group_lag_items{{topic="{_label(row["name"])}",group="{_label(group)}"}} {lag}')
        return "\n".join(out) + "\n"


def _error_name(code: int) -> str:
    return _ERROR_NAMES[code] if 0 <= code < len(_ERROR_NAMES) else str(code)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _topic_row(topic: Any) -> dict[str, Any]:
    queue = topic.queue
    stats = topic.stats
    try:
        groups = [(g, queue.size(g)) for g in queue.groups()]
        size = queue.size()
        disk = queue.allocated_size()
        head, tail = queue.head, queue.tail
    except Exception:  # the topic was deleted while we looked
        groups, size, disk, head, tail = [], 0, 0, 0, 0
    return {
        "name": topic.name,
        "items_in": stats.items_in,
        "bytes_in": stats.bytes_in,
        "items_out": stats.items_out,
        "bytes_out": stats.bytes_out,
        "size": size,
        "disk": disk,
        "head": head,
        "tail": tail,
        "groups": groups,
    }


def status_page(topics: Iterable[Any], metrics: Metrics, title: str) -> str:
    """A small HTML page a person can read: topics, groups, lag and disk use."""
    rows = [_topic_row(t) for t in topics]
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>up {time.time() - metrics.started:,.0f} s, {metrics.connections_open} connections open, "
        f"{len(rows)} topics. Prometheus metrics: <a href='/metrics'>/metrics</a></p>",
        "<table><tr><th>topic</th><th>items</th><th>tail</th><th>head</th><th>disk MB</th>"
        "<th>in</th><th>out</th><th>groups (lag)</th></tr>",
    ]
    for row in rows:
        groups = ", ".join(f"{html.escape(g)} ({lag:,})" for g, lag in row["groups"]) or "-"
        parts.append(
            f"<tr><td>{html.escape(row['name'])}</td><td>{row['size']:,}</td><td>{row['tail']:,}</td>"
            f"<td>{row['head']:,}</td><td>{row['disk'] / 1e6:,.1f}</td><td>{row['items_in']:,}</td>"
            f"<td>{row['items_out']:,}</td><td>{groups}</td></tr>"
        )
    parts.append("</table>")
    with metrics._lock:
        kafka_requests, kafka_errors = dict(metrics.kafka_requests), dict(metrics.kafka_errors)
    if kafka_requests:
        parts.append("<h2>Kafka protocol</h2><table><tr><th>API</th><th>version</th><th>requests</th></tr>")
        for (api_key, version), n in sorted(kafka_requests.items()):
            parts.append(f"<tr><td>{html.escape(_kafka_api_name(api_key))}</td><td>{version}</td><td>{n:,}</td></tr>")
        parts.append("</table><table><tr><th>error</th><th>code</th><th>answered</th></tr>")
        for code, n in sorted(kafka_errors.items()):
            parts.append(f"<tr><td>{html.escape(_kafka_error_name(code))}</td><td>{code}</td><td>{n:,}</td></tr>")
        parts.append("</table>")
    if metrics.kafka_groups is not None:
        states = ", ".join(f"{n:,} {html.escape(state)}" for state, n in metrics.kafka_groups.group_states().items())
        parts.append(f"<p>Kafka consumer groups: {states}; {metrics.kafka_groups.rebalances_total:,} rebalances</p>")
    parts.append("</body></html>")
    return "".join(parts)


def _kafka_api_name(api_key: int) -> str:
    return str(api_key_map.get(api_key, api_key))


def _kafka_error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return str(code)


def _drain_and_close(sock: socket.socket) -> None:
    """End our side (the peer reads end of file), then read what the peer still sends,
    bounded in bytes and time, so that the close does not reset the connection."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + _DRAIN_S
        left = _DRAIN_BYTES
        while left > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            sock.settimeout(remaining)
            data = sock.recv(min(left, 65536))
            if not data:
                break
            left -= len(data)


class _HTTPServer(ThreadingHTTPServer):
    """Backs off when accept fails for lack of descriptors or memory: socketserver's
    loop would find the listener readable again at once and spin a core."""

    daemon_threads = True

    def get_request(self) -> tuple[Any, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                _limited.error("metrics-accept", "metrics server cannot accept a connection: %s", exc)
                time.sleep(0.1)
            raise


#: An HTTP request line starts with a method token then a space (RFC 9112); the first
#: bytes a connection sends are checked against this before waiting for a line end.
_REQUEST_LINE_START: Final = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}(?: |\Z)")
#: What is read and dropped from a connection that is not HTTP before closing it (so the
#: close is a FIN, not a reset that loses the client's last read): at most this many bytes...
_DRAIN_BYTES: Final = 1 << 20
#: ...for at most this long.
_DRAIN_S: Final = 1.0


def _looks_like_http(first: bytes) -> bool:
    """True when ``first``, the first bytes a connection sent (at least one), can begin
    an HTTP request line; False for a Thrift or Kafka frame, whose 4-byte length starts it."""
    return _REQUEST_LINE_START.match(first[:64]) is not None


class MetricsServer:
    """Serves ``/metrics`` and ``/`` over HTTP in a daemon thread.

    A connection whose first bytes cannot start an HTTP request line (a client of the
    QueueService or Kafka port pointed here by mistake) is closed at once: the HTTP
    server would wait for a line end that a binary frame may never hold, and the
    client for its call timeout.
    """

    def __init__(self, host: str, port: int, metrics: Metrics, topics: Callable[[], Iterable[Any]], title: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            def handle_one_request(self) -> None:
                try:
                    first = self.rfile.peek(1)  # type: ignore[attr-defined]  # a BufferedReader
                except OSError:
                    first = b""
                if first and not _looks_like_http(first):
                    log.debug("metrics http: %s sent no HTTP request line; closed", self.client_address)
                    self.close_connection = True
                    _drain_and_close(self.connection)
                    return
                super().handle_one_request()

            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/metrics":
                    body = metrics.render(topics()).encode()
                    kind = "text/plain; version=0.0.4; charset=utf-8"
                elif self.path.split("?")[0] == "/topics.json":
                    body = json.dumps([_topic_row(t) for t in topics()]).encode()
                    kind = "application/json"
                elif self.path.split("?")[0] == "/":
                    body = status_page(topics(), metrics, title).encode()
                    kind = "text/html; charset=utf-8"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("metrics http: " + format, *args)

        self.httpd = _HTTPServer((host, port), Handler)
        self.address = self.httpd.server_address
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="luxun-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.ident is not None:  # shutdown() waits for serve_forever: only once it ran
            self.httpd.shutdown()
        self.httpd.server_close()
