#!/usr/bin/env bash
# The main job: install, then start a broker on its defaults
# (data in ./luxun-data, QueueService on 127.0.0.1:9092, metrics on 127.0.0.1:9093).
# Extra arguments go to `luxun serve` (e.g. scripts/run.sh --config server.properties).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python -m luxun serve "$@"
