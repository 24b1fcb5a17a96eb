#!/usr/bin/env bash
# Create ./.venv and install luxun with the given extras (default: none).
# Re-running is cheap: it reinstalls only when setup.cfg/pyproject.toml or the extras change.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
# luxun's compiled modules (luxun/*.c, bigarray/*.c, see setup.py) need a C compiler and Python's headers;
# without them the install goes on and luxun runs its pure-Python paths. On Debian/Ubuntu
# install what is missing (quietly; a failure only leaves the pure-Python paths).
headers="$("$python" -c 'import os, sysconfig; print(os.path.join(sysconfig.get_paths()["include"], "Python.h"))')"
if { ! command -v cc >/dev/null 2>&1 || [ ! -f "$headers" ]; } && command -v apt-get >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo -n"
    fi
    packages=(gcc libc6-dev)
    [ -f "$headers" ] || packages+=(python3-dev)
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null 2>&1 \
        || { $sudo apt-get update -qq >/dev/null 2>&1; $sudo apt-get install -y -qq --no-install-recommends \
             "${packages[@]}" >/dev/null 2>&1; } \
        || echo "bootstrap: could not install ${packages[*]}: luxun will run its pure-Python paths" >&2
fi
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
stamp=".venv/.installed-$(cat setup.cfg pyproject.toml setup.py luxun/*.c bigarray/*.[ch] | sha1sum | cut -c1-12)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    if [ -n "$extras" ]; then
        .venv/bin/python -m pip install -q -e ".[$extras]"
    else
        .venv/bin/python -m pip install -q -e .
    fi
    touch "$stamp"
fi
