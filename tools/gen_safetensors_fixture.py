#!/usr/bin/env python3
"""Writes tests/data/safetensors/fixture.safetensors with the Python safetensors package
(an independent writer for the reader's test). Run once; the output is committed.
    python3 tools/gen_safetensors_fixture.py tests/data/safetensors
Every float tensor holds value[i] = (i - 5) / 8, exact in F32, BF16 and F16."""
import os
import sys

import torch
from safetensors.torch import save_file

out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/safetensors"
os.makedirs(out, exist_ok=True)
base = (torch.arange(12, dtype=torch.float64) - 5) / 8
tensors = {
    "w_f32": base.to(torch.float32).reshape(3, 4),
    "w_bf16": base.to(torch.bfloat16).reshape(3, 4),
    "w_f16": base.to(torch.float16).reshape(3, 4),
    "ids": torch.arange(5, dtype=torch.int64),
}
save_file(tensors, os.path.join(out, "fixture.safetensors"), metadata={"format": "pt"})
