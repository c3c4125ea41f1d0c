#!/usr/bin/env bash
# Runs a command with only the GPU of this task's node-local rank visible
# (SLURM_LOCALID under srun, OMPI_COMM_WORLD_LOCAL_RANK under Open MPI's mpirun), so every
# rank's Kokkos picks "its" GPU as device 0.
local_rank=${SLURM_LOCALID:-${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-0}}}
export CUDA_VISIBLE_DEVICES=$local_rank
exec "$@"
