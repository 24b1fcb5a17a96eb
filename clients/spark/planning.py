"""Planning: where each (topic, broker) pair starts and ends, and how index ranges become
input partitions and per-trigger shares.

Positions by time use ``findClosestIndexByTime``. A luxun broker answers with the index
whose append time is closest to the asked time (ties: the earlier), its ``tail`` for a
time before the first item and ``head - 1`` for one after the last, with that item's
time; an empty topic is ``TOPIC_IS_EMPTY``. :func:`index_at_time` turns that into
Kafka's rule: the first index whose append time is >= the time, the head when every
item is older (an empty topic: its head). Append times come from the broker's clock;
the lookup is a binary search, exact while they do not go backwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from idl import luxun_thrift as T

from ..connection import BrokerConnection
from ..errors import LuxunClientError, broker_error
from .options import AtTime, Key, ReadOptions, Spec

_SUCCESS = T.ResultCode.SUCCESS
_TRY_LATER = T.ResultCode.TRY_LATER
_E = T.ErrorCode


class LuxunDataLossError(LuxunClientError):
    """Items a query must read are gone (retention, a deleted or recreated topic)."""


def connect(broker: str, opts: ReadOptions | Any) -> BrokerConnection:
    """A connection to ``broker`` with the query's timeout (for connecting too)."""
    return BrokerConnection(broker, timeout_ms=opts.timeout_ms)


def _lookup(conn: BrokerConnection, topic: str, when: int) -> Any:
    request = T.FindClosestIndexByTimeRequest(timestamp=when, topic=topic)
    return conn.call("findClosestIndexByTime", request)


def topic_ends(conn: BrokerConnection, topic: str) -> tuple[int, int] | None:
    """(tail, head) of ``topic``, or None when the broker does not have it."""
    for _ in range(10):
        out = []
        for when in (T.EARLIEST_TIME, T.LATEST_TIME):
            r = _lookup(conn, topic, when)
            res = r.result
            if res.resultCode == _SUCCESS:
                out.append(r.index)
            elif res.errorCode == _E.TOPIC_NOT_EXIST:
                return None
            elif res.resultCode == _TRY_LATER:
                break  # the topic changed during the lookup
            else:
                raise broker_error(res.resultCode, res.errorCode, f"findClosestIndexByTime({topic!r}) on "
                                   f"{conn.where}: {res.errorMessage}")  # fmt: skip
        if len(out) == 2:
            return out[0], max(out[0], out[1])
        time.sleep(0.05)
    raise LuxunClientError(f"topic {topic!r} on {conn.where} kept changing during index lookups")


def index_at_time(conn: BrokerConnection, topic: str, ms: int, tail: int, head: int) -> int:
    """The first index of ``topic`` whose append time is >= ``ms``; ``head`` when there
    is none; kept within [tail, head] (the ends planning saw)."""
    for _ in range(10):
        r = _lookup(conn, topic, ms)
        res = r.result
        if res.resultCode == _SUCCESS:
            index = int(r.index) if (r.timestampOfIndex or 0) >= ms else int(r.index) + 1
            return max(tail, min(index, head))
        if res.errorCode in (_E.TOPIC_IS_EMPTY, _E.TOPIC_NOT_EXIST):
            return head
        if res.resultCode != _TRY_LATER:
            raise broker_error(res.resultCode, res.errorCode, f"findClosestIndexByTime({topic!r}, {ms}) on "
                               f"{conn.where}: {res.errorMessage}")  # fmt: skip
        time.sleep(0.05)
    raise LuxunClientError(f"topic {topic!r} on {conn.where} kept changing during a lookup by time")


def all_ends(opts: ReadOptions, keys: Sequence[Key] | None = None) -> dict[Key, tuple[int, int]]:
    """(tail, head) of every (topic, broker) pair that exists."""
    out: dict[Key, tuple[int, int]] = {}
    wanted = keys if keys is not None else opts.keys()
    for broker in opts.servers:
        mine = [topic for topic, b in wanted if b == broker]
        if not mine:
            continue
        with connect(broker, opts) as conn:
            for topic in mine:
                ends = topic_ends(conn, topic)
                if ends is not None:
                    out[(topic, broker)] = ends
    return out


