#!/usr/bin/env python3
"""The PyTorch + torchao counterpart of a kqlora-train run, for speed comparisons: a stack
of torchtune-style LoRA linears over torchao NF4 weights (linear_nf4 dequantizes the whole
weight in every forward and backward), synthetic data, one thread.

    python3 tools/torch_qlora_train.py --dim 4096 --layers 4 --rank 16 --global-bs 512 \\
        --steps 10 --loss mse --optimizer adam --lr 1e-2
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4, to_nf4  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--dim", type=int, default=4096)
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--rank", type=int, default=16)
ap.add_argument("--alpha", type=float, default=16.0)
ap.add_argument("--global-bs", type=int, default=512)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--loss", default="mse")
ap.add_argument("--optimizer", default="adam")
ap.add_argument("--lr", type=float, default=1e-2)
args = ap.parse_args()

t0 = time.perf_counter()
gen = torch.Generator().manual_seed(0)
d, r = args.dim, args.rank
weights, params = [], []
for _ in range(args.layers):
    weights.append(to_nf4(torch.randn(d, d, generator=gen)))
    a = torch.empty(r, d)
    b = torch.empty(d, r)
    torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5))
    torch.nn.init.kaiming_uniform_(b, a=math.sqrt(5))
    params += [a.requires_grad_(True), b.requires_grad_(True)]
opt = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[args.optimizer](
    params, lr=args.lr)
t_setup = time.perf_counter() - t0
for step in range(args.steps):
    x = torch.randn(args.global_bs, d, generator=gen)
    target = torch.randn(args.global_bs, d, generator=gen)
    for l in range(args.layers):
        x = linear_nf4(x, weights[l]) + (args.alpha / r) * F.linear(F.linear(x, params[2 * l]), params[2 * l + 1])
    loss = x.sum() if args.loss == "sum" else F.mse_loss(x, target)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step + 1} loss {loss.item():.6g} elapsed {time.perf_counter() - t0:.1f}s", flush=True)
print(f"setup {t_setup:.2f}s, total {time.perf_counter() - t0:.2f}s")
