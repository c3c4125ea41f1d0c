#!/usr/bin/env bash
# The main job, from a fresh clone on Debian 12: install, build, then the seed scenario of
# DESIGN.md as the upstream DDP test runs it -- a reference run at world size 1, a run at
# world size 2 writing one checkpoint per rank -- and kqlora-diff's verdict on every
# parameter of every rank. The script's exit code is kqlora-diff's (0 Passed!, 1 Failed!).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/build.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
bin=build/bin
run=run/seed
rm -rf "$run"
mkdir -p "$run"
mpirun_flags=(--oversubscribe)

echo
echo "== Seed scenario (input/seed.in): 1 LoRA linear 128 x 128 over NF4, rank 64, alpha 16,"
echo "   Adam lr 1e-2, sum loss, global batch 8, 3 steps"
echo "-- reference run, world size 1"
mpirun "${mpirun_flags[@]}" -np 1 "$bin/kqlora-train" input/seed.in save_dir="$run/ref" \
    metrics_file="$run/ref.jsonl" | grep -E "^step |^checkpoint:|^peak"
echo "-- test run, world size 2 (one checkpoint per rank)"
mpirun "${mpirun_flags[@]}" -np 2 "$bin/kqlora-train" input/seed.in save_dir="$run/test" \
    metrics_file="$run/test.jsonl" | grep -E "^step |^checkpoint:|^peak"
echo "-- kqlora-diff: every parameter of every rank against the reference"
set +e
"$bin/kqlora-diff" "$run/ref" "$run/test"
rc=$?
set -e
echo "kqlora-diff exit code: $rc"
exit $rc
