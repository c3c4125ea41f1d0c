#!/usr/bin/env python3
"""Reference training runs in PyTorch with torchao's NF4, for kqlora-train's tests.

    python3 tools/gen_train_reference.py tests/data/train_reference

Needs torch and torchao (pip install torch torchao h5py). Writes, once, to be committed:
  init.h5      the checkpoint schema's /params: NF4 base weights as torchao's own components
               (so both sides use the same bytes), lora_a/lora_b/bias as float32 datasets
  data.h5      inputs and targets [rows, dim]
  cases.txt    one line per case: name and the deck keys (key=value ...)
  <case>.h5    per-step losses (`losses`) and the final trainable parameters (/params)
The model is torchtune's LoRALinear over torchao's linear_nf4 (out = linear_nf4(x, W)
[+ bias] + (alpha/rank) * lora_b(lora_a(x))), activation between layers, one thread.
"""
import math
import os
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)
from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4, to_nf4  # noqa: E402

DIM, LAYERS, RANK, ALPHA, GBS, STEPS = 128, 2, 8, 16.0, 8, 5

# name: deck keys (the same settings drive the PyTorch run below)
CASES = {
    "sum_adam": dict(loss="sum", optimizer="adam", lr=1e-3),
    "sum_sgd_relu": dict(loss="sum", optimizer="sgd", lr=1e-4, momentum=0.9, activation="relu"),
    "mse_adamw_gelu": dict(loss="mse", optimizer="adamw", lr=1e-2, activation="gelu"),
    "mse_sgd": dict(loss="mse", optimizer="sgd", lr=0.05),
    "mse_adam_silu_bias": dict(loss="mse", optimizer="adam", lr=1e-2, activation="silu", bias="true"),
    "sum_adamw_bias_wd": dict(loss="sum", optimizer="adamw", lr=1e-3, bias="true", weight_decay=0.1),
    "mse_adam_gelu_cosine_clip": dict(loss="mse", optimizer="adam", lr=2e-2, activation="gelu",
                                      lr_schedule="cosine", warmup_steps=2, grad_clip=0.05),
    "mse_sgd_microbatch": dict(loss="mse", optimizer="sgd", lr=0.05, momentum=0.5, micro_bs=3),
    # bfloat16: NF4 of the bfloat16-rounded weights (init_float.h5 holds them unquantized),
    # activations and gradients in bfloat16, float32 master weights and optimizer state.
    "sum_adam_bf16": dict(loss="sum", optimizer="adam", lr=1e-3, dtype="bfloat16"),
    "mse_adamw_gelu_bf16": dict(loss="mse", optimizer="adamw", lr=1e-2, activation="gelu",
                                dtype="bfloat16"),
}


def write_dataset(group, name, array):
    array = np.ascontiguousarray(array)
    group.create_dataset(name, data=array, chunks=array.shape if array.ndim else None,
                         fletcher32=True)


def make_init(folder, gen):
    params = {}
    with h5py.File(os.path.join(folder, "init.h5"), "w") as f, \
            h5py.File(os.path.join(folder, "init_float.h5"), "w") as ff:
        g = f.create_group("params")
        gf = ff.create_group("params")
        for l in range(LAYERS):
            w = torch.randn(DIM, DIM, generator=gen) / math.sqrt(DIM)  # well-conditioned stack
            write_dataset(gf, f"layers.{l}.weight", w.numpy())
            params[f"layers.{l}.weight.bf16"] = to_nf4(w.to(torch.bfloat16))
            nf4 = to_nf4(w)
            grp = g.create_group(f"layers.{l}.weight")
            write_dataset(grp, "quantized_data", nf4.quantized_data.numpy())
            write_dataset(grp, "quantized_scalers", nf4.quantized_scalers.numpy())
            write_dataset(grp, "quantization_factor", nf4.quantization_factor.numpy())
            write_dataset(grp, "scaler_mean", nf4.scaler_mean.reshape(1).numpy())
            grp.attrs["shape"] = np.array([DIM, DIM], dtype=np.int64)
            grp.attrs["dtype"] = "float32"
            grp.attrs["block_size"] = np.int64(64)
            grp.attrs["scaler_block_size"] = np.int64(256)
            params[f"layers.{l}.weight"] = nf4
            a = torch.empty(RANK, DIM)
            b = torch.empty(DIM, RANK)
            torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=gen)
            torch.nn.init.kaiming_uniform_(b, a=math.sqrt(5), generator=gen)
            bias = (torch.rand(DIM, generator=gen) * 2 - 1) / math.sqrt(DIM)
            for name, t in ((f"layers.{l}.lora_a.weight", a), (f"layers.{l}.lora_b.weight", b),
                            (f"layers.{l}.bias", bias)):
                write_dataset(g, name, t.numpy())
                write_dataset(gf, name, t.numpy())
                params[name] = t
    return params


