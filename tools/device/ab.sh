#!/usr/bin/env bash
# Builds of moeflux side by side on the device machine, alternated:
#   tools/device/ab.sh ROUNDS "BENCH ARGS" ["BENCH ARGS"...]
# runs, ROUNDS times over, every set of bench arguments with each build of
# $BUILDS (default "base tree"): base is target/devbin/moeflux-base (the
# "before" build, carried), tree target/devbin/moeflux (the tree's), any
# other NAME target/devbin/moeflux-NAME (tools/device/prepare_branch.sh
# builds a branch as one), on $MODEL (made by `synth` first if missing).
# Each run's table goes to $OUT/ab.log; one line per run (its tg or pp
# rows, then each repetition's tok/s and the summary's lines on router
# guesses, the CPU's steps and experts used again, indented) to
# $OUT/ab.txt, printed last.
set -uo pipefail
OUT=${OUT:-/tmp/moeflux-out}
mkdir -p "$OUT"
BIN=$(pwd)/target/devbin
MODEL=${MODEL:-/tmp/q36}
export MOEFLUX_KERNEL_CACHE=/tmp/moeflux-kernels
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
rounds=$1
shift
[ -d "$MODEL" ] || "$BIN/moeflux" synth --preset qwen3.6-35b-a3b --out "$MODEL" >>"$OUT/ab.log" 2>&1
: >"$OUT/ab.txt"
for r in $(seq "$rounds"); do
    for args in "$@"; do
        for build in ${BUILDS:-base tree}; do
            exe=$BIN/moeflux-$build
            [ "$build" = tree ] && exe=$BIN/moeflux
            # shellcheck disable=SC2086
            "$exe" bench --model "$MODEL" $args >"$OUT/run.md" 2>"$OUT/run.err"
            rc=$?
            { echo "== round $r $build (rc $rc): $args"; cat "$OUT/run.md"; tail -n 4 "$OUT/run.err"; } >>"$OUT/ab.log"
            echo "round $r $build | $args | $(grep -E '^\| (tg|pp)' "$OUT/run.md" | cut -d'|' -f2,3 | tr '\n' ' ')" >>"$OUT/ab.txt"
            # Each run's tok/s and the adaptive choices that move them
            # (the guess count, the ranks' use, the CPU's share, the
            # repeat gate), indented under the line.
            grep -hE "run [0-9]+/[0-9]+:|router guesses|CPU steps|used again" "$OUT/run.err" "$OUT/run.md" | sed 's/^ */    /' >>"$OUT/ab.txt"
        done
    done
done
rm -f "$OUT/run.md" "$OUT/run.err"
cat "$OUT/ab.txt"
