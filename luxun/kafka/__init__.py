"""The Kafka-protocol door: Kafka clients produce to and consume from luxun topics.

How Kafka topics, partitions and offsets map onto luxun topics is written once, below
the doors, in :mod:`luxun.partitions`; the record-batch format in :mod:`luxun.records`.
This package holds what only the Kafka door does: its framing (:mod:`.server` on
:mod:`luxun.net`), request decoding (:mod:`.protocol`, :mod:`.responses`), handlers,
the Kafka view of topics (:mod:`.log`), consumer groups and their offsets. It never
imports the Thrift door (:mod:`luxun.thrift`); an import-linter contract checks it.
"""
