#!/usr/bin/env bash
# Runs a command with only the GPU of this task's node-local rank visible, so every rank's
# Kokkos picks "its" GPU as device 0. The rank is the MPI launcher's own when it set one
# (OMPI_COMM_WORLD_LOCAL_RANK under Open MPI's mpirun, MPI_LOCALRANKID under MPICH's /
# Intel MPI's hydra, PMI_LOCAL_RANK under other PMI launchers), else SLURM_LOCALID (srun).
# The launcher's comes first: under mpirun inside a Slurm allocation every rank inherits
# the batch step's SLURM_LOCALID=0, and all of them would land on the same GPU.
# The GPU is entry (local rank mod count) of the list the launcher gave in
# CUDA_VISIBLE_DEVICES (Slurm's: the job's own GPUs, indices or UUIDs, not necessarily
# 0..n-1), or the local rank itself when none was given. More ranks than GPUs share them
# round-robin; kqlora-train then reports the sharing (comm = auto takes MPI).
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${PMI_LOCAL_RANK:-${SLURM_LOCALID:-0}}}}
case "$local_rank" in
  '' | *[!0-9]*)
    echo "gpu_bind.sh: the node-local rank '$local_rank' is not a number" >&2
    exit 2
    ;;
esac
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  IFS=, read -r -a gpus <<<"$CUDA_VISIBLE_DEVICES"
  export CUDA_VISIBLE_DEVICES=${gpus[$((local_rank % ${#gpus[@]}))]}
else
  export CUDA_VISIBLE_DEVICES=$local_rank
fi
exec "$@"
