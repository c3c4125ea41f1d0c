#!/usr/bin/env bash
# The writer rule (docs/RELIABILITY.md, "Writers"): every app, its output set to each of its
# inputs -- the file itself, a directory holding it, a symbolic link, a hard link, a ".."
# spelling -- is refused with exit 2 before any work, and every input keeps its bytes. An
# existing directory where a file is expected and a directory output over a foreign
# directory are refused up front; an earlier export of the same kind is replaced whole; a
# disk that fills up during an export exits 1 and leaves the earlier export as it was, with
# no temporary left. C++ apps only (no Python packages): CI runs it on every machine.
# usage: writers.sh FAIL_WRITES_SO BIN_DIR MODEL_CASE_DIR WORKDIR
set -u
lib=$1 bin=$2 case_dir=$3 W=$4
rm -rf "$W" && mkdir -p "$W/out"
W=$(cd "$W" && pwd)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
fail() { echo "FAILED: $*"; exit 1; }
n=0

# The run's inputs: a model directory, a data file, a deck; its outputs: a save_dir and a
# metrics file (inputs of the exports and of a restart).
cp -r "$case_dir" "$W/model"
mv "$W/model/data.h5" "$W/data.h5"
printf 'model = causal_lm\nhf_model_dir = %s\ndata_file = %s\n' "$W/model" "$W/data.h5" > "$W/deck.in"
keys="lora_rank=4 block_size=32 scaler_block_size=32 global_bs=3 num_steps=2 optimizer=adamw lr=1e-2 checkpoint_every=1"
"$bin/kqlora-train" "$W/deck.in" $keys save_dir="$W/ck" metrics_file="$W/metrics.jsonl" \
  > "$W/train.log" 2>&1 || { tail "$W/train.log"; fail "the training run"; }
step=$(cat "$W/ck/latest")
rank="$W/ck/$step/rank-00000.h5"
[ -f "$rank" ] || fail "no checkpoint file $rank"
ln -s "$W/model" "$W/model_link"
ln -s "$W/ck/$step" "$W/out/s"
ln "$rank" "$W/rank_hardlink.h5"
ln "$W/model/model.safetensors" "$W/weights_hardlink.safetensors"
mkdir -p "$W/sub"

snapshot() {  # every input's bytes and every entry's name and type
  (cd "$W" && find model data.h5 deck.in ck metrics.jsonl -printf '%p %y\n' | sort &&
    find model data.h5 deck.in ck metrics.jsonl -type f -print0 | sort -z | xargs -0 sha256sum)
}
before=$(snapshot)

refused() {  # WORDS CMD... -- runs CMD, expects exit 2, WORDS in its output, inputs intact
  local words=$1
  shift
  n=$((n + 1))
  "$@" > "$W/case.log" 2>&1
  local rc=$?
  [ "$rc" -eq 2 ] || { cat "$W/case.log"; fail "exit $rc, expected 2: $*"; }
  grep -q -- "$words" "$W/case.log" || { cat "$W/case.log"; fail "no '$words' in the message of: $*"; }
  ! grep -q "^step \|tensors (" "$W/case.log" || fail "it worked before refusing: $*"
  [ "$(snapshot)" = "$before" ] || fail "an input changed: $*"
}

# kqlora-export, every mode, onto each input.
for opt in --merged --base --peft --gguf; do
  for out in "$rank" "$W/ck/$step" "$W/ck/$step/x.gguf" "$W/ck/latest" "$W/ck" \
    "$W/rank_hardlink.h5" "$W/sub/../ck/latest"; do
    refused "checkpoint" "$bin/kqlora-export" "$W/ck" "$opt" "$out"
  done
  for out in "$W/model" "$W/model/model.safetensors" "$W/model/config.json" "$W/model/new" \
    "$W/model_link" "$W/model_link/x" "$W/weights_hardlink.safetensors" "$W/sub/../model/"; do
    refused "hf_model_dir" "$bin/kqlora-export" "$W/ck" "$opt" "$out"
  done
  refused "contains" "$bin/kqlora-export" "$W/ck" "$opt" "$W"
  # A link followed by "..": the kernel resolves the link first (out/s/.. is the save_dir).
  refused "checkpoint" "$bin/kqlora-export" "$W/ck" "$opt" "$W/out/s/../latest"
done
# A directory where a file is expected; a directory output over a foreign directory.
mkdir -p "$W/out/a_dir" "$W/out/foreign" && echo "keep me" > "$W/out/foreign/notes.txt"
refused "existing directory" "$bin/kqlora-export" "$W/ck" --gguf "$W/out/a_dir"
for opt in --merged --peft; do
  refused "notes.txt" "$bin/kqlora-export" "$W/ck" "$opt" "$W/out/foreign"
done
[ "$(cat "$W/out/foreign/notes.txt")" = "keep me" ] || fail "the foreign directory changed"
# Another model's directory with only the names an export writes: not an earlier export.
mkdir -p "$W/out/other_model" && cp "$W/model/config.json" "$W/model/model.safetensors" "$W/out/other_model/"
refused "not an earlier kqlora-export output" "$bin/kqlora-export" "$W/ck" --merged "$W/out/other_model"
cmp -s "$W/model/model.safetensors" "$W/out/other_model/model.safetensors" || fail "other_model changed"

