#!/usr/bin/env bash
# The two training runs the GPU check compares with this CPU's (tools/gpu_prep.sh writes
# the CPU's, tools/gpu_check.sh repeats them on the GPU; docs/GPU.md):
#
#   bash tools/gpu_runs.sh write-inputs DIR      the 135M-shaped model and its token file
#   bash tools/gpu_runs.sh model DIR             the model alone (the token file kept)
#   bash tools/gpu_runs.sh run BIN DIR WORK [KEY=VALUE ...]
#   bash tools/gpu_runs.sh compare REF_DIR WORK RTOL
#
# write-inputs: DIR/model, a random-weight SmolLM2-135M-shaped llama with 2 layers
# (tools/make_hf_model.py, seed 0, bfloat16; about 60 MB, never committed or staged) and its
# SHA-256 in DIR/model.sha256; DIR/tokens.h5, 8 rows of 128 random token ids (NumPy seed 0;
# a few kilobytes); DIR/llm.in, the deck (all-linear LoRA rank 8, AdamW, 4 steps of 2 rows).
# run: BIN/kqlora-train on input/seed.in and on DIR/llm.in, each with KEY=VALUE overrides
# (e.g. comm=mpi), under $KQLORA_LAUNCH if set (e.g. "mpirun -np 2"); the per-step losses
# into WORK/seed.losses and WORK/llm.losses, logs beside them. compare: each WORK loss
# against REF_DIR's within RTOL (relative), a line per step; exit 1 on a difference.
# KQLORA_GPU_RUNS="seed" (run, compare) limits them to the seed scenario (a build without
# HDF5 reads no token file).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
[ "${1:-}" = -h ] || [ "${1:-}" = --help ] || [ $# -lt 2 ] && { usage; exit 0; }
cmd=$1
shift

make_model() {
  local dir=$1
  rm -rf "$dir/model"
  python3 tools/make_hf_model.py "$dir/model" --family llama --preset smollm2-135m \
    --config '{"num_hidden_layers": 2}' --dtype bf16 --seed 0 >/dev/null
  (cd "$dir/model" && sha256sum config.json ./*.safetensors) >"$dir/model.sha256.new"
  if [ -f "$dir/model.sha256" ] && ! cmp -s "$dir/model.sha256" "$dir/model.sha256.new"; then
    echo "gpu_runs.sh: the model made here differs from the reference's (another torch?):" \
      "losses are compared all the same, expect differences" >&2
    mv "$dir/model.sha256.new" "$dir/model.sha256.here"
  else
    mv "$dir/model.sha256.new" "$dir/model.sha256"
  fi
}

case "$cmd" in
  write-inputs)
    dir=$1
    mkdir -p "$dir"
    make_model "$dir"
    python3 - "$dir/tokens.h5" <<'PY'
import sys
import h5py
import numpy as np
ids = np.random.default_rng(0).integers(0, 49152, size=(8, 128), dtype=np.int64).astype(np.int32)
with h5py.File(sys.argv[1], "w", libver=("v110", "v110")) as f:
    f.create_dataset("input_ids", data=ids)
    f.create_dataset("labels", data=ids)
PY
    cat >"$dir/llm.in" <<'EOF'
# tools/gpu_runs.sh: a random-weight SmolLM2-135M-shaped model (2 layers), 4 AdamW steps.
model = causal_lm
hf_model_dir = model
data_file = tokens.h5
lora_targets = all-linear
lora_rank = 8
lora_alpha = 16
scaler_block_size = 64
global_bs = 2
micro_bs = 1
num_steps = 4
optimizer = adamw
lr = 2e-3
log_every = 1
EOF
    ;;
  model) make_model "$1" ;;
  run)
    bin=$(realpath "$1") dir=$(realpath "$2") work=$3
    shift 3
    mkdir -p "$work"
    work=$(realpath "$work")
    launch=${KQLORA_LAUNCH:-}
    for run in ${KQLORA_GPU_RUNS:-seed llm}; do
      rm -rf "${work:?}/$run"
      if [ $run = seed ]; then
        deck=$PWD/input/seed.in
        keys=(save_dir="$work/seed/checkpoints")
      else
        deck=$dir/llm.in
        keys=(hf_model_dir="$dir/model" data_file="$dir/tokens.h5"
              save_dir="$work/llm/checkpoints")
      fi
      mkdir -p "$work/$run"
      # shellcheck disable=SC2086
      $launch "$bin/kqlora-train" "$deck" "${keys[@]}" metrics_file="$work/$run/metrics.jsonl" \
        "$@" >"$work/$run.log" 2>&1 || {
        echo "gpu_runs.sh: the $run run failed: the end of $work/$run.log:" >&2
        grep -m3 "error" "$work/$run.log" >&2  # (the reason, ahead of MPI's notices)
        tail -15 "$work/$run.log" >&2
        exit 1
      }
      python3 - "$work/$run/metrics.jsonl" >"$work/$run.losses" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r and "step" in r:
        print(r["step"], repr(r["loss"]))
PY
    done
    ;;
  compare)
    ref=$1 work=$2 rtol=$3
    python3 - "$ref" "$work" "$rtol" ${KQLORA_GPU_RUNS:-seed llm} <<'PY'
import sys
ref, work, rtol = sys.argv[1], sys.argv[2], float(sys.argv[3])
bad = 0
for run in sys.argv[4:]:
    def read(path):
        return {int(s): float(v) for s, v in (l.split() for l in open(path) if l.strip())}
    a, b = read("%s/%s.losses" % (ref, run)), read("%s/%s.losses" % (work, run))
    if sorted(a) != sorted(b) or not a:
        print("%s: steps differ: reference %s, here %s" % (run, sorted(a), sorted(b)))
        bad += 1
        continue
    for s in sorted(a):
        d = abs(b[s] - a[s]) / max(abs(a[s]), 1e-30)
        ok = d <= rtol
        bad += not ok
        print("%s step %d: CPU %.9g, here %.9g, relative difference %.2e %s" %
              (run, s, a[s], b[s], d, "ok" if ok else "OVER %.0e" % rtol))
sys.exit(1 if bad else 0)
PY
    ;;
  *) echo "gpu_runs.sh: unknown command '$cmd' (--help)" >&2; exit 2 ;;
esac
