#!/usr/bin/env bash
# A job killed (SIGKILL, every rank) while it writes checkpoints leaves `latest` naming a
# complete, loadable checkpoint that a restart resumes; keep_last never removed it.
# usage: kill_during_checkpoint.sh MPIEXEC "MPIEXEC_FLAGS" KQLORA_TRAIN KQLORA_DIFF WORKDIR
set -u
mpiexec=$1 flags=$2 train=$3 diff=$4 dir=$5
rm -rf "$dir" && mkdir -p "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
echo "# keys on the command line" > "$dir/deck.in"
keys="dim=512 num_linears=4 lora_rank=256 global_bs=4 num_steps=100000 checkpoint_every=1 keep_last=2 log_every=1"
for layout in per_rank shared; do
  save="$dir/$layout"
  # shellcheck disable=SC2086
  "$mpiexec" -np 2 $flags "$train" "$dir/deck.in" $keys checkpoint_layout=$layout save_dir="$save" \
      > "$dir/$layout.log" 2>&1 &
  job=$!
  for _ in $(seq 600); do [ "$(ls -d "$save"/step-* 2>/dev/null | wc -l)" -ge 3 ] && break; sleep 0.05; done
  sleep 0.$((RANDOM % 9 + 1))
  pkill -9 -f "save_dir=$save" ; wait "$job" 2>/dev/null
  latest=$(cat "$save/latest")
  echo "$layout: killed; latest = $latest; on disk: $(ls "$save" | tr '\n' ' ')"
  [ -d "$save/$latest" ] || { echo "FAILED: latest names a missing directory"; exit 1; }
  "$diff" "$save" "$save" > "$dir/diff.log" 2>&1 || { echo "FAILED: latest is not loadable"; cat "$dir/diff.log"; exit 1; }
  done_steps=$((10#${latest#step-}))
  # shellcheck disable=SC2086
  "$mpiexec" -np 2 $flags "$train" "$dir/deck.in" $keys checkpoint_layout=$layout save_dir="$save" \
      restart=latest num_steps=$((done_steps + 1)) > "$dir/$layout.resume.log" 2>&1 \
    || { echo "FAILED: restart"; tail "$dir/$layout.resume.log"; exit 1; }
  [ "$(cat "$save/latest")" = "$(printf 'step-%08d' $((done_steps + 1)))" ] \
    || { echo "FAILED: the resumed run did not commit its step"; exit 1; }
done
echo "ok"
