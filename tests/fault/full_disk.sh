#!/usr/bin/env bash
# Faults of the disk, injected without privileges (fail_writes.so through LD_PRELOAD): a
# disk that fills up or fails during a checkpoint ends the run with exit 1 and a message
# naming the cause, nothing crashes (at finalize either), no temporary directory is left,
# `latest` still names the previous checkpoint, which is intact and resumes to the same
# result as a run without the fault; a save_dir on a read-only file system or without
# permission is refused (exit 2) before the first step. np 1, and np 2 in both layouts.
# usage: full_disk.sh FAIL_WRITES_SO MPIEXEC "MPIEXEC_FLAGS" KQLORA_TRAIN KQLORA_DIFF WORKDIR
set -u
lib=$1 mpiexec=$2 flags=$3 train=$4 diff=$5 dir=$6
rm -rf "$dir" && mkdir -p "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
echo "# all keys on the command line" > "$dir/deck.in"
keys="dim=64 num_linears=2 lora_rank=8 global_bs=4 num_steps=3 checkpoint_every=1 loss=mse optimizer=adam log_every=1"
fail() { echo "FAILED: $*"; exit 1; }

launch() {  # NP LAYOUT SAVE_DIR [ENV=VALUE ...] -- runs the trainer, prints its exit code
  local np=$1 layout=$2 save=$3
  shift 3
  # shellcheck disable=SC2086
  if [ "$np" -eq 1 ]; then
    env "$@" "$train" "$dir/deck.in" $keys checkpoint_layout="$layout" save_dir="$save"
  else
    local xs=()
    for kv in "$@"; do xs+=(-x "$kv"); done
    "$mpiexec" -np "$np" $flags "${xs[@]}" "$train" "$dir/deck.in" $keys \
      checkpoint_layout="$layout" save_dir="$save"
  fi
}

for case in "1 per_rank" "2 per_rank" "2 shared"; do
  read -r np layout <<< "$case"
  tag="np${np}_$layout"
  clean="$dir/clean_$tag"
  launch "$np" "$layout" "$clean" > "$dir/$tag.clean.log" 2>&1 || fail "$tag: the run without faults"
  # Each process may write its share of the first checkpoint (and a little more: probes,
  # latest), not of the second. (A shared file's skeleton is rank 0's: any share up to all.)
  bytes=$(du -sb "$clean/step-00000001" | cut -f1)
  share=$((bytes / np))
  [ "$layout" = shared ] && share=$bytes
  allow=$((share + 2048))
  for err in ENOSPC EIO; do
    save="$dir/${tag}_$err"
    launch "$np" "$layout" "$save" LD_PRELOAD="$lib" KQLORA_FAULT_DIR="$save" \
      KQLORA_FAULT_WRITE_ERRNO=$err KQLORA_FAULT_AFTER_BYTES=$allow > "$dir/$tag.$err.log" 2>&1
    rc=$?
    [ "$rc" -eq 1 ] || { tail -n 20 "$dir/$tag.$err.log"; fail "$tag $err: exit code $rc, expected 1"; }
    want="No space left on device"
    [ "$err" = EIO ] && want="Input/output error"
    [ "$np$layout" = 2shared ] && want="writing failed"  # (MPI-IO names no errno)
    grep -q "$want" "$dir/$tag.$err.log" || { tail "$dir/$tag.$err.log"; fail "$tag $err: no '$want'"; }
    ! grep -qi "segmentation\|signal 11\|core dumped" "$dir/$tag.$err.log" || fail "$tag $err: crashed"
    [ "$(cat "$save/latest")" = step-00000001 ] || fail "$tag $err: latest is $(cat "$save/latest")"
    ! ls -d "$save"/*.tmp > /dev/null 2>&1 || fail "$tag $err: a .tmp directory was left"
    "$diff" "$clean/step-00000001" "$save" --rtol 0 --atol 0 --optimizer > "$dir/diff.log" 2>&1 \
      || { cat "$dir/diff.log"; fail "$tag $err: the previous checkpoint is not intact"; }
    # The checkpoint left behind resumes (without the fault) to the clean run's result.
    launch "$np" "$layout" "$save" restart=latest > "$dir/$tag.$err.resume.log" 2>&1 \
      || { tail "$dir/$tag.$err.resume.log"; fail "$tag $err: the resumed run"; }
    "$diff" "$clean" "$save" --rtol 0 --atol 0 --optimizer > "$dir/diff.log" 2>&1 \
      || { cat "$dir/diff.log"; fail "$tag $err: the resumed run differs from the clean one"; }
    echo "$tag $err: exit 1, step 1 intact, resumed to the clean result"
  done
done

# A save_dir that cannot be written: refused before the first step, exit 2.
for err in EROFS EACCES; do
  save="$dir/ro_$err/ck"
  launch 1 per_rank "$save" LD_PRELOAD="$lib" KQLORA_FAULT_DIR="$dir/ro_$err" \
    KQLORA_FAULT_OPEN_ERRNO=$err > "$dir/ro_$err.log" 2>&1
  rc=$?
  [ "$rc" -eq 2 ] || { tail "$dir/ro_$err.log"; fail "$err: exit code $rc, expected 2"; }
  ! grep -q "^step " "$dir/ro_$err.log" || fail "$err: it trained before refusing"
  grep -q "$dir/ro_$err" "$dir/ro_$err.log" || fail "$err: the message names no path"
  echo "$err save_dir: exit 2 before the first step"
done
echo "ok"