def resolve(
    opts: ReadOptions, ends: dict[Key, tuple[int, int]], named: dict[Key, Spec], default: Spec
) -> dict[Key, int]:
    """The index each pair of ``ends`` starts (or ends) at: its spec in ``named``, else
    ``default``; times are looked up on the brokers (one connection per broker)."""
    out: dict[Key, int] = {}
    by_time: dict[str, list[tuple[Key, int]]] = {}
    for key, (tail, head) in ends.items():
        spec = named.get(key, default)
        if isinstance(spec, AtTime):
            by_time.setdefault(key[1], []).append((key, spec.ms))
        else:
            out[key] = resolve_spec(spec, tail, head)
    for broker, wanted in by_time.items():
        with connect(broker, opts) as conn:
            for key, ms in wanted:
                out[key] = index_at_time(conn, key[0], ms, *ends[key])
    return out


def resolve_spec(spec: Spec, tail: int, head: int) -> int:
    if spec == "earliest":
        return tail
    if spec == "latest":
        return head
    assert isinstance(spec, int)
    return spec


# -- partitions ------------------------------------------------------------------------
@dataclass
class LuxunPartition(InputPartition):
    """Items [start, end) of ``topic`` on ``broker``. ``lenient``: items below the tail
    are skipped silently (a range planned from 0 for a pair new to a streaming query)."""

    topic: str
    broker: str
    start: int
    end: int
    lenient: bool = False


def split(ranges: Sequence[LuxunPartition], min_partitions: int | None) -> list[LuxunPartition]:
    """Split non-empty ranges into about ``min_partitions`` parts (in proportion to size)."""
    ranges = [r for r in ranges if r.end > r.start]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    out: list[LuxunPartition] = []
    for r in ranges:
        size = r.end - r.start
        parts = max(1, min(size, round(size * min_partitions / total)))
        for i in range(parts):
            lo = r.start + size * i // parts
            hi = r.start + size * (i + 1) // parts
            out.append(LuxunPartition(r.topic, r.broker, lo, hi, r.lenient))
    return out


def apportion(avail: dict[Key, int], limit: int | None) -> dict[Key, int]:
    """Share ``limit`` between pairs in proportion to what each has waiting."""
    total = sum(avail.values())
    if limit is None or total <= limit:
        return dict(avail)
    take = {k: a * limit // total for k, a in avail.items()}
    left = limit - sum(take.values())
    for k in sorted(avail):
        if left <= 0:
            break
        if take[k] < avail[k]:
            take[k] += 1
            left -= 1
    return take


def items_for_rows(counts: Sequence[int], mean: float, rows: int, most: int) -> int:
    """How many items (packs), at most ``most``, fit in ``rows`` rows: the first packs'
    message ``counts`` are known, later packs are taken to hold ``mean`` messages."""
    n = used = 0
    for c in counts[:most]:
        if used + c > rows:
            return n
        used += c
        n += 1
    if n < most and mean > 0:
        n += min(most - n, int((rows - used) // mean))
    return n


def offsets(flat: dict[Key, int]) -> dict[str, dict[str, int]]:
    """{(topic, broker): index} -> Spark's offset JSON ``{"topic": {"host:port": index}}``."""
    out: dict[str, dict[str, int]] = {}
    for topic, broker in sorted(flat):
        out.setdefault(topic, {})[broker] = flat[(topic, broker)]
    return out


def flat(offsets: dict[str, Any]) -> dict[Key, int]:
    return {(t, b): int(i) for t, per in offsets.items() for b, i in per.items()}


def keys_by_broker(keys: Iterable[Key]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for topic, broker in keys:
        out.setdefault(broker, []).append(topic)
    return out
