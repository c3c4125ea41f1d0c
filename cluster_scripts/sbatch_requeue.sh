#!/usr/bin/env bash
# A preemptible kqlora-train job that requeues itself: Slurm signals the tasks (USR1) two
# minutes before the time limit; kqlora-train stops at the next step boundary, writes a
# checkpoint and exits with 75; this script then requeues the job, which resumes from
# save_dir/latest. sbatch cluster_scripts/sbatch_requeue.sh DECK SAVE_DIR [key=value ...]
#SBATCH --job-name=kqlora-requeue
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=16
#SBATCH --time=00:30:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=kqlora-requeue-%j.out
set -uo pipefail
deck=${1:-input/seed.in}
save_dir=${2:-./checkpoints}
shift $(( $# > 2 ? 2 : $# ))
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1} OMP_PROC_BIND=spread OMP_PLACES=threads
extra=()
[ -f "$save_dir/latest" ] && extra+=(restart=latest)   # a requeued run resumes
# --kill-on-bad-exit=1: a rank that dies ends the whole step, instead of leaving the
# others waiting in a collective until the time limit.
srun --kill-on-bad-exit=1 build/bin/kqlora-train "$deck" save_dir="$save_dir" "${extra[@]}" "$@"
rc=$?
if [ "$rc" -eq 75 ]; then
  echo "kqlora-train was preempted after a checkpoint; requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
