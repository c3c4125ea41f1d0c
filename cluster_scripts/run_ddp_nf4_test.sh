#!/usr/bin/env bash
# The upstream DDP + NF4 test (pytorch/ao#1684), with kqlora: a reference run at world
# size 1, a test run at world size 2 writing one checkpoint per rank, then kqlora-diff
# comparing every parameter of every rank with the reference. The exit code is
# kqlora-diff's: 0 Passed!, 1 Failed!, 2 error.
#
#   cluster_scripts/run_ddp_nf4_test.sh [DECK] [WORKDIR] [key=value ...]
#
# DECK defaults to input/seed.in, WORKDIR to ./run/ddp_nf4_test. Launches with srun inside a
# Slurm allocation, else mpirun (set KQLORA_LAUNCHER to override, e.g. "mpiexec").
# The apps come from build/bin next to this script's checkout, or from PATH.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
deck=${1:-$here/input/seed.in}
work=${2:-./run/ddp_nf4_test}
shift $(( $# > 2 ? 2 : $# ))

find_app() {
  if [ -x "$here/build/bin/$1" ]; then echo "$here/build/bin/$1"
  elif command -v "$1" > /dev/null; then command -v "$1"
  else echo "run_ddp_nf4_test: $1 not found in $here/build/bin or on PATH" >&2; exit 2
  fi
}
train=$(find_app kqlora-train)
diff=$(find_app kqlora-diff)

launch() {  # launch NP command...
  local np=$1
  shift
  if [ -n "${KQLORA_LAUNCHER:-}" ]; then
    ${KQLORA_LAUNCHER} -np "$np" "$@"
  elif [ -n "${SLURM_JOB_ID:-}" ] && command -v srun > /dev/null; then
    srun --kill-on-bad-exit=1 --ntasks="$np" "$@"   # a dead rank ends the step
  else
    [ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    mpirun --oversubscribe -np "$np" "$@"
  fi
}

rm -rf "$work"
mkdir -p "$work"
echo "-- reference run, world size 1 ($deck)"
launch 1 "$train" "$deck" save_dir="$work/ref" "$@" | grep -E "^step |^checkpoint:|^DDP|^peak"
echo "-- test run, world size 2 (one checkpoint per rank)"
launch 2 "$train" "$deck" save_dir="$work/test" "$@" | grep -E "^step |^checkpoint:|^DDP|^peak"
echo "-- kqlora-diff: every parameter of every rank against the reference"
set +e
"$diff" "$work/ref" "$work/test"
rc=$?
set -e
echo "run_ddp_nf4_test: kqlora-diff exit code $rc"
exit $rc
