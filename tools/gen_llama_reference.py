#!/usr/bin/env python3
"""Reference numbers for kqlora's Llama model from transformers + PEFT + torchao (CPU).

    python3 tools/gen_llama_reference.py tests/data/llama_reference

Needs torch, torchao, transformers, peft, safetensors, h5py (pip). Run once; the outputs
are committed (well under a megabyte per case). For each case (a small random-initialised
Llama configuration) it writes into <out>/<case>/:
  config.json, model.safetensors   the model as save_pretrained writes it (float32)
  init.h5                          the checkpoint schema's /params: every projection as
                                   torchao's own NF4 components (so both sides use the same
                                   bytes: kqlora's scaler_mean may differ from torchao's in
                                   the last bit, docs/NF4.md) and the LoRA adapters A and B
                                   (both non-zero) as float32 datasets, kqlora names
  init_adapters.h5                 ("bf16" cases) the adapters alone
  data.h5                          input_ids, labels int32 [N, S] (prompt tokens and right
                                   padding labelled -100), attribute vocab_size
  reference.h5                     logits [N, S, V], valid [N, S] (1: not padding), loss,
                                   /grads/<name> of every LoRA tensor, and a 5-step AdamW run
                                   over the whole batch: losses [5], /final/<name>;
                                   with "bf16": losses_bf16 [5] of the same run in bfloat16
                                   (float32 master adapters, bfloat16 model and NF4)
Every base projection's weight is replaced by torchao's NF4 dequantization of it
(block_size 32, scaler_block_size 32: sizes torchao's to_nf4 accepts), so both sides
compute with the same weights. The bfloat16 run's kqlora side quantizes model.safetensors
itself.
"""
import json
import math
import os
import sys

import h5py
import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

torch.set_num_threads(1)

BLOCK, SCALER_BLOCK, RANK, ALPHA = 32, 32, 4, 8.0
N, S, STEPS, LR = 3, 12, 5, 1e-2
PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MODULE = {p: ("self_attn." if p in PROJ[:4] else "mlp.") + p for p in PROJ}

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
            initializer_range=0.08, max_position_embeddings=64)
