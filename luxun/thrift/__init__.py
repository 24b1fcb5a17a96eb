"""The Thrift door: Java Luxun's ``QueueService``, wire-compatible with Luxun 0.6.2.

:mod:`.server` (framed transport, binary protocol, the hand-parsed fast paths, busy
polling) on :mod:`luxun.net`; :mod:`.service` (the handler: Java Luxun's semantics and
result codes on the shared topic manager); :mod:`.wire` (the hand-written encoders and
parsers of the canonical calls). It never imports the Kafka door (:mod:`luxun.kafka`);
an import-linter contract checks it.
"""
