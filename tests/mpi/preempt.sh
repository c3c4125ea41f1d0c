#!/usr/bin/env bash
# Preemption: SIGTERM to one rank makes every rank stop at the next step boundary, write a
# checkpoint and exit with code 75; restart = latest then finishes the run, and the result
# equals the uninterrupted run bit for bit (parameters and optimizer state).
# usage: preempt.sh MPIEXEC "MPIEXEC_FLAGS" KQLORA_TRAIN KQLORA_DIFF WORKDIR
set -u
mpiexec=$1 flags=$2 train=$3 diff=$4 dir=$5
rm -rf "$dir" && mkdir -p "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
keys="dim=128 num_linears=2 lora_rank=16 global_bs=32 num_steps=3000 loss=mse optimizer=adam lr=1e-3 log_every=20"
echo "# all keys on the command line" > "$dir/deck.in"
# shellcheck disable=SC2086
"$mpiexec" -np 2 $flags "$train" "$dir/deck.in" $keys save_dir="$dir/straight" > "$dir/straight.log" 2>&1 \
  || { echo "FAILED: the straight run"; tail "$dir/straight.log"; exit 1; }
# shellcheck disable=SC2086
"$mpiexec" -np 2 $flags "$train" "$dir/deck.in" $keys save_dir="$dir/split" > "$dir/split.log" 2>&1 &
job=$!
trap 'pkill -9 -f "$dir/split" 2>/dev/null' EXIT
for _ in $(seq 300); do grep -qE "^step +40/3000" "$dir/split.log" && break; sleep 0.05; done
victim=$(pgrep -f "$train $dir/deck.in" | sort -n | tail -n 1)
kill -TERM "$victim"
echo "sent SIGTERM to rank process $victim"
wait "$job"
rc=$?
tail -n 3 "$dir/split.log"
[ "$rc" -eq 75 ] || { echo "FAILED: exit code $rc, expected 75"; exit 1; }
grep -q "stopped by a signal after step" "$dir/split.log" || { echo "FAILED: no stop message"; exit 1; }
step=$(cat "$dir/split/latest")
[ "$step" != "step-00003000" ] || { echo "FAILED: the run was not interrupted"; exit 1; }
echo "interrupted at $step; resuming"
# shellcheck disable=SC2086
"$mpiexec" -np 2 $flags "$train" "$dir/deck.in" $keys save_dir="$dir/split" restart=latest \
  > "$dir/resume.log" 2>&1 || { echo "FAILED: the resumed run"; tail "$dir/resume.log"; exit 1; }
"$diff" "$dir/straight" "$dir/split" --rtol 0 --atol 0 --optimizer > "$dir/diff.log" 2>&1
rc=$?
tail -n 1 "$dir/diff.log"
[ "$rc" -eq 0 ] || { echo "FAILED: the resumed run differs"; cat "$dir/diff.log"; exit 1; }
echo "ok"
