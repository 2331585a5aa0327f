#!/usr/bin/env bash
# The one script sent to the device machine (see tools/device/NOTES.md).
# Run from the repository root there, with the binaries that
# tools/device/prepare.sh put in target/devbin/ carried along:
#   tools/device/run.sh STAGE...
# Stages: probe coldstart coldstart-model ops golden synth resident depth half quarter zero quarter-nopf cpu
# golden-staging pieces quarter-staging quick quick25 kernels resident-nograph
# quarter-nograph golden-nograph resident-nopdl quarter-nopdl profile profile-stream profile-parallel
# profile-kernel profile-sass batch parallel
# parallel-skewed parallel-cpu cpu-prefill prefill profile-prefill moe-step.
# Logs go to $OUT; a short table is printed last.
set -uo pipefail
OUT=${OUT:-/tmp/moeflux-out}
mkdir -p "$OUT"
ROOT=$(pwd)
BIN=$ROOT/target/devbin
MODEL=${MODEL:-/tmp/q36}
SERVE_ARGS=${SERVE_ARGS:-}
SERVE_BENCH_ARGS=${SERVE_BENCH_ARGS:-}
export MOEFLUX_KERNEL_CACHE=/tmp/moeflux-kernels
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export RUST_BACKTRACE=1
# The test binaries were built in /work/main: fixtures and the moeflux
# binary are found through that path.
if [ "$ROOT" != /work/main ]; then
    mkdir -p /work && ln -sfn "$ROOT" /work/main
fi
mkdir -p /work/main/target/release && cp -f "$BIN/moeflux" /work/main/target/release/moeflux
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

bench() { # name, extra args...
    local name=$1
    shift
    local t0=$SECONDS
    "$BIN/moeflux" bench --model "$MODEL" "$@" >"$OUT/bench-$name.md" 2>"$OUT/bench-$name.err"
    local rc=$?
    note "bench $name (rc $rc, $((SECONDS - t0)) s): $*"
    cat "$OUT/bench-$name.md" | tee -a "$SUMMARY"
    tail -n 3 "$OUT/bench-$name.err"
}

