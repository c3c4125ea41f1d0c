#!/usr/bin/env bash
# The main job, from a fresh clone on Debian 12: install, build, then the seed scenario of
# input/seed.in (README) as the upstream DDP test runs it (cluster_scripts/run_ddp_nf4_test.sh): a
# reference run at world size 1, a run at world size 2 writing one checkpoint per rank, and
# kqlora-diff's verdict on every parameter of every rank. The exit code is kqlora-diff's.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/build.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo
echo "== Seed scenario (input/seed.in): 1 LoRA linear 128 x 128 over NF4, rank 64, alpha 16,"
echo "   Adam lr 1e-2, sum loss, global batch 8, 3 steps"
exec bash cluster_scripts/run_ddp_nf4_test.sh input/seed.in run/seed
