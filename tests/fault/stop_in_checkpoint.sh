#!/usr/bin/env bash
# A rank that hangs inside a shared-layout checkpoint's write (stopped, SIGSTOP, as it opens
# the file through MPI-IO: fail_writes.so's KQLORA_FAULT_STOP_RANK) must not hold the other
# rank in MPI-IO's collectives until the time limit: the watchdog ends the job with exit 1
# within about comm_timeout_s (plus the file at 10 MB/s), printing one line that names the
# step, the waiting rank and the collective it waits in; the step is never committed.
# usage: stop_in_checkpoint.sh FAIL_WRITES_SO MPIEXEC "MPIEXEC_FLAGS" KQLORA_TRAIN WORKDIR
set -u
lib=$1 mpiexec=$2 flags=$3 train=$4 dir=$5
rm -rf "$dir" && mkdir -p "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
echo "# all keys on the command line" > "$dir/deck.in"
save="$dir/ck"
keys="dim=64 num_linears=2 lora_rank=8 global_bs=4 num_steps=3 checkpoint_every=1 log_every=1
      checkpoint_layout=shared comm_timeout_s=5 save_dir=$save"
fail() { echo "FAILED: $*"; exit 1; }
cleanup() { pkill -9 -f "$dir/deck.in" 2>/dev/null; }
trap cleanup EXIT
start=$(date +%s)
# shellcheck disable=SC2086
"$mpiexec" -np 2 $flags -x LD_PRELOAD="$lib" -x KQLORA_FAULT_DIR="$save" \
  -x KQLORA_FAULT_STOP_RANK=1 -x KQLORA_FAULT_STOP_AT=/checkpoint.h5 \
  "$train" "$dir/deck.in" $keys > "$dir/log" 2>&1 &
job=$!
# (the deadline is 5 s and a few ms; 90 s: under ctest -j a build may hold every core)
for _ in $(seq 900); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  tail -n 20 "$dir/log"
  fail "the job still runs 90 s after it started (rank 0 blocked in the checkpoint's MPI-IO)"
fi
wait "$job"
rc=$?
elapsed=$(($(date +%s) - start))
echo "job ended with exit code $rc after ${elapsed} s"
tail -n 8 "$dir/log"
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
# Rank 0's line, once. (The stopped rank may print its own too: the launcher continues it
# before ending it, and its watchdog, stopped with it, finds its deadline passed.)
line=$(grep "kqlora: error: checkpoint of step 1 (shared layout.*rank 0 of 2" "$dir/log")
[ -n "$line" ] || fail "no watchdog line of rank 0 naming the checkpoint's step"
[ "$(echo "$line" | wc -l)" -eq 1 ] || fail "rank 0 printed more than one line"
echo "$line" | grep -q "rank 0 of 2 waited more than 5.0" || fail "the line names no deadline"
echo "$line" | grep -q "H5Fopen through MPI-IO" || fail "the line names not the collective open"
[ "$(grep -c "kqlora: error: checkpoint of step" "$dir/log")" -le 2 ] || fail "more than one line a rank"
[ ! -e "$save/latest" ] || fail "latest was written"
[ ! -d "$save/step-00000001" ] || fail "the step was committed"
# No rank left behind (the stopped one included).
sleep 1
if pgrep -f "$dir/deck.in" > /dev/null; then fail "a rank process outlived the job"; fi
echo "ok"
