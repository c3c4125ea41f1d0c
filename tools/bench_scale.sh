#!/usr/bin/env bash
# The seed's model at scale (docs/BENCHMARKS.md, "The 7B shape"): a Llama-2-7B-shaped
# directory of random BF16 weights (tools/make_hf_model.py, streamed, 13.5 GB under
# run/scale/, never committed), trained with FSDP at 2 ranks on rows of 256 tokens, 2 rows
# a step, one thread per rank, with and without activation checkpointing. Prints each run's
# set-up, step times, memory and page-fault lines; the full logs stay in run/scale/.
#
#   bash tools/bench_scale.sh [--preset llama2-7b] [--steps 3] [--np 2] [--ac on,off]
#                             [--dtype float32|bfloat16]  (the runs' dtype; default float32)
#                             [--cold]   (drop the page cache first: root only)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
preset=llama2-7b steps=3 np=2 acs=on,off cold=0 dtype=float32
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --np) np="$2"; shift 2 ;;
    --ac) acs="$2"; shift 2 ;;
    --dtype) dtype="$2"; shift 2 ;;
    --cold) cold=1; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "bench_scale.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
work="$ROOT/run/scale"
model="$work/$preset"
mkdir -p "$work"
if [ ! -f "$model/config.json" ]; then
  family=$(python3 -c "import sys; sys.path.insert(0, '$ROOT/tools'); from make_hf_model import PRESETS; print(PRESETS['$preset'][0])")
  python3 "$ROOT/tools/make_hf_model.py" "$model" --family "$family" --preset "$preset" --dtype bf16
fi
vocab=$(python3 -c "import json; print(json.load(open('$model/config.json'))['vocab_size'])")
data="$work/tokens_$vocab.h5"
[ -f "$data" ] || python3 -c "import sys; sys.path.insert(0, '$ROOT/tools'); from bench_llama_vs_pytorch import token_file; token_file('$data', 8, 256, $vocab)"
printf 'model = causal_lm\n' > "$work/scale.in"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
for ac in ${acs//,/ }; do
  if [ "$cold" = 1 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi
  tag="${preset}_ac_$ac"
  [ "$dtype" = float32 ] || tag="${tag}_$dtype"
  log="$work/$tag.log"
  mpirun -np "$np" --oversubscribe "$ROOT/build/bin/kqlora-train" "$work/scale.in" \
    hf_model_dir="$model" data_file="$data" global_bs="$np" micro_bs=1 num_steps="$steps" \
    optimizer=adamw lr=1e-4 lora_rank=8 lora_alpha=16 block_size=64 scaler_block_size=256 \
    checkpoint_every=0 parallel=fsdp activation_checkpointing="$ac" dtype="$dtype" \
    save_dir="$work/ck_$ac" metrics_file="$work/$tag.jsonl" > "$log" 2>&1
  echo "== $preset, FSDP np $np, activation_checkpointing = $ac, $dtype ($log)"
  grep -E "^memory estimate per rank:|^step |^setup |^peak memory|^minor page faults|^memory estimate per rank [0-9]" "$log" | cut -c1-160
done
