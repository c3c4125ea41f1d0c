#!/usr/bin/env python3
"""Writes the NF4 golden data the C++ tests compare against, produced by torchao itself.

Run once (needs `pip install torch torchao`); the outputs are committed:
    python3 tools/gen_nf4_golden.py tests/data/nf4_golden

Each case is a folder of raw little-endian arrays:
    input.bin               the float32 or bfloat16 input (bfloat16 as uint16 bit patterns)
    quantized_data.bin      uint8, numel/2
    quantized_scalers.bin   int8, n_blocks
    quantization_factor.bin input dtype, n_scaler_blocks
    scaler_mean.bin         input dtype, 1 element
    dequantized.bin         input dtype, numel (torchao's get_original_weight)
and manifest.txt holds one line per case: name dtype rows cols block_size scaler_block_size
(cols = 0 for a 1-D tensor).
"""
import os
import sys

import torch

torch.set_num_threads(1)  # torchao's scaler_mean depends on the thread count (docs/NF4.md)

from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4  # noqa: E402

NF4_LITERALS = [-1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0,
                0.0796, 0.1609, 0.2461, 0.3379, 0.4407, 0.5626, 0.7230, 1.0]


def raw_bytes(t):
    t = t.contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def tie_input(shape, dtype, gen):
    """Blocks whose scaled values sit on the midpoints between codebook values, so the
    tie rule (lower index) and the rounding of the distances are exercised."""
    x = torch.randn(shape, generator=gen).to(dtype).flatten()
    nf4 = torch.tensor(NF4_LITERALS, dtype=dtype)
    mids = ((nf4[:-1].float() + nf4[1:].float()) / 2).to(dtype)
    block = 64
    for b in range(0, x.numel() // block, 2):  # every other block
        blk = x[b * block:(b + 1) * block]
        blk[0] = 1.0  # absmax 1: x/absmax is x
        for j in range(1, block):
            blk[j] = mids[j % len(mids)] * (1 if j % 2 else -1)
    return x.view(shape)


def cases():
    gen = torch.Generator().manual_seed(20261130)
    wide = lambda shape: torch.randn(shape, generator=gen) * torch.exp(3 * torch.randn(shape, generator=gen))
    out = []
    for dtype, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        out.append((f"randn_128x128_{tag}", torch.randn(128, 128, generator=gen).to(dtype), 64, 256))
        out.append((f"wide_128x64_{tag}", wide((128, 64)).to(dtype), 64, 128))
        out.append((f"vector_2048_{tag}", torch.randn(2048, generator=gen).to(dtype), 32, 8))
        out.append((f"ties_64x64_{tag}", tie_input((64, 64), dtype, gen), 64, 16))
        out.append((f"small_blocks_40x96_{tag}", torch.randn(40, 96, generator=gen).to(dtype), 32, 8))
        out.append((f"odd_blocks_24x64_{tag}", torch.randn(24, 64, generator=gen).to(dtype), 16, 12))
    return out


def main(folder):
    os.makedirs(folder, exist_ok=True)
    manifest = []
    for name, x, bs, sbs in cases():
        nf4 = to_nf4(x, bs, sbs)
        d = os.path.join(folder, name)
        os.makedirs(d, exist_ok=True)
        parts = {
            "input": x,
            "quantized_data": nf4.quantized_data,
            "quantized_scalers": nf4.quantized_scalers,
            "quantization_factor": nf4.quantization_factor,
            "scaler_mean": nf4.scaler_mean.reshape(1),
            "dequantized": nf4.get_original_weight(),
        }
        for part, t in parts.items():
            with open(os.path.join(d, part + ".bin"), "wb") as f:
                f.write(raw_bytes(t))
        dtype = "float32" if x.dtype == torch.float32 else "bfloat16"
        cols = x.shape[1] if x.dim() == 2 else 0
        manifest.append(f"{name} {dtype} {x.shape[0]} {cols} {bs} {sbs}")
    with open(os.path.join(folder, "manifest.txt"), "w") as f:
        f.write(f"# torch {torch.__version__}, torchao (to_nf4), torch.set_num_threads(1)\n")
        f.write("\n".join(manifest) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/nf4_golden")
