"""The agent's status pages over HTTP on 127.0.0.1, with Dory's routes and JSON shapes.

=================================  ============================================================
GET ``/server_info/{plain,json}``  pid, version, since, now, brokers (up/down), inputs, pool
GET ``/counters/{plain,json}``     ``{"pid","version","since","now","counters":[{"location","name","value"}]}``
GET ``/discards/{plain,json}``     ``{pid, version, since, now, interval, unfinished_report,
                                   finished_report, totals}`` (``totals``: ours, since start)
GET ``/queues/{plain,json}``       ``{pid, version, now, "sending":[{"topic","batch","send_wait",
                                   "ack_wait"}], "new"}``
GET ``/metadata_fetch_time/...``   when the topic list was last read (topicAutocreate off)
POST ``/metadata_update``          reads the brokers' topic lists again (harmless otherwise);
                                   ``/sys/metadata_update`` too (the path Dory's doc names)
GET ``/metrics``                   Prometheus text format
any other GET                      a small HTML front page listing the above
=================================  ============================================================

Unlike Dory (every interface unless ``loopbackOnly``), it listens on 127.0.0.1 only.

Thread-safety: one thread per request (``ThreadingHTTPServer``); the agent's views are safe
to read from any thread.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .core import VERSION, Agent
from .inputs import TRANSPORTS

_FRONT = """<html><head><title>luxun agent</title></head><body><h1>luxun agent (Dory-compatible)</h1><ul>
<li>server info: <a href="/server_info/plain">plain</a> <a href="/server_info/json">json</a></li>
<li>counters: <a href="/counters/plain">plain</a> <a href="/counters/json">json</a></li>
<li>discards: <a href="/discards/plain">plain</a> <a href="/discards/json">json</a></li>
<li>queued messages: <a href="/queues/plain">plain</a> <a href="/queues/json">json</a></li>
<li>metadata fetch time: <a href="/metadata_fetch_time/plain">plain</a>
<a href="/metadata_fetch_time/json">json</a></li>
<li><a href="/metrics">Prometheus metrics</a></li></ul>
<form method="post" action="/metadata_update"><input type="submit" value="Update metadata"></form>
</body></html>"""


def _stamp(t: float) -> str:
    return f"{int(t)} {time.strftime('%a %b %d %H:%M:%S %Y', time.localtime(t))}"


class StatusPages:
    """The documents, built from an agent (usable without the HTTP server)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def _head(self) -> dict[str, Any]:
        return {"pid": self.agent.pid, "version": VERSION, "since": int(self.agent.stats.since),
                "now": int(time.time())}  # fmt: skip

    def server_info(self) -> dict[str, Any]:
        a = self.agent
        cfg = a.config
        return {
            **self._head(),
            "brokers": a.brokers(),
            "inputs": {"unix_dgram": cfg.dgram_path, "unix_stream": cfg.stream_path, "tcp_port": a.tcp_port},
            "pool": {"used_bytes": a.pool.used, "peak_bytes": a.pool.peak, "max_bytes": a.pool.capacity},
            "ignored_settings": list(cfg.ignored),
        }

    def counters(self) -> dict[str, Any]:
        return {**self._head(), "counters": [{"location": "clients/agent", "name": k, "value": v}
                                             for k, v in sorted(self.agent.counters().items())]}  # fmt: skip

    def discards(self) -> dict[str, Any]:
        d = self.agent.stats.discards_json()
        return {"pid": self.agent.pid, "version": VERSION, **d}

    def queues(self) -> dict[str, Any]:
        rows = [{"topic": t, **q} for t, q in sorted(self.agent.queues().items())]
        return {"pid": self.agent.pid, "version": VERSION, "now": int(time.time()), "sending": rows,
                "new": sum(n for _, _, _, n in list(self.agent._inq))}  # fmt: skip

    def metadata_fetch_time(self) -> dict[str, Any]:
        ms = self.agent.metadata_updated_ms
        return {"pid": self.agent.pid, "version": VERSION, "now": int(time.time() * 1000), "last_update": ms,
                "last_modified": ms}  # fmt: skip

    def plain(self, what: str) -> str:
        if what == "counters":
            c = self.counters()
            lines = [f"now={_stamp(c['now'])}", f"since={_stamp(c['since'])}", f"pid={c['pid']}",
                     f"version={c['version']}", ""]  # fmt: skip
            lines += [f"[{r['location']}].{r['name']}={r['value']}" for r in c["counters"]]
            return "\n".join(lines) + "\n"
        if what == "discards":
            d = self.discards()
            lines = [f"pid: {d['pid']}", f"version: {d['version']}", f"since: {_stamp(d['since'])}",
                     f"now: {_stamp(d['now'])}", f"report interval in seconds: {d['interval']}"]  # fmt: skip
            for title, r in (("current (unfinished) reporting period", d["unfinished_report"]),
                             ("latest finished reporting period", d["finished_report"])):  # fmt: skip
                if r is None:
                    continue
                lines += ["", f"{title}:", f"    report ID: {r['id']}", f"    start time: {_stamp(r['start_time'])}",
                          f"    malformed msg count: {r['malformed_msg_count']}",
                          f"    UNIX stream unclean disconnect count: {r['unix_stream_unclean_disconnect_count']}",
                          f"    TCP unclean disconnect count: {r['tcp_unclean_disconnect_count']}",
                          f"    unsupported API key msg count: {r['unsupported_api_key_msg_count']}",
                          f"    unsupported version msg count: {r['unsupported_version_msg_count']}",
                          f"    bad topic msg count: {r['bad_topic_msg_count']}", ""]  # fmt: skip
                lines += [f"    recent malformed: {m}" for m in r["recent_malformed"]]
                lines += [f"    recent bad topic: {m}" for m in r["recent_bad_topic"]]
                lines += [f"    rate limit discard topic: {len(x['topic'])}[{x['topic']}] count {x['count']}"
                          for x in r["rate_limit_discard"]]  # fmt: skip
                lines += [f"    discard topic: {len(x['topic'])}[{x['topic']}] begin [{x['min_timestamp']}] end "
                          f"[{x['max_timestamp']}] count {x['count']}" for x in r["discard_topic"]]  # fmt: skip
            lines += ["", "since start, by reason:"]
            lines += [f"    {k}: {v}" for k, v in d["totals"]["by_reason"].items()]
            return "\n".join(lines) + "\n"
        if what == "queues":
            q = self.queues()
            lines = [f"pid: {q['pid']}", f"now: {_stamp(q['now'])}", f"version: {q['version']}", ""]
            tot = {"batch": 0, "send_wait": 0, "ack_wait": 0}
            for r in q["sending"]:
                lines.append(f"batch: {r['batch']:>10}  send_wait: {r['send_wait']:>10}  ack_wait: "
                             f"{r['ack_wait']:>10}  topic: [{r['topic']}]")  # fmt: skip
                for k in tot:
                    tot[k] += r[k]
            lines += ["", f"{q['new']:>10} total new"] + [f"{v:>10} total {k}" for k, v in tot.items()]
            lines.append(f"{q['new'] + sum(tot.values()):>10} total (all states: new + batch + send_wait + ack_wait)")
            return "\n".join(lines) + "\n"
        doc = self.server_info() if what == "server_info" else self.metadata_fetch_time()
        return "\n".join(f"{k}: {v}" for k, v in doc.items()) + "\n"

    def metrics(self) -> str:
        a = self.agent
        out = [
            "# HELP luxun_agent_received_total Messages read, per input.",
            "# TYPE luxun_agent_received_total counter",
        ]
        out += [f'luxun_agent_received_total{{input="{t}"}} {n}' for t, n in zip(TRANSPORTS, a.received, strict=True)]
        out += ["# HELP luxun_agent_delivered_total Messages stored by a broker, per topic.",
                "# TYPE luxun_agent_delivered_total counter"]  # fmt: skip
        out += [f'luxun_agent_delivered_total{{topic="{_esc(t)}"}} {n}' for t, n in sorted(a.stats.delivered.items())]
        out += ["# HELP luxun_agent_discarded_total Messages discarded, per reason and topic (\"\" unknown).",
                "# TYPE luxun_agent_discarded_total counter"]  # fmt: skip
        with a.stats.lock:
            totals = {r: dict(t) for r, t in a.stats.totals.items()}
        for reason, by_topic in totals.items():
            if not by_topic:
                out.append(f'luxun_agent_discarded_total{{reason="{reason}",topic=""}} 0')
            for topic, n in sorted(by_topic.items()):
                out.append(f'luxun_agent_discarded_total{{reason="{reason}",topic="{_esc(topic)}"}} {n}')
        out += ["# HELP luxun_agent_pool_bytes Bytes of the memory pool in use.", "# TYPE luxun_agent_pool_bytes gauge",
                f"luxun_agent_pool_bytes {a.pool.used}", "# TYPE luxun_agent_pool_max_bytes gauge",
                f"luxun_agent_pool_max_bytes {a.pool.capacity}",
                "# HELP luxun_agent_key_dropped_total Messages whose Dory Key was dropped.",
                "# TYPE luxun_agent_key_dropped_total counter", f"luxun_agent_key_dropped_total {a.keys_dropped}",
                "# HELP luxun_agent_broker_up 1 when the broker's last call succeeded or its back-off is over.",
                "# TYPE luxun_agent_broker_up gauge"]  # fmt: skip
        out += [f'luxun_agent_broker_up{{broker="{b["broker"]}"}} {int(b["up"])}' for b in a.brokers()]
        return "\n".join(out) + "\n"


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_ROUTES = {"server_info", "counters", "discards", "queues", "metadata_fetch_time"}


