#!/usr/bin/env python3
"""torch's bfloat16 dense linear at the QLoRA linear benchmark's shape, forward and input
gradient: what tools/gpu_check.sh compares kqlora-bench's qlora_linear record with
(docs/GPU.md, target: at most 1.3 times its time).

    python3 tools/gpu_bench_torch.py OUT.json DIM TOKENS [cuda|any]

Writes {"device", "dim", "tokens", "median_s"} (the median of 20 timed calls after 3), on
the GPU where torch sees one, else on the CPU; with `cuda` a missing GPU is an error
("no CUDA device ..."), since a CPU time is no reference for a GPU's."""
import json
import sys
import time

if len(sys.argv) not in (4, 5) or sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2)
import torch

dim, tokens = int(sys.argv[2]), int(sys.argv[3])
dev = "cuda" if torch.cuda.is_available() else "cpu"
if dev == "cpu" and len(sys.argv) == 5 and sys.argv[4] == "cuda":
    sys.exit("gpu_bench_torch.py: no CUDA device visible to torch %s" % torch.__version__)
lin = torch.nn.Linear(dim, dim, bias=False, dtype=torch.bfloat16, device=dev).requires_grad_(False)
x = torch.randn(tokens, dim, dtype=torch.bfloat16, device=dev, requires_grad=True)
g = torch.randn(tokens, dim, dtype=torch.bfloat16, device=dev)


def once():
    lin(x).backward(g)


sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
for _ in range(3):
    once()
t = []
for _ in range(20):
    sync()
    a = time.perf_counter()
    once()
    sync()
    t.append(time.perf_counter() - a)
t.sort()
json.dump({"device": dev, "dim": dim, "tokens": tokens, "median_s": t[len(t) // 2]},
          open(sys.argv[1], "w"))
