#!/usr/bin/env bash
# The main job: install, then start a broker on its defaults
# (data in ./luxun-data, QueueService on 127.0.0.1:9092, metrics on 127.0.0.1:9093),
# with the Kafka port on 127.0.0.1:9094 (the README's Kafka quickstart uses it).
# Extra arguments go to `luxun serve` after it (e.g. scripts/run.sh --config server.properties;
# scripts/run.sh --kafka-port 0 turns the Kafka port off).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python -m luxun serve --kafka-port 9094 "$@"
