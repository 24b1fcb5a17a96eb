#!/usr/bin/env bash
# The whole test suite: installs what it needs, then lint, types, import contracts, tests.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/bigarray -x).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test,bench,spark
scripts/install-interop-deps.sh   # Debian thrift-compiler and libthrift-java for tests/broker/test_interop.py
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff" && ruff check .
echo "== mypy --strict (bigarray, luxun, idl, clients)" && mypy --strict bigarray luxun idl clients
echo "== import contracts" && lint-imports
echo "== pytest" && python -m pytest "${@:-tests}"
