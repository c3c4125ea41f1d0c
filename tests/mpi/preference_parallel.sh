#!/usr/bin/env bash
# Preference training under data parallelism (docs/TRAINING.md, "Preference training"):
# DPO and ORPO over a reference case's pairs (tests/data/preference_reference/gqa) at 2 ranks
# (DDP, FSDP) and 3 ranks (FSDP, activation checkpointing) give the one-process run's
# adapters (kqlora-diff, rtol 1e-5) and its eval losses and reward metrics (rtol 1e-5):
# a pair's rows stay together through the shuffle, the micro-batches (micro_bs 1: one pair)
# and the ranks, and ORPO's token count is the global batch's. An FSDP DPO run of 3 steps
# resumed to 5 equals the straight 5 bit for bit (the reference: the starting adapters,
# read again from the init_file), and one from other starting adapters is refused.
# usage: preference_parallel.sh MPIEXEC "MPIEXEC_FLAGS" KQLORA_TRAIN KQLORA_DIFF MODEL_DIR
#        PAIRS_FILE WORKDIR
set -u
mpiexec=$1 flags=$2 train=$3 diff=$4 model=$5 pairs=$6 dir=$7
rm -rf "$dir" && mkdir -p "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
echo "model = causal_lm" > "$dir/deck.in"
keys="hf_model_dir=$model init_file=$model/init.h5 data_file=$pairs lora_rank=4 lora_alpha=8
  block_size=32 scaler_block_size=32 global_bs=3 micro_bs=1 optimizer=adamw lr=1e-2 eps=1e-3
  log_every=100 shuffle=true eval_file=$pairs eval_every=2 num_steps=5"
run() {  # NP NAME KEYS...
  local np=$1 name=$2
  shift 2
  # shellcheck disable=SC2086
  "$mpiexec" -np "$np" $flags "$train" "$dir/deck.in" $keys save_dir="$dir/$name" \
    metrics_file="$dir/$name.jsonl" "$@" \
    > "$dir/$name.log" 2>&1 || { echo "FAILED: $name"; tail "$dir/$name.log"; exit 1; }
}
same() {  # REF TEST DIFF-ARGS...
  local ref=$1 test=$2
  shift 2
  "$diff" "$dir/$ref" "$dir/$test" "$@" > "$dir/diff_$test.log" 2>&1 \
    || { echo "FAILED: $test differs from $ref"; cat "$dir/diff_$test.log"; exit 1; }
  echo "$test = $ref: $(tail -n 1 "$dir/diff_$test.log")"
}
same_eval() {  # REF TEST: every eval_ number within rtol 1e-5 (atol 1e-7)
  paste <(grep -o '"eval_[^"]*": [^,}]*' "$dir/$1.jsonl" | sed 's/.*: //') \
    <(grep -o '"eval_[^"]*": [^,}]*' "$dir/$2.jsonl" | sed 's/.*: //') |
    awk -v ref="$1" -v test="$2" '
    { d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
      if ($2 == "" || d > 1e-5 * a + 1e-7) bad = 1; n++ }
    END { if (bad || n < 14) { print "FAILED: eval metrics of " test " differ from " ref; exit 1 }
          print test " = " ref ": " n " eval numbers within rtol 1e-5" }' || exit 1
}
for objective in dpo orpo; do
  run 1 "${objective}_one" objective=$objective
  run 2 "${objective}_ddp" objective=$objective
  run 2 "${objective}_fsdp" objective=$objective parallel=fsdp
  run 3 "${objective}_fsdp3" objective=$objective parallel=fsdp activation_checkpointing=true
  for test in ddp fsdp fsdp3; do
    same_eval "${objective}_one" "${objective}_$test"
    same "${objective}_one" "${objective}_$test" --rtol 1e-5 --atol 1e-6
  done
done
run 2 dpo_split objective=dpo parallel=fsdp num_steps=3
run 2 dpo_split objective=dpo parallel=fsdp restart=latest
same dpo_fsdp dpo_split --rtol 0 --atol 0 --optimizer
# A restart whose starting adapters are not the checkpoint's (another init_file) would
# change the reference mid-run: refused (exit 2), naming both hashes.
# shellcheck disable=SC2086
"$train" "$dir/deck.in" $keys objective=dpo save_dir="$dir/dpo_split" num_steps=6 \
  restart=latest init_file="$(dirname "$pairs")/init_fresh.h5" > "$dir/refused.log" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "the checkpoint's reference_hash is" "$dir/refused.log" \
  || { echo "FAILED: a restart from other adapters (exit $rc)"; cat "$dir/refused.log"; exit 1; }
echo "refused: a restart from other starting adapters"
echo "ok"
