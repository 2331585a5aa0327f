#!/usr/bin/env bash
# Build, on this machine, what tools/device/run.sh needs on the device
# machine (which has no Rust toolchain): the release binary and the CUDA
# test binaries, stripped, in target/devbin/ (ignored by git; name it in the
# device call's `carry`).
set -euo pipefail
cd "$(dirname "$0")/../.."

cargo build --release
mkdir -p target/devbin
for t in backend_ops batch cuda_golden cuda_kernels fast_path; do
    exe=$(cargo test --release --no-run --test "$t" --message-format=json 2>/dev/null |
        grep '"kind":\["test"\]' | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | tail -1)
    strip -o "target/devbin/$t" "$exe"
done
strip -o target/devbin/moeflux target/release/moeflux
cargo build --release --example moe_step_bench
strip -o target/devbin/moe_step_bench target/release/examples/moe_step_bench
du -ch target/devbin/* | tail -1
