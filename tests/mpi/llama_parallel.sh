#!/usr/bin/env bash
# The Llama model under data parallelism: DDP (node shared memory, and buckets) and FSDP
# at 2 ranks give the one-process run's adapters (kqlora-diff, rtol 1e-5) and eval losses
# (shuffled rows, global batches of 2 over 3 rows: steps straddle epochs; the evaluation's
# last global batch leaves rank 1 an empty micro-batch), and an FSDP run of 3 steps resumed
# to 5 equals the straight 5 steps bit for bit (parameters and optimizer state); FSDP at 3
# ranks (shared layout, activation checkpointing), DDP at 4, and a run moved from DDP at 4
# ranks to FSDP at 3 mid-way give the one-process run's adapters and eval losses. The model
# is a reference case's directory: tests/data/llama_reference/gqa (GQA, untied head), and
# family cases (tests/data/family_reference: phi3's fused projections, gemma2's soft-caps
# and sandwich norms, qwen3's biases and q/k norms). Last, bfloat16 FSDP at 2 ranks with the
# activations kept in 16 bits equals the same run keeping them in float32, bit for bit.
# The experts' load-balancing loss is off: a product of batch means, it is not additive over
# ranks and micro-batches (docs/MODELS.md, "Experts"). AdamW's eps is 1e-3: at 1e-8 the
# last bits of a near-zero gradient, which a reduction over ranks sums in another order,
# become steps of up to lr (an expert's adapter that few tokens chose: gpt_oss failed so in
# the sanitizer build).
# usage: llama_parallel.sh MPIEXEC "MPIEXEC_FLAGS" KQLORA_TRAIN KQLORA_DIFF DATA_DIR WORKDIR
#        [ONE_TARGET (a projection of the family: the lora_targets a restart refuses)]
set -u
mpiexec=$1 flags=$2 train=$3 diff=$4 model=$5 dir=$6 target=${7:-q_proj}
rm -rf "$dir" && mkdir -p "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
echo "model = causal_lm" > "$dir/deck.in"
keys="hf_model_dir=$model init_file=$model/init.h5 data_file=$model/data.h5 lora_rank=4
  lora_alpha=8 block_size=32 scaler_block_size=32 global_bs=2 micro_bs=1 optimizer=adamw
  lr=1e-2 eps=1e-3 log_every=100 shuffle=true eval_file=$model/data.h5 eval_every=2
  router_aux_loss=off"
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
run 1 one num_steps=5
run 2 ddp num_steps=5
run 2 buckets num_steps=5 ddp_shared_memory=off bucket_mb=0.01
run 2 fsdp num_steps=5 parallel=fsdp
run 2 fsdp_split num_steps=3 parallel=fsdp
run 2 fsdp_split num_steps=5 parallel=fsdp restart=latest
# np 3 and 4 (global_bs 4: slices of 2, 1, 1 and 1 each), the shared layout, activation
# checkpointing, and a resume at another world size and mode: 3 steps of DDP at 4 ranks,
# then 2 of FSDP at 3, against 5 at 1 -- all with micro_bs 1 (gradient accumulation).
run 1 one4 num_steps=5 global_bs=4
run 3 fsdp3 num_steps=5 global_bs=4 parallel=fsdp checkpoint_layout=shared activation_checkpointing=true
run 4 ddp4 num_steps=5 global_bs=4 checkpoint_layout=shared
run 4 moved num_steps=3 global_bs=4
run 3 moved num_steps=5 global_bs=4 parallel=fsdp restart=latest
# A restart on another base is refused (exit 2), naming what differs: the NF4 kqlora
# quantizes itself (no init_file) differs from torchao's in init.h5 in the last bit of
# scaler_mean (docs/NF4.md); another config.json; other lora_targets.
refused() {  # WHAT KEYS...
  local what=$1
  shift
  # shellcheck disable=SC2086
  "$train" "$dir/deck.in" $keys save_dir="$dir/fsdp_split" num_steps=6 restart=latest "$@" \
    > "$dir/refused.log" 2>&1
  local rc=$?
  [ "$rc" -eq 2 ] && grep -q "$what" "$dir/refused.log" \
    || { echo "FAILED: restart with $* (exit $rc)"; cat "$dir/refused.log"; exit 1; }
  echo "refused: $* ($what)"
}
refused "the base quantized from" init_file=none
mkdir -p "$dir/other" && sed 's/"rms_norm_eps": [^,]*/"rms_norm_eps": 1.5e-06/' \
  "$model/config.json" > "$dir/other/config.json" && cp "$model/model.safetensors" "$dir/other/"
refused "config.json: $dir/other/config.json differs" hf_model_dir="$dir/other"
refused "lora_targets: checkpoint all-linear, deck $target" lora_targets="$target"
same_eval() {  # REF TEST: the eval losses within rtol 1e-5
  paste <(grep -o '"eval_loss": [^,}]*' "$dir/$1.jsonl") \
    <(grep -o '"eval_loss": [^,}]*' "$dir/$2.jsonl") | awk -v ref="$1" -v test="$2" '
    { d = $2 - $4; if (d < 0) d = -d; if (d > 1e-5 * $2 || $2 == "") bad = 1; n++ }
    END { if (bad || n != 2) { print "FAILED: eval losses of " test " differ from " ref; exit 1 }
          print test " = " ref ": " n " eval losses within rtol 1e-5" }' || exit 1
}
same_eval one ddp
same_eval one fsdp
same_eval one4 fsdp3
same_eval one4 ddp4
same one ddp --rtol 1e-5 --atol 1e-6
same one buckets --rtol 1e-5 --atol 1e-6
same one fsdp --rtol 1e-5 --atol 1e-6
same fsdp fsdp_split --rtol 0 --atol 0 --optimizer
same one4 fsdp3 --rtol 1e-5 --atol 1e-6
same one4 ddp4 --rtol 1e-5 --atol 1e-6
same one4 moved --rtol 1e-5 --atol 1e-6
# bfloat16 under FSDP at 2 ranks, the activations kept in 16 bits (a GPU's default) and in
# float32: the same adapters and optimizer state, bit for bit.
run 2 fsdp_bf16_kept32 num_steps=3 parallel=fsdp dtype=bfloat16 init_file=none activation_dtype=float32
run 2 fsdp_bf16_kept16 num_steps=3 parallel=fsdp dtype=bfloat16 init_file=none activation_dtype=bfloat16
same fsdp_bf16_kept32 fsdp_bf16_kept16 --rtol 0 --atol 0 --optimizer
echo "ok"
