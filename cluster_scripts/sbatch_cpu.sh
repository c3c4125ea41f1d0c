#!/usr/bin/env bash
# kqlora-train on CPU nodes: one rank per socket (or per core), OpenMP threads inside.
# Edit the resources and the deck, then: sbatch cluster_scripts/sbatch_cpu.sh input/seed.in
#SBATCH --job-name=kqlora
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=32
#SBATCH --time=01:00:00
#SBATCH --output=kqlora-%j.out
set -euo pipefail
deck=${1:-input/seed.in}
shift || true
# module load openmpi hdf5/parallel kokkos       # your site's modules
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
export OMP_PROC_BIND=spread OMP_PLACES=threads
export OPENBLAS_NUM_THREADS=1                    # one BLAS thread per OpenMP thread
# --kill-on-bad-exit=1: a rank that dies ends the whole step, instead of leaving the
# others waiting in a collective until the time limit.
srun --kill-on-bad-exit=1 --cpu-bind=cores build/bin/kqlora-train "$deck" "$@"
