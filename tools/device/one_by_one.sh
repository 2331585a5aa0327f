#!/usr/bin/env bash
# Run each test of a test binary alone; a test alive after LIMIT s gets its
# threads' stacks dumped by cuda-gdb, then is killed.
BIN=$1; LIMIT=${2:-45}; OUT=${OUT:-/tmp/out}
export MOEFLUX_KERNEL_CACHE=/tmp/moeflux-kernels LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
ROOT=$(pwd); [ "$ROOT" != /work/main ] && { mkdir -p /work && ln -sfn "$ROOT" /work/main; }
mkdir -p /work/main/target/release && cp -f target/devbin/moeflux /work/main/target/release/moeflux
name=$(basename $BIN)
LOGS=/tmp/logs; mkdir -p $LOGS
for t in $($BIN --list 2>/dev/null | grep ': test$' | sed 's/: test$//'); do
  $BIN --exact "$t" --test-threads=1 --nocapture > "$LOGS/${name}_$t.log" 2>&1 &
  pid=$!
  for i in $(seq $LIMIT); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then
    cuda-gdb -p $pid -batch -ex "thread apply all bt 15" > "$OUT/bt_${name}_$t.txt" 2>&1
    kill -9 $pid; wait $pid 2>/dev/null
    echo "HUNG $name $t"
  else
    wait $pid; rc=$?; echo "$name $t rc=$rc $(grep -E '^test result' "$LOGS/${name}_$t.log" | cut -c1-40)"
    [ $rc = 0 ] || grep -E "panicked|Error|error" "$LOGS/${name}_$t.log" | head -5
  fi
done
