#!/usr/bin/env bash
# kqlora-train on GPU nodes: one task per GPU, each task sees the GPU of its node-local rank.
# Needs a build with Kokkos CUDA (and NCCL for comm = nccl).
# Edit the resources and the deck, then: sbatch cluster_scripts/sbatch_gpu.sh input/seed.in
#SBATCH --job-name=kqlora-gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=01:00:00
#SBATCH --output=kqlora-gpu-%j.out
set -euo pipefail
deck=${1:-input/seed.in}
shift || true
# module load cuda nccl openmpi hdf5/parallel kokkos   # your site's modules
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
# --kill-on-bad-exit=1: a rank that dies ends the whole step, instead of leaving the
# others waiting in a collective until the time limit.
srun --kill-on-bad-exit=1 --gpu-bind=none cluster_scripts/gpu_bind.sh build/bin/kqlora-train "$deck" device=cuda "$@"
