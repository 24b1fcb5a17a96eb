"""The hand-laid Produce and Fetch responses are byte for byte kio's encoding."""

from __future__ import annotations

import io

import pytest
from kio.serial import entity_writer

from luxun.kafka import protocol as P
from luxun.kafka.responses import (
    FetchPartition,
    ProducePartition,
    clean_produce_response,
    fetch_response,
    produce_response,
)


def kio_body(api_key: int, version: int, **values: object) -> bytes:
    entity = P.build(P.response_schema(api_key, version), **values)
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


PRODUCE_TOPICS = [
    ("events", [ProducePartition(0, 0, 1234, -1, 0, None), ProducePartition(3, 2, -1, -1, -1, "bad crc é")]),
    ("t" * 300, [ProducePartition(1, 0, 1 << 40, 1_700_000_000_123, 17, None)]),
    ("empty", []),
]


@pytest.mark.parametrize("version", range(3, 10))
def test_produce_response_is_kios_encoding(version: int) -> None:
    expected = kio_body(
        0,
        version,
        responses=[
            {
                "name": name,
                "partition_responses": [
                    {
                        "index": p.partition,
                        "error_code": p.error_code,
                        "base_offset": p.base_offset,
                        "log_append_time": None if p.log_append_time < 0 else p.log_append_time,
                        "log_start_offset": p.log_start_offset,
                        "error_message": p.error_message,
                    }
                    for p in parts
                ],
            }
            for name, parts in PRODUCE_TOPICS
        ],
    )
    assert produce_response(version, PRODUCE_TOPICS) == expected


FETCH_TOPICS = [
    (
        "events",
        [
            FetchPartition(0, 0, 100, 100, 0, b"\x01" * 70),
            FetchPartition(1, 0, 5, 5, 5, b""),
            FetchPartition(2, 1, 9, 9, 3, None),
            FetchPartition(3, 0, 1 << 40, 1 << 40, 7, bytearray(b"\x02" * 200)),
            FetchPartition(4, 0, 50, 20, 0, b"\x03" * 80, [(7, 3), (1 << 40, 12)]),
            FetchPartition(5, 0, 50, 50, 0, b"", []),
        ],
    ),
    ("other", [FetchPartition(0, 3, -1, -1, -1, None)]),
    ("none", []),
]


@pytest.mark.parametrize("version", range(4, 13))
def test_fetch_response_is_kios_encoding(version: int) -> None:
    expected = kio_body(
        1,
        version,
        error_code=0,
        session_id=0,
        responses=[
            {
                "topic": name,
                "partitions": [
                    {
                        "partition_index": p.partition_index,
                        "error_code": p.error_code,
                        "high_watermark": p.high_watermark,
                        "last_stable_offset": p.last_stable_offset,
                        "log_start_offset": p.log_start_offset,
                        "aborted_transactions": None
                        if p.aborted is None
                        else [{"producer_id": pid, "first_offset": first} for pid, first in p.aborted],
                        "preferred_read_replica": -1,
                        "records": None if p.records is None else bytes(p.records),
                    }
                    for p in parts
                ],
            }
            for name, parts in FETCH_TOPICS
        ],
    )
    parts = fetch_response(version, FETCH_TOPICS)
    assert b"".join(bytes(x) for x in parts) == expected
    # The records are handed over as they are, not copied.
    assert any(x is FETCH_TOPICS[0][1][3].records for x in parts)


@pytest.mark.parametrize("version", range(3, 10))
@pytest.mark.parametrize("name", ["events", "t" * 300])
def test_a_clean_one_partition_produce_response_is_produce_responses(version: int, name: str) -> None:
    """clean_produce_response (a run's answers) lays out what produce_response does."""
    for offsets in ((1234, -1, 0), (1 << 40, 1_700_000_000_123, 17)):
        expected = produce_response(version, [(name, [ProducePartition(3, 0, *offsets, None)])])
        assert clean_produce_response(version, name, 3, *offsets) == expected
