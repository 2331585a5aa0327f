#!/usr/bin/env bash
# Pack this machine's `perf` and the shared libraries it links into
# target/perfpack/perf.tar.xz (about 9 MB; the device machine has no perf),
# with the release binary stripped of its debug information but not of
# its symbols (`moeflux-sym`, ~4 MB compressed; perf unwinds with its
# .eh_frame). Name target/perfpack in the device call's `carry`; there:
#
#   tar -C /tmp -xJf target/perfpack/perf.tar.xz
#   xz -dc target/perfpack/moeflux-sym.xz > /tmp/mf && chmod +x /tmp/mf
#   P="/tmp/perfpack/lib/ld-linux-x86-64.so.2 --library-path /tmp/perfpack/lib /tmp/perfpack/perf"
#   /tmp/mf bench ... & sleep 15            # past the model's load
#   $P record -F 2000 --call-graph dwarf,16384 -t $! -o /tmp/cg.data -- sleep 3
#   $P report -i /tmp/cg.data --children --stdio --no-call-graph | head -100
#
# (-t follows the thread that drives the GPU; `--sort pid` without -t
# gives every thread's share.) "Where a streamed token's time goes, from
# the host" in docs/notes/2026-11-22-to-12-02-benchmark-log.md was
# measured this way.
set -euo pipefail
cd "$(dirname "$0")/../.."
perf=$(readlink -f "$(command -v perf)")
cargo build --release
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/perfpack/lib" target/perfpack
cp "$perf" "$tmp/perfpack/perf"
ldd "$perf" | grep -o '/[^ ]*' | while read -r lib; do cp -L "$lib" "$tmp/perfpack/lib/"; done
tar -C "$tmp" -cf - perfpack | xz -T2 -3 > target/perfpack/perf.tar.xz
strip --strip-debug -o "$tmp/moeflux-sym" target/release/moeflux
xz -T2 -6 -c "$tmp/moeflux-sym" > target/perfpack/moeflux-sym.xz
du -ch target/perfpack/* | tail -1
