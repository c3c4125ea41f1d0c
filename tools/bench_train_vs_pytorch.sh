#!/usr/bin/env bash
# kqlora-train against PyTorch + torchao on the same deck, whole processes, one thread each,
# interleaved (kqlora, PyTorch, kqlora, ...), medians and the median of the per-pair ratios.
# Needs torch and torchao.
#   tools/bench_train_vs_pytorch.sh [DECK] [PAIRS] [BIN]
# DECK defaults to input/bench_train.in (dim 4096, 4 layers, rank 16, global_bs 512, 10
# steps, mse, adam); input/bench_train_2048.in is the dim 2048 shape. The PyTorch side
# (tools/torch_qlora_train.py) takes the deck's dim, num_linears, lora_rank, lora_alpha,
# global_bs, num_steps, loss, optimizer and lr.
set -euo pipefail
cd "$(dirname "$0")/.."
deck=${1:-input/bench_train.in}
pairs=${2:-3}
bin=${3:-build/bin}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
key() { sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*\([^#[:space:]]*\).*/\1/p" "$deck"; }
torch_args=(--dim "$(key dim)" --layers "$(key num_linears)" --rank "$(key lora_rank)"
            --alpha "$(key lora_alpha)" --global-bs "$(key global_bs)" --steps "$(key num_steps)"
            --loss "$(key loss)" --optimizer "$(key optimizer)" --lr "$(key lr)")
mkdir -p run
"$bin/kqlora-train" --version | grep -E "CPU|BLAS"
times=()
for i in $(seq "$pairs"); do
  t0=$(date +%s.%N)
  "$bin/kqlora-train" "$deck" save_dir=run/bench_train_vs_pytorch > run/bench_train_kqlora.log
  t1=$(date +%s.%N)
  python3 tools/torch_qlora_train.py "${torch_args[@]}" > run/bench_train_torch.log 2>&1
  t2=$(date +%s.%N)
  times+=("$t0 $t1 $t2")
  echo "pair $i: kqlora-train $(python3 -c "print(f'{$t1-$t0:.2f}')") s, PyTorch+torchao $(python3 -c "print(f'{$t2-$t1:.2f}')") s"
done
grep -E "^(forward|backward|optimizer|setup|total|peak)" run/bench_train_kqlora.log || true
tail -1 run/bench_train_torch.log
python3 - "${times[@]}" <<'PY'
import statistics, sys
pairs = [tuple(map(float, a.split())) for a in sys.argv[1:]]
k = [b - a for a, b, c in pairs]
p = [c - b for a, b, c in pairs]
r = [y / x for x, y in zip(k, p)]
print(f"whole process (median of {len(pairs)}): kqlora-train {statistics.median(k):.2f} s, "
      f"PyTorch+torchao {statistics.median(p):.2f} s; speed-up median {statistics.median(r):.2f}x "
      f"(pairs: {', '.join(f'{x:.2f}x' for x in r)})")
PY
