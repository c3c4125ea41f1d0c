#!/usr/bin/env bash
# cluster_scripts/gpu_bind.sh maps each node-local rank through the GPU list the launcher
# gave (ctest gpu_bind): prints FAILED and exits 1 on any wrong mapping.
bind=$(dirname "$0")/../cluster_scripts/gpu_bind.sh
fail=0
check() {  # EXPECTED ENV... : gpu_bind.sh's CUDA_VISIBLE_DEVICES under env -i ENV...
  local want=$1
  shift
  local got
  got=$(env -i PATH="$PATH" "$@" bash "$bind" printenv CUDA_VISIBLE_DEVICES)
  if [ "$got" = "$want" ]; then
    echo "ok: $* -> $got"
  else
    echo "FAILED: $* -> '$got', expected '$want'"
    fail=1
  fi
}
check 3 SLURM_LOCALID=1 CUDA_VISIBLE_DEVICES=2,3        # Slurm's list, not the rank
check 2 SLURM_LOCALID=0 CUDA_VISIBLE_DEVICES=2,3
check 5 SLURM_LOCALID=3 CUDA_VISIBLE_DEVICES=5          # more ranks than GPUs: shared
check 4 SLURM_LOCALID=2 CUDA_VISIBLE_DEVICES=4,6        # round-robin
check 6 SLURM_LOCALID=3 CUDA_VISIBLE_DEVICES=4,6
check 1 SLURM_LOCALID=1                                 # no list: the rank
check 2 OMPI_COMM_WORLD_LOCAL_RANK=2                    # Open MPI's mpirun
check GPU-bbb OMPI_COMM_WORLD_LOCAL_RANK=1 CUDA_VISIBLE_DEVICES=GPU-aaa,GPU-bbb  # UUIDs
check 0                                                 # no launcher: rank 0
# mpirun inside a Slurm allocation: every rank inherits the batch step's SLURM_LOCALID=0,
# the launcher's local rank must win (the old order put all of them on GPU 0)
check 3 SLURM_LOCALID=0 OMPI_COMM_WORLD_LOCAL_RANK=1 CUDA_VISIBLE_DEVICES=2,3
check 1 SLURM_LOCALID=0 OMPI_COMM_WORLD_LOCAL_RANK=1
check 6 SLURM_LOCALID=0 MPI_LOCALRANKID=1 CUDA_VISIBLE_DEVICES=4,6   # MPICH / Intel MPI
check 2 SLURM_LOCALID=0 PMI_LOCAL_RANK=2                             # other PMI launchers
check 1 MPI_LOCALRANKID=1 PMI_LOCAL_RANK=0   # both set: the fixed order decides
if env -i PATH="$PATH" SLURM_LOCALID=x bash "$bind" true 2>/dev/null; then
  echo "FAILED: a rank that is not a number was accepted"
  fail=1
else
  echo "ok: a rank that is not a number: exit $?"
fi
[ $fail -eq 0 ] && echo "Passed!" || echo "Failed!"
exit $fail