CASES = {
    # grouped-query attention (2 kv heads for 4 query heads), untied head, all seven targets
    "gqa": dict(arch=dict(BASE), targets=PROJ, bf16=True),
    # tied embeddings, head_dim 24 != hidden / heads, a non-default rope_theta
    "tied_head_dim": dict(arch=dict(BASE, vocab_size=80, head_dim=24, tie_word_embeddings=True,
                                    rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
                          targets=PROJ),
    # Llama 3.1's rope scaling, multi-head attention, adapters on q and v only
    "llama3_qv": dict(arch=dict(BASE, num_key_value_heads=4,
                                rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0,
                                                 "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 16}),
                      targets=["q_proj", "v_proj"]),
    # Mistral-style: model_type mistral, a sliding window longer than the sequences
    "mistral": dict(arch=dict(BASE, sliding_window=32), targets=PROJ, mistral=True),
}


def kq_name(peft_name):
    """base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight ->
    model.layers.0.self_attn.q_proj.lora_a.weight"""
    n = peft_name.replace("base_model.model.", "", 1).replace(".default", "")
    return n.replace("lora_A", "lora_a").replace("lora_B", "lora_b")


def make_data(gen, vocab):
    ids = torch.randint(1, vocab, (N, S), generator=gen)
    labels = ids.clone()
    valid = torch.ones(N, S, dtype=torch.int32)
    labels[1, :3] = -100          # a prompt
    ids[1, S - 4:] = 0            # right padding (pad id 0)
    labels[1, S - 4:] = -100
    valid[1, S - 4:] = 0
    ids[2, S - 2:] = 0
    labels[2, S - 2:] = -100
    valid[2, S - 2:] = 0
    return ids, labels, valid


def build(case, gen):
    cfg_cls, model_cls = (MistralConfig, MistralForCausalLM) if case.get("mistral") else \
        (LlamaConfig, LlamaForCausalLM)
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    model = model_cls(cfg_cls(**case["arch"])).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # not all ones: the norms' weights are used
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
    return model


def replace_with_nf4(model, dtype):
    """Every base projection's weight becomes torchao's NF4 dequantization of it; returns
    the NF4 tensors by parameter name."""
    nf4 = {}
    with torch.no_grad():
        for name, mod in model.named_modules():
            if name.split(".")[-1] in PROJ and isinstance(mod, torch.nn.Linear):
                t = to_nf4(mod.weight.detach().to(dtype), BLOCK, SCALER_BLOCK)
                mod.weight.copy_(t.get_original_weight().to(mod.weight.dtype))
                nf4[name + ".weight"] = t
    return nf4


def write_init(path, nf4, params):
    def dataset(group, name, array):
        array = np.ascontiguousarray(array)
        group.create_dataset(name, data=array, chunks=array.shape, fletcher32=True)
    with h5py.File(path, "w") as f:
        g = f.create_group("params")
        for name, t in nf4.items():
            grp = g.create_group(name)
            dataset(grp, "quantized_data", t.quantized_data.numpy())
            dataset(grp, "quantized_scalers", t.quantized_scalers.numpy())
            dataset(grp, "quantization_factor", t.quantization_factor.numpy())
            dataset(grp, "scaler_mean", t.scaler_mean.reshape(1).numpy())
            grp.attrs["shape"] = np.array(list(t.shape), dtype=np.int64)
            grp.attrs["dtype"] = "float32"
            grp.attrs["block_size"] = np.int64(BLOCK)
            grp.attrs["scaler_block_size"] = np.int64(SCALER_BLOCK)
        for name, p in params.items():
            dataset(g, name, p.detach().numpy())


def lora_params(peft_model):
    return {kq_name(n): p for n, p in peft_model.named_parameters() if "lora_" in n}


def run_steps(peft_model, params, ids, labels, dtype):
    """5 AdamW steps over the whole batch on float32 master copies of the adapters."""
    masters = {n: p.detach().float().clone().requires_grad_(True) for n, p in params.items()}
    opt = torch.optim.AdamW(list(masters.values()), lr=LR)
    losses = []
    for _ in range(STEPS):
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(masters[n].to(dtype))
        peft_model.zero_grad()
        loss = peft_model(input_ids=ids, labels=labels).loss
        loss.backward()
        losses.append(loss.item())
        for n, p in params.items():
            masters[n].grad = p.grad.detach().float().clone()
        opt.step()
    return losses, {n: m.detach() for n, m in masters.items()}


def main(out):
    gen = torch.Generator().manual_seed(20261201)
    for name, case in CASES.items():
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        model = build(case, gen)
        model.save_pretrained(folder, safe_serialization=True)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(folder, extra)):
                os.remove(os.path.join(folder, extra))
        state = {k: v.clone() for k, v in model.state_dict().items()}
        nf4 = replace_with_nf4(model, torch.float32)
        peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                      target_modules=case["targets"]))
        params = lora_params(peft_model)
        with torch.no_grad():  # both A and B non-zero, so every gradient is
            for n, p in params.items():
                torch.nn.init.kaiming_uniform_(p, a=math.sqrt(5), generator=gen)
                if ".lora_b." in n:
                    p.mul_(0.5)
        write_init(os.path.join(folder, "init.h5"), nf4, params)
        if case.get("bf16"):  # the adapters alone: kqlora quantizes the bfloat16 weights
            write_init(os.path.join(folder, "init_adapters.h5"), {}, params)
        ids, labels, valid = make_data(gen, case["arch"]["vocab_size"])
        with h5py.File(os.path.join(folder, "data.h5"), "w") as f:
            f.create_dataset("input_ids", data=ids.numpy().astype(np.int32))
            f.create_dataset("labels", data=labels.numpy().astype(np.int32))
            f.attrs["vocab_size"] = np.int64(case["arch"]["vocab_size"])

        out_ = peft_model(input_ids=ids, labels=labels)
        out_.loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in params.items()}
        init = {n: p.detach().clone() for n, p in params.items()}
        losses, final = run_steps(peft_model, params, ids, labels, torch.float32)
        with h5py.File(os.path.join(folder, "reference.h5"), "w") as f:
            f.create_dataset("logits", data=out_.logits.detach().numpy())
            f.create_dataset("valid", data=valid.numpy())
            f.create_dataset("loss", data=np.array([out_.loss.item()]))
            f.create_dataset("losses", data=np.array(losses))
            for n, g in grads.items():
                f.create_dataset("grads/" + n, data=g.numpy())
            for n, v in final.items():
                f.create_dataset("final/" + n, data=v.numpy())
            if case.get("bf16"):
                # The same run in bfloat16: the model from the float32 file rounded to
                # bfloat16, NF4 of the bfloat16 weights, the adapters' masters float32.
                model16 = build_from(folder, case).to(torch.bfloat16).eval()
                replace_with_nf4(model16, torch.bfloat16)
                peft16 = get_peft_model(model16, LoraConfig(r=RANK, lora_alpha=ALPHA,
                                                            lora_dropout=0.0,
                                                            target_modules=case["targets"]))
                params16 = lora_params(peft16)
                with torch.no_grad():
                    for n, p in params16.items():
                        p.copy_(init[n].to(torch.bfloat16))
                losses16, _ = run_steps(peft16, params16, ids, labels, torch.bfloat16)
                f.create_dataset("losses_bf16", data=np.array(losses16))
        del state
        print(name, "loss", out_.loss.item(), "losses", ["%.6f" % x for x in losses])


def build_from(folder, case):
    model_cls = MistralForCausalLM if case.get("mistral") else LlamaForCausalLM
    return model_cls.from_pretrained(folder, torch_dtype=torch.float32)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/llama_reference")
