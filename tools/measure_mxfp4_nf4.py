#!/usr/bin/env python3
"""What NF4 costs on top of MXFP4 (docs/MODELS.md, "Experts"): kqlora decodes gpt-oss's
MXFP4 experts exactly and quantizes them again to NF4 (torchao's, block 64, scalers 256).
On one expert's gate_up of gpt-oss-20b's shape ([2 * 2880, 2880]; its first 5632 rows, as
torchao's NF4 needs whole scaler blocks, which kqlora does not), drawn N(0, 0.02) with
rows' scales log-normal (sigma 0.5) -- the hub's weights themselves are not downloadable
here -- this prints the relative RMS errors of

  MXFP4(W)          against W           (the checkpoint's own rounding)
  NF4(MXFP4(W))     against MXFP4(W)    (the second quantization: what kqlora adds)
  NF4(MXFP4(W))     against W
  NF4(W)            against W           (NF4 alone, had the weights been float)

and the same for the products x W^T over 256 random inputs.

    python3 tools/measure_mxfp4_nf4.py [--rows 5632 --cols 2880 --seed 0]

Needs torch and torchao (pip).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_moe_reference import mxfp4_encode, mxfp4_values  # noqa: E402
from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4  # noqa: E402


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5632)
    ap.add_argument("--cols", type=int, default=2880)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    scale = torch.exp(0.5 * torch.randn(args.rows, 1, generator=g))
    w = 0.02 * torch.randn(args.rows, args.cols, generator=g) * scale
    mx = mxfp4_values(*mxfp4_encode(w)).float()
    nf4 = lambda t: to_nf4(t.to(torch.bfloat16), 64, 256).get_original_weight().float()  # noqa
    w_mx_nf4, w_nf4 = nf4(mx), nf4(w)
    x = torch.randn(256, args.cols, generator=g)
    y, y_mx = x @ w.T, x @ mx.T
    print("[%d, %d], N(0, 0.02) x log-normal row scales, NF4 in bfloat16 (block 64/256)"
          % (args.rows, args.cols))
    print("relative RMS error       weights   products")
    for name, a, b, ya, yb in (
            ("MXFP4(W) vs W", mx, w, y_mx, y),
            ("NF4(MXFP4(W)) vs MXFP4(W)", w_mx_nf4, mx, x @ w_mx_nf4.T, y_mx),
            ("NF4(MXFP4(W)) vs W", w_mx_nf4, w, x @ w_mx_nf4.T, y),
            ("NF4(W) vs W", w_nf4, w, x @ w_nf4.T, y)):
        print("%-26s %.4f    %.4f" % (name, rel(a, b), rel(ya, yb)))


if __name__ == "__main__":
    main()
