#!/usr/bin/env bash
# Install what tests/broker/test_interop.py needs, only what is missing:
#   - Debian: thrift-compiler (the `thrift` code generator), libthrift-java, libslf4j-java;
#   - the venv: Apache Thrift's Python library (`thrift`).
# Idempotent and quiet; exits 0 (a missing tool makes the interop tests skip, not fail).
set -uo pipefail
cd "$(dirname "$0")/.."

missing=()
for pkg in thrift-compiler libthrift-java libslf4j-java; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo -n"
    fi
    export DEBIAN_FRONTEND=noninteractive
    if ! $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
        $sudo apt-get update -qq >/dev/null 2>&1 || true
        $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
            || echo "install-interop-deps: could not install ${missing[*]}" >&2
    fi
fi

if [ -x .venv/bin/python ] && ! .venv/bin/python -c "import thrift.transport.TSocket" >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q "thrift>=0.16,<1" >/dev/null 2>&1 \
        || echo "install-interop-deps: could not pip install thrift into .venv" >&2
fi
exit 0
