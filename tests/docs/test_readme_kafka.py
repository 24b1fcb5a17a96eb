"""The README's Kafka quickstart, run for real against a broker with its Kafka port on.

The section :data:`KAFKA` holds a ```python block for kafka-python (``from kafka
import``) and one for confluent-kafka (``from confluent_kafka import``), and may hold a
```sh block of ``luxun serve ... --kafka-port N`` lines (not run: the test's broker
runs already). Each Python block is run as written (tests/docs/test_readme.py's
:data:`~tests.docs.test_readme.DRIVER`), with its ``127.0.0.1:N`` / ``localhost:N``
addresses pointed at the test broker's Kafka port; it must exit 0 and leave records in
the broker's topics, and every record it wrote must be read back by a Kafka consumer.

Until the README has the section, these tests are skipped with that reason.
"""

from __future__ import annotations

import re
import shlex
import time

import pytest

from tests._broker import BrokerProcess

from .conftest import StartBroker
from .test_readme import BLOCK_TIMEOUT_S, README, Block, parse_blocks, run_python

pytestmark = pytest.mark.timeout(120)

KAFKA = "Quickstart: Kafka clients"
#: What marks each Python block: its client library's import.
CLIENTS = {"kafka-python": "from kafka import", "confluent-kafka": "from confluent_kafka import"}
_ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|localhost):\d+\b")


def kafka_blocks() -> list[Block]:
    blocks = [b for b in parse_blocks(README) if b.section == KAFKA]
    if not blocks:
        headings = [line.lstrip("#").strip() for line in README.read_text().splitlines() if line.startswith("#")]
        near = [h for h in headings if "kafka" in h.lower() and "quickstart" in h.lower()]
        assert not near, f"{README}: the Kafka quickstart is under {near}; these tests look for '{KAFKA}'"
        pytest.skip(f"{README} has no '{KAFKA}' section yet")
    return blocks


def client_block(client: str) -> Block:
    marker = CLIENTS[client]
    found = [b for b in kafka_blocks() if b.lang == "python" and marker in b.code]
    if len(found) != 1:
        pytest.fail(f"{README}: expected one ```python block with {marker!r} under '{KAFKA}', found {len(found)}")
    return found[0]


def test_every_kafka_quickstart_block_is_run() -> None:
    """Each block of the section is one of the client blocks or a `luxun serve` line."""
    for blk in kafka_blocks():
        if blk.lang == "python":
            clients = [name for name, marker in CLIENTS.items() if marker in blk.code]
            assert len(clients) == 1, f"{README}:{blk.line}: a python block for one of {list(CLIENTS)}"
        elif blk.lang == "sh":
            for line in blk.code.splitlines():
                tokens = shlex.split(line, comments=True)
                if not tokens:
                    continue
                assert tokens[0].endswith("luxun") and tokens[1:2] == ["serve"], (
                    f"{README}:{blk.line}: only `luxun serve` lines are expected in the sh block, not {line!r}"
                )
                assert "--kafka-port" in tokens, f"{README}:{blk.line}: {line!r} has no --kafka-port"
        else:
            pytest.fail(f"{README}:{blk.line}: a ```{blk.lang} block under '{KAFKA}' that no test runs")


def records_by_topic(broker: BrokerProcess) -> dict[str, list[bytes | None]]:
    """Every record value of every topic (partition by partition) through confluent-kafka."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "readme-check", "enable.auto.commit": False}
    )
    try:
        out: dict[str, list[bytes | None]] = {}
        for name, topic in consumer.list_topics(timeout=10).topics.items():
            for p in sorted(topic.partitions):
                low, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
                if high <= low:
                    continue
                consumer.assign([TopicPartition(name, p, low)])
                values: list[bytes | None] = []
                deadline = time.monotonic() + 15
                while len(values) < high - low and time.monotonic() < deadline:
                    m = consumer.poll(0.5)
                    if m is not None and m.error() is None:
                        values.append(m.value())
                assert len(values) == high - low, f"{name}-{p}: read {len(values)} of {high - low} records"
                out.setdefault(name, []).extend(values)
        return out
    finally:
        consumer.close()


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_kafka_quickstart(brokers: StartBroker, client: str) -> None:
    blk = client_block(client)
    broker = brokers(kafka=True)
    addresses = _ADDRESS.findall(blk.code)
    assert addresses, f"{README}:{blk.line}: no 127.0.0.1:PORT or localhost:PORT address in the {client} block"
    code = _ADDRESS.sub(broker.bootstrap, blk.code)
    run_python(blk, code, "", timeout_s=BLOCK_TIMEOUT_S)
    stored = records_by_topic(broker)
    assert stored and any(stored.values()), f"{README}:{blk.line}: the {client} block left no record in any topic"
