"""Kafka partitions and record offsets on luxun topics: the one mapping both doors use.

A Kafka topic is a luxun topic; its partitions are big arrays:

* partition 0 of topic ``T`` is the luxun topic ``T`` itself (what Thrift clients read
  and write), so a one-partition topic is shared by both protocols;
* partition ``p > 0`` is the luxun topic ``T~p`` (``~`` is not allowed in Kafka topic
  names, so these never collide with a topic a Kafka client names).

A record batch that arrives in one Produce request is stored as ONE item (kind
:data:`KIND_KAFKA_BATCH`) holding as many record offsets as it has records; Kafka
offsets count records, and the big array numbers them (``BigArray.next_offset``,
``end_offset``, ``find_offset``: the end offset of each item is stored in its index
slot, see :mod:`bigarray.format`). An item written by a Thrift client (kind
:data:`KIND_LUXUN`, a Luxun message pack) is one record. A Thrift consumer gets a
stored batch as one pack of its records' values (:func:`luxun.records.batch_to_pack`);
a Kafka consumer gets a run of Thrift items as a batch built on the fly
(:func:`luxun.records.luxun_items_to_batch`).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "KIND_KAFKA_BATCH",
    "KIND_LUXUN",
    "PARTITION_SEPARATOR",
    "partition_of",
    "partition_topic",
]

#: Item kinds (the bigarray ``kind`` tag of each item).
KIND_LUXUN: Final = 0
KIND_KAFKA_BATCH: Final = 1

#: Between a topic's name and its partition number in the luxun topic of partition p > 0.
PARTITION_SEPARATOR: Final = "~"


def partition_topic(topic: str, partition: int) -> str:
    """The luxun topic that holds ``partition`` of Kafka topic ``topic``."""
    if partition < 0:
        raise ValueError(f"partition {partition} of topic {topic!r} is negative")
    return topic if partition == 0 else f"{topic}{PARTITION_SEPARATOR}{partition}"


def partition_of(name: str) -> tuple[str, int]:
    """The Kafka topic and partition a luxun topic holds (``("T", 0)`` for ``T``)."""
    topic, sep, number = name.rpartition(PARTITION_SEPARATOR)
    if sep and topic and number.isdigit() and not number.startswith("0"):
        return topic, int(number)
    return name, 0