class StatusServer:
    """The HTTP server in a thread; ``port`` 0 picks a free port (see :attr:`port`)."""

    def __init__(self, agent: Agent, port: int) -> None:
        pages = StatusPages(agent)

        class Handler(BaseHTTPRequestHandler):
            server_version = "luxun-agent"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, code: int, body: str, ctype: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                agent.stats.incr("HttpRequest")
                path = self.path.split("?", 1)[0].rstrip("/")
                if path == "/metrics":
                    return self._send(200, pages.metrics(), "text/plain; version=0.0.4")
                parts = path.strip("/").split("/")
                if len(parts) == 2 and parts[0] in _ROUTES and parts[1] in ("plain", "json"):
                    if parts[1] == "plain":
                        return self._send(200, pages.plain(parts[0]), "text/plain")
                    doc = getattr(pages, parts[0])()
                    return self._send(200, json.dumps(doc, indent=2) + "\n", "application/json")
                return self._send(200, _FRONT, "text/html")

            def do_POST(self) -> None:
                path = self.path.split("?", 1)[0].rstrip("/")
                if path in ("/metadata_update", "/sys/metadata_update"):
                    agent.request_metadata_update()
                    return self._send(200, "metadata update requested\n", "text/plain")
                return self._send(404, "not found\n", "text/plain")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="luxun-agent-http", daemon=True)

    def start(self) -> StatusServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()


__all__ = ["StatusPages", "StatusServer"]
