#!/usr/bin/env bash
# The official `openai` Python client against a real `moeflux serve` of the
# demo model (tools/openai_client_test.py), as CI runs it after `cargo test`.
#
#   tools/openai_ci.sh [path/to/moeflux]     # default target/debug/moeflux
#
# Makes target/ci-venv with tools/requirements-ci.txt (skipped, saying so,
# only when pip cannot reach the package registry), converts the demo model
# to target/ci-demo-model, starts the server on a free port, runs the
# checks, and stops the server it started.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug/moeflux}
venv=target/ci-venv
log=target/ci-openai-pip.log

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/pip" install -q --disable-pip-version-check -r tools/requirements-ci.txt >"$log" 2>&1; then
    if grep -qiE "from versions: none|connection|resolve|network|timed out|unreachable|proxy|ssl" "$log"; then
        echo "openai client test SKIPPED: pip cannot reach the package registry:"
        tail -n 3 "$log"
        exit 0
    fi
    cat "$log"
    echo "openai client test: pip install -r tools/requirements-ci.txt failed" >&2
    exit 1
fi

model=target/ci-demo-model
"$bin" convert tests/fixtures/demo_kjv "$model" --force >/dev/null
serve_log=target/ci-openai-serve.log
"$bin" serve --model "$model" --host 127.0.0.1 --port 0 2>"$serve_log" >/dev/null &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
addr=
for _ in $(seq 1 300); do
    addr=$(sed -n 's/^listening on http:\/\/\([^ ]*\).*/\1/p' "$serve_log")
    [ -n "$addr" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then
        cat "$serve_log"
        echo "moeflux serve exited before it was ready" >&2
        exit 1
    fi
    sleep 0.2
done
if [ -z "$addr" ]; then
    cat "$serve_log"
    echo "moeflux serve was not ready within 60 s" >&2
    exit 1
fi
"$venv/bin/python" tools/openai_client_test.py "http://$addr/v1"
