#!/usr/bin/env bash
# On the device machine: the CUDA tests of branch builds made by
# tools/device/prepare_branch.sh (target/devbin/cuda_golden-NAME,
# batch-NAME, moeflux-NAME), one build after the other:
#   tools/device/branch_tests.sh NAME...
# Each build's tests find their fixtures through /work/branch-wt (linked
# here to this tree) and convert them with that build's moeflux (copied
# to target/branches/release/moeflux). A line per suite goes to
# $OUT/branch-tests.txt, the logs to $OUT/NAME-SUITE.log.
set -uo pipefail
OUT=${OUT:-/tmp/moeflux-out}
mkdir -p "$OUT" target/branches/release /work
export MOEFLUX_KERNEL_CACHE=/tmp/moeflux-kernels
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
BIN=$(pwd)/target/devbin
ln -sfn "$(pwd)" /work/branch-wt
: >"$OUT/branch-tests.txt"
for name in "$@"; do
    cp -f "$BIN/moeflux-$name" target/branches/release/moeflux || continue
    for suite in "cuda_golden" "batch cuda_"; do
        read -r test filter <<<"$suite"
        exe=$BIN/$test-$name
        [ -x "$exe" ] || { echo "$name $test: no binary" >>"$OUT/branch-tests.txt"; continue; }
        t0=$SECONDS
        # shellcheck disable=SC2086
        "$exe" $filter --test-threads=2 --nocapture >"$OUT/$name-$test.log" 2>&1
        echo "$name $test (rc $?, $((SECONDS - t0)) s): $(grep -E '^test result' "$OUT/$name-$test.log")" >>"$OUT/branch-tests.txt"
        grep -E "panicked|FAILED" "$OUT/$name-$test.log" | head -5 >>"$OUT/branch-tests.txt"
    done
done
cat "$OUT/branch-tests.txt"