def act(name, x):
    return {"none": lambda v: v, "relu": F.relu, "gelu": F.gelu, "silu": F.silu}[name](x)


def cosine_lambda(warmup, total):
    def f(step):
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))
    return f


def run_case(keys, init, inputs, targets):
    bias_on = keys.get("bias") == "true"
    names, tensors = [], []
    for l in range(LAYERS):
        for n in ("lora_a.weight", "lora_b.weight") + (("bias",) if bias_on else ()):
            names.append(f"layers.{l}.{n}")
            tensors.append(init[f"layers.{l}.{n}"].clone().requires_grad_(True))
    p = dict(zip(names, tensors))
    opt_name, lr = keys["optimizer"], keys["lr"]
    if opt_name == "sgd":
        opt = torch.optim.SGD(tensors, lr=lr, momentum=keys.get("momentum", 0.0))
    elif opt_name == "adam":
        opt = torch.optim.Adam(tensors, lr=lr, weight_decay=keys.get("weight_decay", 0.0))
    else:
        opt = torch.optim.AdamW(tensors, lr=lr, weight_decay=keys.get("weight_decay", 0.01))
    sched = None
    if keys.get("lr_schedule") == "cosine":
        sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_lambda(keys["warmup_steps"], STEPS))
    bf16 = keys.get("dtype") == "bfloat16"
    cast = (lambda v: v.to(torch.bfloat16)) if bf16 else (lambda v: v)
    losses = []
    for step in range(STEPS):
        x = cast(inputs[step * GBS:(step + 1) * GBS])
        t = targets[step * GBS:(step + 1) * GBS]
        for l in range(LAYERS):
            out = linear_nf4(x, init[f"layers.{l}.weight" + (".bf16" if bf16 else "")])
            if bias_on:
                out = out + cast(p[f"layers.{l}.bias"])
            lora = (ALPHA / RANK) * F.linear(F.linear(x, cast(p[f"layers.{l}.lora_a.weight"])),
                                             cast(p[f"layers.{l}.lora_b.weight"]))
            y = out + lora
            x = act(keys.get("activation", "none"), y) if l + 1 < LAYERS else y
        x = x.float()
        loss = x.sum() if keys["loss"] == "sum" else F.mse_loss(x, t)
        opt.zero_grad()
        loss.backward()
        if keys.get("grad_clip"):
            torch.nn.utils.clip_grad_norm_(tensors, keys["grad_clip"])
        opt.step()
        if sched:
            sched.step()
        losses.append(loss.item())
    return losses, {n: t.detach() for n, t in p.items()}


def main(folder):
    os.makedirs(folder, exist_ok=True)
    gen = torch.Generator().manual_seed(1130)
    init = make_init(folder, gen)
    rows = GBS * STEPS
    inputs = torch.randn(rows, DIM, generator=gen)
    targets = torch.randn(rows, DIM, generator=gen)
    with h5py.File(os.path.join(folder, "data.h5"), "w") as f:
        write_dataset(f, "inputs", inputs.numpy())
        write_dataset(f, "targets", targets.numpy())
    lines = [f"# torch {torch.__version__}; common: dim={DIM} num_linears={LAYERS} lora_rank={RANK} "
             f"lora_alpha={ALPHA:g} global_bs={GBS} num_steps={STEPS}"]
    for name, keys in CASES.items():
        losses, params = run_case(keys, init, inputs, targets)
        with h5py.File(os.path.join(folder, name + ".h5"), "w") as f:
            write_dataset(f, "losses", np.array(losses, dtype=np.float64))
            g = f.create_group("params")
            for n, t in params.items():
                write_dataset(g, n, t.numpy())
        lines.append(name + " " + " ".join(f"{k}={v}" for k, v in keys.items()))
        print(name, " ".join(f"{v:.6g}" for v in losses))
    with open(os.path.join(folder, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/train_reference")