# kqlora-quantize: OUT onto IN, through a hard link, a symbolic link, a directory.
ln -s "$W/model/model.safetensors" "$W/weights_link.safetensors"
for out in "$W/model/model.safetensors" "$W/weights_hardlink.safetensors" \
  "$W/weights_link.safetensors" "$W/model"; do
  refused "input" "$bin/kqlora-quantize" "$W/model/model.safetensors" "$out"
done
refused "existing directory" "$bin/kqlora-quantize" "$W/model/model.safetensors" "$W/out/a_dir"

# kqlora-train: the metrics file and the save_dir onto its inputs.
for out in "$W/data.h5" "$W/deck.in" "$W/model/config.json" "$W/model_link/config.json" "$W/ck"; do
  refused "metrics_file" "$bin/kqlora-train" "$W/deck.in" $keys save_dir="$W/ck2" metrics_file="$out"
done
refused "existing directory" "$bin/kqlora-train" "$W/deck.in" $keys metrics_file="$W/out/a_dir"
for out in "$W/model" "$W/model/ck" "$W/model_link" "$W/data.h5"; do
  refused "save_dir" "$bin/kqlora-train" "$W/deck.in" $keys save_dir="$out"
done
refused "keep_last would delete it" "$bin/kqlora-train" "$W/deck.in" $keys save_dir="$W/ck" \
  metrics_file="$W/ck/$step/metrics.jsonl"
cp "$W/data.h5" "$W/ck/$step/data.h5"
before=$(snapshot)
refused "keep_last would delete it" "$bin/kqlora-train" "$W/deck.in" $keys save_dir="$W/ck" \
  data_file="$W/ck/$step/data.h5"
rm "$W/ck/$step/data.h5"
before=$(snapshot)
echo "$n outputs onto inputs refused, every input byte for byte"
# A metrics file in the save_dir (docs/FINETUNING.md's deck) and a save_dir reached through
# a link both work, a restart included.
ln -s "$W/ck" "$W/ck_link"
"$bin/kqlora-train" "$W/deck.in" $keys save_dir="$W/ck_link" metrics_file="$W/ck/metrics.jsonl" \
  num_steps=3 restart=latest > "$W/resume.log" 2>&1 || { tail "$W/resume.log"; fail "metrics in save_dir"; }
before=$(snapshot)

# An earlier export of the same kind is replaced whole (the step 1 adapters by step 2's).
"$bin/kqlora-export" "$W/ck/step-00000001" --peft "$W/out/peft" > "$W/e1.log" 2>&1 || fail "--peft 1"
first=$(sha256sum < "$W/out/peft/adapter_model.safetensors")
"$bin/kqlora-export" "$W/ck" --peft "$W/out/peft" > "$W/e2.log" 2>&1 || fail "--peft over --peft"
[ "$(sha256sum < "$W/out/peft/adapter_model.safetensors")" != "$first" ] || fail "--peft not replaced"
"$bin/kqlora-export" "$W/ck" --merged "$W/out/merged" > "$W/e3.log" 2>&1 || fail "--merged"
"$bin/kqlora-export" "$W/ck/step-00000001" --merged "$W/out/merged" > "$W/e4.log" 2>&1 ||
  fail "--merged over --merged"
# (a file of the old temporary's name is someone's: kept)
echo "keep me" > "$W/out/m.gguf.tmp"
"$bin/kqlora-export" "$W/ck" --gguf "$W/out/m.gguf" --gguf-type f32 > "$W/e5.log" 2>&1 || fail "--gguf"
[ "$(cat "$W/out/m.gguf.tmp")" = "keep me" ] || fail "--gguf wrote over OUT.tmp"
! ls -a "$W/out" | grep -q "\.tmp-" || fail "a temporary was left: $(ls -a "$W/out")"
echo "earlier exports replaced whole"

# A disk that fills up (or fails) during an export: exit 1, the earlier export intact.
# (--gguf writes through stdio, whose writes the injector does not see.)
for err in ENOSPC EIO; do
  for opt in "--merged $W/out/merged" "--peft $W/out/peft"; do
    out=${opt#* }
    out=${out%% *}
    old=$(find "$out" -type f -print0 | sort -z | xargs -0 sha256sum)
    # shellcheck disable=SC2086
    env LD_PRELOAD="$lib" KQLORA_FAULT_DIR="$W/out" KQLORA_FAULT_WRITE_ERRNO=$err \
      KQLORA_FAULT_AFTER_BYTES=3000 "$bin/kqlora-export" "$W/ck/step-00000001" $opt \
      > "$W/full.log" 2>&1
    rc=$?
    [ "$rc" -eq 1 ] || { cat "$W/full.log"; fail "$err $opt: exit $rc, expected 1"; }
    [ "$(find "$out" -type f -print0 | sort -z | xargs -0 sha256sum)" = "$old" ] ||
      fail "$err $opt: the earlier export changed"
    ! ls -a "$W/out" | grep -q "\.tmp-" || fail "$err $opt: a temporary was left: $(ls -a "$W/out")"
  done
done
echo "full and failing disks: exit 1, earlier exports intact, no temporaries"
echo "ok"
