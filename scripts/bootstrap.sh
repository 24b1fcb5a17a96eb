#!/usr/bin/env bash
# Create ./.venv and install luxun with the given extras (default: none).
# Re-running is cheap: it reinstalls only when setup.cfg/pyproject.toml or the extras change.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
stamp=".venv/.installed-$(cat setup.cfg pyproject.toml setup.py luxun/_records.c | sha1sum | cut -c1-12)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    if [ -n "$extras" ]; then
        .venv/bin/python -m pip install -q -e ".[$extras]"
    else
        .venv/bin/python -m pip install -q -e .
    fi
    touch "$stamp"
fi
