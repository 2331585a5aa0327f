#!/usr/bin/env bash
# The built-in chat page in a real browser (not part of CI): starts
# `moeflux serve` on the demo model, drives the page in headless Chromium
# (tools/browser/check.mjs: an answer with its statistics line, a long
# answer stopped mid-way) and saves a screenshot.
#
#   tools/chat_page_check.sh [SCREENSHOT.png]     # default target/chat-page.png
#
# Needs Debian's chromium (apt-get install chromium) and Node.js; installs
# playwright-core into tools/browser/node_modules on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
shot=${1:-target/chat-page.png}
bin=target/release/moeflux
[ -x "$bin" ] || cargo build --release
[ -d tools/browser/node_modules/playwright-core ] || (cd tools/browser && npm install --no-audit --no-fund)
model=target/demo-model
[ -f "$model/model_weights.json" ] || "$bin" convert tests/fixtures/demo_kjv "$model" --force
log=target/chat-page-serve.log
: >"$log"
"$bin" serve --model "$model" --port 0 --device cpu 2>"$log" >/dev/null &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
addr=
for _ in $(seq 1 300); do
    addr=$(sed -n 's/^listening on http:\/\/\([^ ]*\).*/\1/p' "$log")
    [ -n "$addr" ] && break
    sleep 0.2
done
[ -n "$addr" ] || { cat "$log"; echo "server not ready" >&2; exit 1; }
node tools/browser/check.mjs "http://$addr/" "$shot"
