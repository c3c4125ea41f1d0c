#!/usr/bin/env bash
# Two kqlora-bench builds run at the same time, one per core (taskset), the cores swapped
# every round, and the ratio B / A of each record's median printed per round. On a shared
# VM whose speed drifts by 5-10% between runs, both builds then see the same moment of the
# drift and of each other's memory traffic, so a change of 1-3% shows in every round where
# interleaved runs one after the other could not resolve it (docs/BENCHMARKS.md).
#   tools/bench_side_by_side.sh BENCH_A BENCH_B [ROUNDS] [BATCHES] [REPEATS] [FILTER]
# e.g. with the old build copied aside before rebuilding:
#   cp build/bin/kqlora-bench /tmp/bench_old   (then rebuild)
#   tools/bench_side_by_side.sh /tmp/bench_old build/bin/kqlora-bench 4 1,4 3
set -euo pipefail

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
}
if [[ $# -ge 1 && ( "$1" == "--help" || "$1" == "-h" ) ]]; then
  usage
  exit 0
fi
if [[ $# -lt 2 ]]; then
  usage >&2
  exit 2
fi
A=$1
B=$2
ROUNDS=${3:-4}
BATCHES=${4:-1,4}
REPEATS=${5:-3}
FILTER=${6:-llama_fwd_bwd}
for bin in "$A" "$B"; do
  if [[ ! -x "$bin" ]]; then
    echo "bench_side_by_side.sh: $bin: not an executable (expected a kqlora-bench)" >&2
    exit 2
  fi
done
if [[ ! "$ROUNDS" =~ ^[1-9][0-9]*$ || ! "$REPEATS" =~ ^[1-9][0-9]*$ ]]; then
  echo "bench_side_by_side.sh: ROUNDS and REPEATS must be positive integers" >&2
  exit 2
fi
if [[ $(nproc) -lt 2 ]]; then
  echo "bench_side_by_side.sh: needs two cores (one per build), this machine has $(nproc)" >&2
  exit 2
fi
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# A run's records: the table's rows (a name with underscores, then the median in ms).
records() {
  awk 'NF >= 3 && $1 ~ /^[a-z0-9]+_[a-z0-9_]+$/ && $2 ~ /^[0-9.]+$/ {print $1, $2}' "$1" | sort
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for round in $(seq "$ROUNDS"); do
  if ((round % 2)); then core_a=0 core_b=1; else core_a=1 core_b=0; fi
  taskset -c $core_a "$A" --filter "$FILTER" --llama-batches "$BATCHES" --repeats "$REPEATS" \
    > "$tmp/a" 2>&1 &
  pid_a=$!
  taskset -c $core_b "$B" --filter "$FILTER" --llama-batches "$BATCHES" --repeats "$REPEATS" \
    > "$tmp/b" 2>&1 &
  pid_b=$!
  wait $pid_a || { echo "bench_side_by_side.sh: $A failed:" >&2; tail -5 "$tmp/a" >&2; exit 1; }
  wait $pid_b || { echo "bench_side_by_side.sh: $B failed:" >&2; tail -5 "$tmp/b" >&2; exit 1; }
  join <(records "$tmp/a") <(records "$tmp/b") |
    awk -v r="$round" '{
      printf "round %d  %-40s A %10.3f ms  B %10.3f ms  B/A %.3f\n", r, $1, $2, $3, $3 / $2
    }'
done