for stage in "$@"; do
    case $stage in
    probe)
        nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv | tee "$OUT/gpu.txt"
        nproc; free -g | head -2; df -h /tmp | tail -1
        ldconfig -p | grep -E "libcuda.so|libnvrtc" | head -5
        ls /usr/local/cuda/lib64/libnvrtc* 2>/dev/null | head -3
        ;;
    ops)
        t0=$SECONDS
        "$BIN/backend_ops" cuda:: --test-threads=1 --nocapture >"$OUT/ops.log" 2>&1
        note "backend_ops cuda (rc $?, $((SECONDS - t0)) s): $(grep -E '^test result' "$OUT/ops.log")"
        grep -E "panicked|FAILED|error" "$OUT/ops.log" | head -20
        grep -E "rel L2" "$OUT/ops.log" | sort -t' ' -k1,1 | awk '{print}' >"$OUT/ops-errors.txt"
        ;;
    golden)
        t0=$SECONDS
        "$BIN/cuda_golden" --test-threads=4 --nocapture >"$OUT/golden.log" 2>&1
        note "cuda_golden (rc $?, $((SECONDS - t0)) s): $(grep -E '^test result' "$OUT/golden.log")"
        grep -E "panicked|FAILED|worst" "$OUT/golden.log" | head -30 | tee -a "$SUMMARY"
        ;;
    synth)
        t0=$SECONDS
        [ -d "$MODEL" ] || "$BIN/moeflux" synth --preset qwen3.6-35b-a3b --out "$MODEL" >"$OUT/synth.log" 2>&1
        note "synth (rc $?, $((SECONDS - t0)) s): $(du -sh "$MODEL" | cut -f1)"
        ;;
    resident) bench resident --device cuda -p 512 -n 128 -r 3 --timing ;;
    depth)
        # Decode at depth over each KV cache type, every expert resident.
        for t in ${KV_TYPES:-f32 f16 q8_0}; do
            bench "depth-$t" --device cuda -p 0 -n 64 -d ${DEPTHS:-0,8192,32768} -r 2 --cache-type-k "$t" --cache-type-v "$t"
        done
        ;;
    resident-nopdl) bench resident-nopdl --no-pdl --device cuda -p 512 -n 128 -r 3 ;;
    quarter-nopdl) bench quarter-nopdl --no-pdl --device cuda --expert-cache 25% -p 512 -n 128 -r 3 ;;
    resident-nograph) bench resident-nograph --no-cuda-graphs --device cuda -p 512 -n 128 -r 3 ;;
    quarter-nograph) bench quarter-nograph --no-cuda-graphs --device cuda --expert-cache 25% -p 512 -n 128 -r 3 ;;
    golden-nograph)
        t0=$SECONDS
        MOEFLUX_GRAPHS=0 "$BIN/cuda_golden" --test-threads=4 --nocapture >"$OUT/golden-nograph.log" 2>&1
        note "cuda_golden, no graphs (rc $?, $((SECONDS - t0)) s): $(grep -E '^test result' "$OUT/golden-nograph.log")"
        grep -E "panicked|FAILED" "$OUT/golden-nograph.log" | head -10 | tee -a "$SUMMARY"
        ;;
    half) bench half --device cuda --expert-cache 50% -p 512 -n 128 -r 3 ;;
    quarter) bench quarter --device cuda --expert-cache 25% -p 512 -n 128 -r 3 --timing ;;
    coldstart)
        # The first CUDA start on a machine (no kernel cache), then the second.
        rm -rf "$MOEFLUX_KERNEL_CACHE"
        "$BIN/moeflux" convert tests/fixtures/demo_kjv /tmp/demo --force >/dev/null 2>&1
        for run in first second; do
            t0=$(date +%s%N)
            "$BIN/moeflux" run --model /tmp/demo --device cuda -p "And it came to pass" -n 16 --seed 1 >"$OUT/coldstart-$run.txt" 2>&1
            note "coldstart $run start (rc $?): $(( ($(date +%s%N) - t0) / 1000000 )) ms wall: $(grep -E 'compil' "$OUT/coldstart-$run.txt" | tr '\n' ' ')"
        done
        ;;
    coldstart-model)
        # The first CUDA start with $MODEL (no kernel cache), then the second.
        rm -rf "$MOEFLUX_KERNEL_CACHE"
        for run in first second; do
            t0=$(date +%s%N)
            "$BIN/moeflux" bench --model "$MODEL" --device cuda -p 8 -n 4 -r 1 >"$OUT/coldstart-model-$run.txt" 2>&1
            note "coldstart-model $run start (rc $?): $(( ($(date +%s%N) - t0) / 1000000 )) ms wall: $(grep -E 'compil' "$OUT/coldstart-model-$run.txt" | tr '\n' ' ')"
        done
        ;;
    serve)
        # Issue 9's rows: one streaming client through `moeflux serve` at
        # 25% expert cache against `bench` at the same setting.
        bench serve-ref --device cuda --expert-cache 25% -p 512 -n 128 -r 3
        "$BIN/moeflux" serve --model "$MODEL" --device cuda --expert-cache 25% --port 18080 $SERVE_ARGS >"$OUT/serve.log" 2>&1 &
        spid=$!
        for _ in $(seq 120); do curl -sf localhost:18080/health >/dev/null && break; sleep 1; done
        t0=$SECONDS
        python3 "$ROOT/tools/serve_bench.py" http://127.0.0.1:18080 --runs 3 $SERVE_BENCH_ARGS >"$OUT/serve-bench.json" 2>"$OUT/serve-bench.err"
        note "serve_bench $SERVE_ARGS $SERVE_BENCH_ARGS (rc $?, $((SECONDS - t0)) s)"
        tee -a "$SUMMARY" <"$OUT/serve-bench.err"
        kill -INT $spid; wait $spid
        ;;
    skewed)
        # The same shape with realistic routing (synth --routing skewed).
        t0=$SECONDS
        [ -d /tmp/q36s ] || "$BIN/moeflux" synth --preset qwen3.6-35b-a3b --routing skewed --out /tmp/q36s >"$OUT/synth-skewed.log" 2>&1
        note "synth skewed (rc $?, $((SECONDS - t0)) s)"
        for c in 0% 25% 50%; do
            MODEL=/tmp/q36s bench "skewed-$c" --device cuda --expert-cache $c -p 512 -n 128 -r 3
            MODEL=/tmp/q36s bench "skewed-$c-hybrid" --hybrid auto --device cuda --expert-cache $c -p 0 -n 128 -r 3
        done
        ;;
    zero) bench zero --device cuda --expert-cache 0% -p 512 -n 128 -r 3 ;;
    # The same rows with misses split between copies and the CPU (--hybrid
    # auto) or every decode miss computed on the CPU (--hybrid cpu).
    zero-hybrid) bench zero-hybrid --hybrid auto --device cuda --expert-cache 0% -p 0 -n 128 -r 3 ;;
    zero-cpu) bench zero-cpu --hybrid cpu --device cuda --expert-cache 0% -p 0 -n 128 -r 3 ;;
    quarter-hybrid) bench quarter-hybrid --hybrid auto --device cuda --expert-cache 25% -p 0 -n 128 -r 3 ;;
    half-hybrid) bench half-hybrid --hybrid auto --device cuda --expert-cache 50% -p 0 -n 128 -r 3 ;;
    quarter-d512) bench quarter-d512 --device cuda --expert-cache 25% -p 0 -n 128 -d 512 -r 3 ;;
    quarter-nopf) bench quarter-nopf --device cuda --expert-cache 25% --no-prefetch -p 512 -n 128 -r 3 ;;
    cpu) bench cpu --device cpu -p 512 -n 128 -r 3 ;;
    golden-staging)
        # The same tests with the expert files copied through pinned staging
        # buffers instead of registered with the driver.
        t0=$SECONDS
        MOEFLUX_STAGING=1 "$BIN/cuda_golden" --test-threads=4 --nocapture >"$OUT/golden-staging.log" 2>&1
        note "cuda_golden, staging (rc $?, $((SECONDS - t0)) s): $(grep -E '^test result' "$OUT/golden-staging.log")"
        grep -E "panicked|FAILED" "$OUT/golden-staging.log" | head -10 | tee -a "$SUMMARY"
        ;;
    pieces)
        for kb in 256 1024; do
            bench "staging-piece$kb" --staging --copy-piece-kib $kb --device cuda --expert-cache 25% -p 0 -n 32 -r 2
        done
        ;;
    quarter-staging) bench quarter-staging --staging --device cuda --expert-cache 25% -p 512 -n 128 -r 3 ;;
    kernels)
        t0=$SECONDS
        "$BIN/cuda_kernels" --test-threads=1 --nocapture >"$OUT/kernels.log" 2>&1
        note "cuda_kernels (rc $?, $((SECONDS - t0)) s): $(grep -E '^test result' "$OUT/kernels.log")"
        grep -E "^\||copy:|launch:|panicked" "$OUT/kernels.log" | tee -a "$SUMMARY"
        ;;
    profile)
        # Per-kernel GPU time of two resident decode tokens (Nsight Compute,
        # one pass per kernel: durations, not throughput of the whole run).
        t0=$SECONDS
        ncu --csv --metrics gpu__time_duration.sum --launch-skip 9000 --launch-count 1148 \
            "$BIN/moeflux" bench --model "$MODEL" --device cuda -p 16 -n 24 -r 1 >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
        note "ncu (rc $?, $((SECONDS - t0)) s)"
        python3 tools/device/ncu_summary.py "$OUT/ncu.csv" | tee -a "$SUMMARY"
        ;;
    profile-stream)
        # Per-kernel GPU time of streamed decode tokens at 25% and at 0%
        # of the experts cached (Nsight Compute, clocks and caches left
        # alone; copies are serialized with the kernels under ncu).
        for c in 25% 0%; do
            t0=$SECONDS
            ncu --csv --clock-control none --cache-control none --metrics gpu__time_duration.sum \
                --launch-skip 4000 --launch-count 1500 \
                "$BIN/moeflux" bench --model "$MODEL" --device cuda -p 0 -n 24 -r 1 --expert-cache $c >"$OUT/ncu-${c%\%}.csv" 2>"$OUT/ncu-${c%\%}.err"
            note "ncu streamed $c (rc $?, $((SECONDS - t0)) s)"
            python3 tools/device/ncu_summary.py "$OUT/ncu-${c%\%}.csv" | tee -a "$SUMMARY"
        done
        ;;
    profile-parallel)
        # Per-kernel GPU time of 8-stream decode steps (Nsight Compute, one
        # pass per kernel, clocks and caches left alone).
        t0=$SECONDS
        ncu --csv --clock-control none --cache-control none --metrics gpu__time_duration.sum \
            --launch-skip 6000 --launch-count 2400 \
            "$BIN/moeflux" bench --model "$MODEL" --device cuda -p 0 -n 24 -r 1 --parallel 8 >"$OUT/ncu-par.csv" 2>"$OUT/ncu-par.err"
        note "ncu parallel (rc $?, $((SECONDS - t0)) s)"
        python3 tools/device/ncu_summary.py "$OUT/ncu-par.csv" | tee -a "$SUMMARY"
        ;;
    profile-kernel)
        # One kernel of 8-stream decode steps in depth (Nsight Compute,
        # clocks and caches left alone): time, registers, warps active,
        # instructions, spills and the warp stall reasons per issued
        # instruction. KERNEL (a regex, default the batched expert kernels)
        # picks it.
        t0=$SECONDS
        ncu --clock-control none --cache-control none -k "regex:${KERNEL:-moe_.*_mt}" --launch-skip 200 --launch-count 4 \
            --metrics "gpu__time_duration.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
            "$BIN/moeflux" bench --model "$MODEL" --device cuda -p 0 -n 24 -r 1 --parallel 8 >"$OUT/ncu-kernel.txt" 2>"$OUT/ncu-kernel.err"
        note "ncu kernel ${KERNEL:-moe_.*_mt} (rc $?, $((SECONDS - t0)) s)"
        grep -vE "^==|^\s*$" "$OUT/ncu-kernel.txt" | awk '$NF+0 > 0.05 || /\(/' | tee -a "$SUMMARY"
        ;;
    profile-sass)
        # One launch of a kernel of 8-stream decode steps, instruction by
        # instruction (Nsight Compute's source counters): its mix by opcode
        # and its instructions by times run (tools/device/sass_mix.py). KERNEL (a regex,
        # default moe_up_mt) picks it.
        t0=$SECONDS
        ncu --set none --section SourceCounters -k "regex:${KERNEL:-moe_up_mt}" --launch-skip 200 --launch-count 1 \
            --page source --print-source sass --csv \
            "$BIN/moeflux" bench --model "$MODEL" --device cuda -p 0 -n 24 -r 1 --parallel 8 >"$OUT/sass.csv" 2>"$OUT/sass.err"
        note "ncu sass ${KERNEL:-moe_up_mt} (rc $?, $((SECONDS - t0)) s)"
        python3 tools/device/sass_mix.py "$OUT/sass.csv" 20 | tee -a "$SUMMARY"
        ;;
    moe-step)
        # One token's CPU MoE step against its number of experts (the
        # hybrid CPU share's cost; examples/moe_step_bench.rs), all threads.
        t0=$SECONDS
        "$BIN/moe_step_bench" >"$OUT/moe-step.md" 2>&1
        note "moe_step_bench (rc $?, $((SECONDS - t0)) s)"
        tee -a "$SUMMARY" <"$OUT/moe-step.md"
        ;;
    batch)
        # Sequences in one forward pass against each alone, on CUDA.
        t0=$SECONDS
        "$BIN/batch" cuda_ --test-threads=2 --nocapture >"$OUT/batch.log" 2>&1
        note "batch tests (rc $?, $((SECONDS - t0)) s): $(grep -E '^test result' "$OUT/batch.log")"
        grep -E "panicked|FAILED|worst" "$OUT/batch.log" | head -20 | tee -a "$SUMMARY"
        ;;
    parallel)
        # Issue 13's rows: 8 streams decoded together against one.
        for p in 1 8; do
            bench "resident-p$p" --device cuda -p 0 -n 128 -r 3 --parallel $p
            bench "quarter-p$p" --device cuda --expert-cache 25% -p 0 -n 128 -r 3 --parallel $p
        done
        ;;
    parallel-timing)
        bench resident-p8-timing --device cuda -p 0 -n 64 -r 2 --parallel 8 --timing
        bench resident-p8-nopdl --no-pdl --device cuda -p 0 -n 64 -r 2 --parallel 8
        ;;
    serve-parallel)
        # 8 clients at once through `serve --parallel 8` (one forward pass
        # per step for all of them) against one client, same server.
        "$BIN/moeflux" serve --model "$MODEL" --device cuda --parallel 8 --port 18081 $SERVE_ARGS >"$OUT/serve-par.log" 2>&1 &
        spid=$!
        for _ in $(seq 120); do curl -sf localhost:18081/health >/dev/null && break; sleep 1; done
        for c in 1 8; do
            t0=$SECONDS
            python3 "$ROOT/tools/serve_bench.py" http://127.0.0.1:18081 --clients $c --runs 2 --prompt-tokens 64 --max-tokens 128 --history 200 >"$OUT/serve-par-$c.json" 2>"$OUT/serve-par-$c.err"
            note "serve_bench --clients $c $SERVE_ARGS (rc $?, $((SECONDS - t0)) s)"
            tail -n 3 "$OUT/serve-par-$c.err" | cut -c1-200 | tee -a "$SUMMARY"
        done
        kill -INT $spid; wait $spid
        ;;
    parallel-skewed)
        [ -d /tmp/q36s ] || "$BIN/moeflux" synth --preset qwen3.6-35b-a3b --routing skewed --out /tmp/q36s >"$OUT/synth-skewed.log" 2>&1
        for p in 1 8; do
            MODEL=/tmp/q36s bench "skewed-quarter-p$p" --device cuda --expert-cache 25% -p 0 -n 128 -r 3 --parallel $p
        done
        ;;
    parallel-cpu)
        for p in 1 8; do
            bench "cpu-p$p" --device cpu -p 0 -n 32 -r 2 --parallel $p --timing
        done
        ;;
    cpu-prefill)
        # Issue 11: CPU prefill per operation, at several thread counts.
        lscpu | grep -E "Model name|^CPU\(s\)|L1d|L2|L3|Flags" | cut -c1-400 | tee -a "$SUMMARY"
        for t in 16 8 4; do
            bench "cpu-pp-t$t" --device cpu --threads $t -p 256 -n 0 -r 2 --timing
        done
        ;;
    prefill)
        # Issue 12's rows: long prompts resident and at 25%, and the
        # Qwen3-30B-A3B shape (plain GQA).
        bench pp4096 --device cuda -p 4096 -n 0 -r 2
        bench pp4096-quarter --device cuda --expert-cache 25% -p 4096 -n 0 -r 2
        [ -d /tmp/q3 ] || "$BIN/moeflux" synth --preset qwen3-30b-a3b --out /tmp/q3 >"$OUT/synth-q3.log" 2>&1
        MODEL=/tmp/q3 bench q3-resident --device cuda -p 512 -n 128 -r 3
        ;;
    profile-prefill)
        # Per-kernel GPU time of a 512-token prefill (Nsight Compute, each
        # kernel replayed with cold caches).
        t0=$SECONDS
        ncu --csv --metrics gpu__time_duration.sum --launch-count 1400 \
            "$BIN/moeflux" bench --model "$MODEL" --device cuda -p 512 -n 0 -r 1 >"$OUT/ncu-prefill.csv" 2>"$OUT/ncu-prefill.err"
        note "ncu prefill (rc $?, $((SECONDS - t0)) s)"
        python3 tools/device/ncu_summary.py "$OUT/ncu-prefill.csv" | tee -a "$SUMMARY"
        ;;
    quick) bench quick --device cuda -p 64 -n 16 -r 1 ;;
    quick25) bench quick25 --device cuda --expert-cache 25% -p 64 -n 16 -r 1 ;;
    *) note "unknown stage $stage" ;;
    esac
done
echo "==== summary"
cat "$SUMMARY"
