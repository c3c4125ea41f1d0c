#!/usr/bin/env bash
# kqlora-train with mpirun on one workstation or an allocation without Slurm:
#   cluster_scripts/mpirun_example.sh 4 input/seed.in [key=value ...]
# 4 ranks, one core each (--oversubscribe lets ranks exceed the cores, e.g. in tests).
set -euo pipefail
np=${1:-2}
deck=${2:-input/seed.in}
shift $(( $# > 2 ? 2 : $# ))
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --oversubscribe --bind-to core -np "$np" build/bin/kqlora-train "$deck" "$@"
