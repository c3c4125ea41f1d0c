#!/usr/bin/env python3
"""Checks kqlora-export's outputs with the Python ecosystem, independently of kqlora:

    python3 tools/check_export_peft.py CHECKPOINT_FILE MERGED.safetensors PEFT_DIR

Needs h5py, numpy, torch, safetensors and peft (pip install peft). It
  1. rebuilds each base weight from the checkpoint's NF4 components with NumPy (the
     docs/NF4.md recipe) and reads lora_a/lora_b with h5py;
  2. loads PEFT_DIR into a torch model of nn.Linear layers named layers.<i> with
     peft.PeftModel.from_pretrained, checks the adapters it loaded, and compares its
     merge_and_unload() weights with MERGED.safetensors and with W + (alpha/r) B A;
  3. compares the PEFT model's forward with the merged weights' on random inputs.
Prints one line per check and `Passed!` or `Failed!` (exit 0 or 1).
"""
import json
import sys

import h5py
import numpy as np
import torch
from peft import PeftModel
from safetensors.numpy import load_file

NF4 = np.array([-1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0,
                0.0796, 0.1609, 0.2461, 0.3379, 0.4407, 0.5626, 0.7230, 1.0], np.float32)


def dequantize(g):
    data = g["quantized_data"][...]
    q = g["quantized_scalers"][...].astype(np.float32)
    factor = g["quantization_factor"][...].astype(np.float32)
    mean = np.float32(g["scaler_mean"][0])
    bs, sbs = int(g.attrs["block_size"]), int(g.attrs["scaler_block_size"])
    codes = np.stack([data >> 4, data & 15], axis=-1).reshape(-1)
    scale = (q / np.repeat(factor, sbs)[: q.size]).astype(np.float32) + mean
    return (NF4[codes] * np.repeat(scale, bs)).reshape(tuple(g.attrs["shape"]))


class Stack(torch.nn.Module):
    def __init__(self, weights):
        super().__init__()
        self.layers = torch.nn.ModuleList()
        for w in weights:
            lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
            lin.weight.data = torch.from_numpy(w.copy())
            self.layers.append(lin)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def main(ckpt, merged_path, peft_dir):
    ok = True

    def check(name, good, detail=""):
        nonlocal ok
        ok &= bool(good)
        print(f"{'ok  ' if good else 'FAIL'} {name} {detail}")

    with h5py.File(ckpt, "r") as f:
        p = f["params"]
        n = len([k for k in p if k.endswith(".weight") and k.count(".") == 2])
        base = [dequantize(p[f"layers.{i}.weight"]) for i in range(n)]
        A = [p[f"layers.{i}.lora_a.weight"][...] for i in range(n)]
        B = [p[f"layers.{i}.lora_b.weight"][...] for i in range(n)]
    cfg = json.load(open(f"{peft_dir}/adapter_config.json"))
    scale = cfg["lora_alpha"] / cfg["r"]
    check("adapter_config", cfg["peft_type"] == "LORA" and cfg["r"] == A[0].shape[0]
          and cfg["bias"] == "none", f"r={cfg['r']} alpha={cfg['lora_alpha']}")

    model = PeftModel.from_pretrained(Stack(base), peft_dir)
    for i in range(n):
        la = model.base_model.model.layers[i].lora_A["default"].weight.detach().numpy()
        lb = model.base_model.model.layers[i].lora_B["default"].weight.detach().numpy()
        check(f"layers.{i} adapters loaded by PEFT", np.array_equal(la, A[i]) and np.array_equal(lb, B[i]))
    x = torch.randn(5, base[0].shape[1], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y_peft = model(x).numpy()
    merged_model = model.merge_and_unload()
    kq = load_file(merged_path)
    for i in range(n):
        w_peft = merged_model.layers[i].weight.detach().numpy()
        w_ref = base[i].astype(np.float64) + scale * (B[i].astype(np.float64) @ A[i].astype(np.float64))
        w_kq = kq[f"layers.{i}.weight"].astype(np.float64)
        tol = 1e-5 * np.abs(w_ref).max()
        check(f"layers.{i} merged: kqlora vs PEFT merge_and_unload", np.abs(w_kq - w_peft).max() <= tol,
              f"max |diff| {np.abs(w_kq - w_peft).max():.3e}")
        check(f"layers.{i} merged: kqlora vs float64 W + s*B@A", np.abs(w_kq - w_ref).max() <= tol,
              f"max |diff| {np.abs(w_kq - w_ref).max():.3e}")
    y_merged = x.numpy().astype(np.float64)
    for i in range(n):
        y_merged = y_merged @ kq[f"layers.{i}.weight"].astype(np.float64).T
    rel = np.abs(y_merged - y_peft).max() / np.abs(y_merged).max()
    check("forward: PEFT model vs kqlora merged weights", rel < 1e-5, f"rel {rel:.2e}")
    print("Passed!" if ok else "Failed!")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
