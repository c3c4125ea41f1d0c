#!/usr/bin/env bash
# Runs input_error_on_some_ranks MODE on 3 ranks: exit 2 within 60 s, the message printed
# (by rank 1 itself in mode one, where rank 0 never sees the error); mode all: no abort.
# usage: input_error.sh one|all MPIEXEC "MPIEXEC_FLAGS" PROGRAM
set -u
mode=$1 mpiexec=$2 flags=$3 prog=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
start=$(date +%s)
# shellcheck disable=SC2086
out=$(timeout 100 "$mpiexec" -np 3 $flags "$prog" "$mode" 2>&1)
rc=$?
took=$(($(date +%s) - start))
echo "$out" | grep -v "^$" | tail -n 12
echo "exit code $rc after $took s"
[ "$rc" -eq 2 ] || { echo "FAILED: exit code $rc, expected 2"; exit 1; }
[ "$took" -le 60 ] || { echo "FAILED: took $took s"; exit 1; }
echo "$out" | grep -q "the file only rank 1 reads is damaged" || { echo "FAILED: no message"; exit 1; }
if [ "$mode" = all ]; then
  ! echo "$out" | grep -q "MPI_ABORT" || { echo "FAILED: aborted although every rank agreed"; exit 1; }
fi
echo "ok"
