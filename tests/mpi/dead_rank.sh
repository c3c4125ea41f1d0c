#!/usr/bin/env bash
# A rank that stops (SIGSTOP: hung) or dies (SIGKILL) mid-run must end the whole job with a
# non-zero exit code, in about comm_timeout_s, with a message naming the operation.
# usage: dead_rank.sh stop|kill MPIEXEC "MPIEXEC_FLAGS" KQLORA_TRAIN WORKDIR
set -u
kind=$1 mpiexec=$2 flags=$3 train=$4 dir=$5
rm -rf "$dir" && mkdir -p "$dir"
cat > "$dir/deck.in" <<DECK
dim = 32
num_linears = 1
lora_rank = 4
global_bs = 3
num_steps = 100000000
comm_timeout_s = 5
log_every = 200
save_dir = $dir/ck
DECK
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck disable=SC2086
"$mpiexec" -np 3 $flags "$train" "$dir/deck.in" > "$dir/log" 2>&1 &
job=$!
cleanup() { pkill -9 -f "$dir/deck.in" 2>/dev/null; }
trap cleanup EXIT
# (60 s: under ctest -j the build without MPI may be compiling on every core)
for _ in $(seq 600); do grep -q "^step" "$dir/log" && break; sleep 0.1; done
grep -q "^step" "$dir/log" || { echo "FAILED: training did not start"; cat "$dir/log"; exit 1; }
victim=$(pgrep -f "$train $dir/deck.in" | sort -n | sed -n 2p)
[ -n "$victim" ] || { echo "FAILED: no rank process found"; exit 1; }
start=$(date +%s)
case $kind in
  stop) kill -STOP "$victim" ;;
  kill) kill -KILL "$victim" ;;
esac
echo "sent SIG${kind^^} to rank process $victim"
for _ in $(seq 600); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  echo "FAILED: the job still runs 60 s after the rank was ${kind}ped"
  exit 1
fi
wait "$job"
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "job ended with exit code $rc after ${elapsed} s"
tail -n 5 "$dir/log"
[ "$rc" -ne 0 ] || { echo "FAILED: exit code 0"; exit 1; }
if [ "$kind" = stop ]; then
  grep -q "did not complete within 5 s" "$dir/log" || { echo "FAILED: no timeout message"; exit 1; }
  [ "$elapsed" -le 30 ] || { echo "FAILED: took ${elapsed} s for a 5 s timeout"; exit 1; }
fi
echo "ok"
