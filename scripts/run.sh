#!/usr/bin/env bash
# The main job: install, then run the bigarray demo (the broker comes with issue 3).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python -m bigarray "$@"
