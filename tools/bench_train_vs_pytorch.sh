#!/usr/bin/env bash
# kqlora-train against PyTorch + torchao on the same deck, whole processes, one thread each,
# side by side (input/bench_train.in: dim 4096, 4 layers, rank 16, global_bs 512, 10 steps,
# mse, adam). Needs torch and torchao. Usage: tools/bench_train_vs_pytorch.sh [build/bin]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/bin}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
t0=$(date +%s.%N)
"$bin/kqlora-train" input/bench_train.in | tee run/bench_train_kqlora.log | grep -E "^step|total|peak|^forward|^backward|^optimizer|^checkpoint"
t1=$(date +%s.%N)
python3 tools/torch_qlora_train.py --dim 4096 --layers 4 --rank 16 --global-bs 512 --steps 10 \
    --loss mse --optimizer adam --lr 1e-2 2>&1 | grep -v Warn | tee run/bench_train_torch.log | tail -3
t2=$(date +%s.%N)
python3 - "$t0" "$t1" "$t2" <<'PY'
import sys
t0, t1, t2 = map(float, sys.argv[1:])
k, p = t1 - t0, t2 - t1
print(f"whole process: kqlora-train {k:.1f} s, PyTorch+torchao {p:.1f} s, speed-up {p / k:.2f}x")
PY
