"""Produce and Fetch responses laid out by hand: the data path without kio's generic writer.

Every other response is a kio entity built by :func:`luxun.kafka.protocol.build` and
written by kio. For the two APIs a producer or consumer sends thousands of times a
second that costs more than the request itself (building the entity from plain values
and kio's writer: about 80 % of the broker's CPU per one-batch Produce request), so
their layouts are written here with :mod:`struct`, field by field as Kafka's
``ProduceResponse.json`` and ``FetchResponse.json`` define them for the versions the
broker serves (Produce v3-v9, Fetch v4-v12; v9 and v12 are flexible: compact arrays and
strings, an empty tagged-field section after each struct). tests/kafka/test_responses.py
checks them byte for byte against kio's encoding of the same values for every version.

A Fetch response is returned as a list of buffers, the stored record batches among
them as they were read (no copy into one big frame: the server sends the list with
one scatter/gather write).

Thread-safety: pure functions.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

__all__ = ["FetchPartition", "ProducePartition", "clean_produce_response", "fetch_response", "produce_response"]

_I32: Final = struct.Struct(">i")
# index, error code, base offset, log append time
_PRODUCE_V3: Final = struct.Struct(">ihqq")
# ... and log start offset (v5+)
_PRODUCE_V5: Final = struct.Struct(">ihqqq")
# throttle time, error code, session id (v7+)
_FETCH_HEAD_V7: Final = struct.Struct(">ihi")
# partition index, error code, high watermark, last stable offset (v4+)
_FETCH_V4: Final = struct.Struct(">ihqq")
# ... and log start offset (v5+)
_FETCH_V5: Final = struct.Struct(">ihqqq")
_NO_TAGS: Final = b"\0"
# throttle_time_ms 0, and the tagged fields after it (flexible versions)
_THROTTLE: Final = b"\0\0\0\0"
_THROTTLE_TAGGED: Final = _THROTTLE + _NO_TAGS
# producer id, first offset (an aborted transaction)
_ABORTED: Final = struct.Struct(">qq")


class ProducePartition(NamedTuple):
    partition: int
    error_code: int
    base_offset: int
    log_append_time: int  # -1: none (CreateTime)
    log_start_offset: int
    error_message: str | None
    #: (batch_index, batch_index_error_message) of records at fault (v8+, KIP-467).
    record_errors: tuple[tuple[int, str | None], ...] = ()


class FetchPartition(NamedTuple):
    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    records: Any  # bytes-like, or None
    #: (producer id, first offset) of aborted transactions (read_committed); None: null.
    aborted: Sequence[tuple[int, int]] | None = None


# One byte each: every array length and name length below 127 (nearly all of them).
_SMALL_UVARINTS: Final = tuple(bytes((n,)) for n in range(0x80))


def _uvarint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL_UVARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _array_len(n: int, flexible: bool) -> bytes:
    return _uvarint(n + 1) if flexible else _I32.pack(n)


@functools.lru_cache(maxsize=1024)  # topic names, answered again and again
def _name(s: str, flexible: bool) -> bytes:
    return _string(s, flexible)


def _string(s: str | None, flexible: bool) -> bytes:
    if s is None:
        return b"\0" if flexible else b"\xff\xff"
    raw = s.encode("utf-8")
    return (_uvarint(len(raw) + 1) if flexible else len(raw).to_bytes(2, "big")) + raw


def _clean_tail(version: int) -> bytes:
    """What follows a partition's offsets in a ProduceResponse when it has no record
    errors and no message (the answer to nearly every produce)."""
    flexible = version >= 9
    tail = _array_len(0, flexible) + _string(None, flexible) if version >= 8 else b""
    return tail + _NO_TAGS if flexible else tail


_CLEAN_TAILS: Final = {version: _clean_tail(version) for version in range(3, 10)}


def produce_response(version: int, topics: Sequence[tuple[str, Sequence[ProducePartition]]]) -> bytes:
    """The body of a ProduceResponse (v3-v9) for ``topics``: (name, partitions)."""
    flexible = version >= 9
    clean = _CLEAN_TAILS[version]
    out = [_array_len(len(topics), flexible)]
    add = out.append
    for name, partitions in topics:
        add(_name(name, flexible))
        add(_array_len(len(partitions), flexible))
        for p in partitions:
            if version >= 5:
                add(_PRODUCE_V5.pack(p.partition, p.error_code, p.base_offset, p.log_append_time, p.log_start_offset))
            else:
                add(_PRODUCE_V3.pack(p.partition, p.error_code, p.base_offset, p.log_append_time))
            if p.error_message is None and not p.record_errors:
                add(clean)
                continue
            if version >= 8:
                add(_array_len(len(p.record_errors), flexible))
                for index, message in p.record_errors:
                    add(_I32.pack(index))
                    add(_string(message, flexible))
                    if flexible:
                        add(_NO_TAGS)
                add(_string(p.error_message, flexible))
            if flexible:
                add(_NO_TAGS)
        if flexible:
            add(_NO_TAGS)
    add(_THROTTLE_TAGGED if flexible else _THROTTLE)
    return b"".join(out)


@functools.lru_cache(maxsize=1024)
def _one_partition_parts(version: int, name: str) -> tuple[bytes, bytes]:
    """What comes before and after the partition's offsets in a ProduceResponse of one
    topic ``name`` and one clean partition (see :func:`clean_produce_response`)."""
    flexible = version >= 9
    head = _array_len(1, flexible) + _name(name, flexible) + _array_len(1, flexible)
    tail = _CLEAN_TAILS[version] + (_NO_TAGS + _THROTTLE_TAGGED if flexible else _THROTTLE)
    return head, tail


def clean_produce_response(
    version: int, name: str, partition: int, base_offset: int, log_append_time: int, log_start_offset: int
) -> bytes:
    """:func:`produce_response` of one topic and one partition stored without error or
    message (what a run of pipelined one-partition requests gets, each), from parts
    laid out once per version and topic."""
    head, tail = _one_partition_parts(version, name)
    if version >= 5:
        return head + _PRODUCE_V5.pack(partition, 0, base_offset, log_append_time, log_start_offset) + tail
    return head + _PRODUCE_V3.pack(partition, 0, base_offset, log_append_time) + tail


def fetch_response(version: int, topics: Sequence[tuple[str, Sequence[FetchPartition]]]) -> list[Any]:
    """The body of a FetchResponse (v4-v12) for ``topics``: (name, partitions), as a
    list of buffers (each partition's records as given, not copied)."""
    flexible = version >= 12
    parts: list[Any] = []
    head = bytearray(_FETCH_HEAD_V7.pack(0, 0, 0) if version >= 7 else b"\0\0\0\0")
    head += _array_len(len(topics), flexible)
    for name, partitions in topics:
        head += _name(name, flexible)
        head += _array_len(len(partitions), flexible)
        for p in partitions:
            if version >= 5:
                head += _FETCH_V5.pack(
                    p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset
                )
            else:
                head += _FETCH_V4.pack(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset)
            if p.aborted is None:
                head += b"\0" if flexible else b"\xff\xff\xff\xff"  # aborted_transactions: null
            else:
                head += _array_len(len(p.aborted), flexible)
                for pid, first in p.aborted:
                    head += _ABORTED.pack(pid, first)
                    if flexible:
                        head += _NO_TAGS
            if version >= 11:
                head += b"\xff\xff\xff\xff"  # preferred_read_replica: -1
            records = p.records
            if records is None:
                head += b"\0" if flexible else b"\xff\xff\xff\xff"
            else:
                n = len(records)
                head += _uvarint(n + 1) if flexible else _I32.pack(n)
                if n:
                    parts.append(bytes(head))
                    parts.append(records)
                    head = bytearray()
            if flexible:
                head += _NO_TAGS
        if flexible:
            head += _NO_TAGS
    if flexible:
        head += _NO_TAGS
    parts.append(bytes(head))
    return parts
