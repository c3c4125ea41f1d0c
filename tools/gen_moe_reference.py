#!/usr/bin/env python3
"""Reference numbers for kqlora's sparse (mixture-of-experts) decoders from transformers +
PEFT + torchao (CPU), in tools/gen_llama_reference.py's format (docs/MODELS.md, "Experts").

    python3 tools/gen_moe_reference.py                     # every case
    python3 tools/gen_moe_reference.py --cases qwen3_moe   # some
    python3 tools/gen_moe_reference.py --out /tmp/ref

Needs torch, torchao, transformers (5.x), peft, safetensors, h5py (pip). Run once; the
outputs are committed under tests/data/family_reference/<case>, read by tests/test_llama.cpp
as the dense families' cases are. Each case is a small random Qwen3-MoE whose layers mix
sparse MLPs (num_experts experts, num_experts_per_tok per token) and a dense one
(mlp_only_layers), attention as Qwen3's:

  config.json, model.safetensors  the float32 model, its experts in the hub's per-expert
                                  layout (model.layers.<l>.mlp.experts.<j>.gate_proj.weight,
                                  up_proj, down_proj; the router model.layers.<l>.mlp.gate.
                                  weight), which kqlora reads
  init.h5, init_adapters.h5,      as gen_llama_reference.py writes them: every projection
  data.h5, reference.h5, case.txt and every expert matrix as torchao's NF4 (gate and up
                                  apart), the adapters (PEFT on the attention and the dense
                                  MLP's Linear modules: its experts are parameters, not
                                  modules), the data, the reference logits, loss, gradients,
                                  5 AdamW steps, and with "bf16" the bfloat16 run's losses

Both sides compute with torchao's NF4 dequantization of every expert and projection; the
router stays float (it is in kqlora too). The router's weights are drawn until no token of
any layer has a near-tie between its k-th and (k+1)-th experts (logit gap < 1e-3), without
and with the adapters (a draw whose adapters bring one is made again from the seed plus
1000), so a last-bit difference between the two sides' logits cannot change a routing.

gpt-oss (the gpt_oss case) differs: its model.safetensors holds the experts as the hub's
gpt-oss checkpoints do, MXFP4 (model.layers.<l>.mlp.experts.gate_up_proj_blocks uint8
[E, 2I, H/32, 16] and gate_up_proj_scales uint8 [E, 2I, H/32] -- rows in transformers'
gate_up_proj column order, gate and up interleaved --, gate_up_proj_bias float32 [E, 2I],
down_proj_blocks [E, H, I/32, 16], down_proj_scales [E, H, I/32], down_proj_bias [E, H];
per block of 32 inputs an E8M0 scale byte and 32 FP4 e2m1 values, two to a byte, the even
element in the low nibble) and its config.json the real checkpoints' quantization_config
(mxfp4, modules_to_not_convert); everything else float32 under transformers' names (the
router model.layers.<l>.mlp.router.weight and .bias, the attention sinks self_attn.sinks).
Both sides start from the MXFP4 decoding (transformers' convert_moe_packed_tensors) and
quantize each expert's gate, up and down (kqlora's [out, in] matrices: gate_proj = column
0::2 of transformers' gate_up_proj [H, 2I], transposed; up_proj = 1::2; down_proj =
down_proj [I, H] transposed) with torchao's NF4 as above, named model.layers.<l>.mlp.experts.
<j>.gate_proj.weight etc. in init.h5. Its expert adapters: PEFT's lora_B of gate_up has its
rows in gate_up's interleaved order; kqlora's [E * 2I, r] has expert e's I gate rows, then
its I up rows. Its SwiGLU clamps' inputs are kept off the bounds as clip_qkv's are (none
within 1e-4 of swiglu_limit, else the case is drawn again). The bfloat16 run rounds the
RMSNorms' weights as everything else, as transformers 5.25's bfloat16 load does (gpt-oss's
_keep_in_fp32_modules holds for float16 loads only); GptOssRMSNorm multiplies in float32.
"""
import argparse
import copy
import json
import math
import os
import sys

import h5py
import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
import peft.utils.transformers_weight_conversion as peft_conversion  # noqa: E402
from transformers import (GptOssConfig, GptOssForCausalLM, MixtralConfig, MixtralForCausalLM,
                          OlmoeConfig, OlmoeForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM,
                          Gemma4ForCausalLM, Gemma4TextConfig,
                          Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM)
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_llama_reference as ref  # noqa: E402

from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4  # noqa: E402

torch.set_num_threads(1)

# gpt-oss's experts: gate_up (weights and biases) 8 times the others' 0.08 and 0.1, so that
# the clamp inputs spread out (with 0.08, about a tenth of the 100k gate and up values of a
# draw clamped, every draw had one within CLIP_GAP of a bound), down 1/8 of 0.08 (the
# experts' outputs of rms about 1); the limit clamps about 6% of the gate values, 14% of up
GPT_OSS_STD = {"gate_up_proj": 0.64, "gate_up_proj_bias": 0.8, "down_proj": 0.01,
               "down_proj_bias": 0.1}
GPT_OSS_LIMIT = 10.0
MOE = dict(ref.FAM, head_dim=16, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
           moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[1])
CASES = {
    # renormalised top-2 of 8 experts, layers 0 and 2 sparse, layer 1 dense; GQA, q/k norms;
    # also a bfloat16 run
    "qwen3_moe": dict(seed=1101, bf16=True, arch=dict(MOE, norm_topk_prob=True)),
    # the raw top-3 softmax weights (norm_topk_prob false), every layer sparse, biases on
    # q, k, v and o
    "qwen3_moe_raw": dict(seed=1102, arch=dict(MOE, num_hidden_layers=2, mlp_only_layers=[],
                                               num_experts_per_tok=3, norm_topk_prob=False,
                                               attention_bias=True)),
    # adapters on the experts too (PEFT's target_parameters on the fused gate_up_proj and
    # down_proj), as on attention; top 2 of 8 renormalised, a dense layer between
    # (AdamW's eps 1e-3 on both sides: eps 1e-8 turns last-bit differences of near-zero
    # expert-adapter gradients into steps of up to lr, and the grouped and per-expert
    # products sum in different orders)
    "qwen3_moe_experts": dict(seed=1103, experts=True, bf16=True, eps=1e-3,
                              arch=dict(MOE, norm_topk_prob=True)),
    # Mixtral: its hub names (block_sparse_moe, w1 / w3 / w2), top 2 of 4 always
    # renormalised, experts of intermediate_size, a sliding window of 37 on every layer,
    # adapters on attention and the experts
    # the load-balancing loss (output_router_logits, a coefficient of 0.05 so that it moves
    # the gradients), computed as transformers does with an attention mask over the real
    # tokens; top 2 of 8 renormalised, a dense layer between, expert adapters
    # (AdamW's eps 1e-3 on both sides: the aux loss leaves some experts' adapters with
    # gradients near zero, whose last bits eps 1e-8 would turn into steps of up to lr)
    "qwen3_moe_aux": dict(seed=1104, experts=True, bf16=True, eps=1e-3,
                          arch=dict(MOE, norm_topk_prob=True, output_router_logits=True,
                                    router_aux_loss_coef=0.05)),
    "mixtral": dict(seed=1201, family="mixtral", experts=True, bf16=True,
                    arch=dict(ref.FAM, intermediate_size=32, num_local_experts=4,
                              num_experts_per_tok=2, sliding_window=ref.WINDOW)),
    # OLMoE: q and k RMSNorms over the whole projections, q, k and v clamped at clip_qkv
    # (1.5: about a tenth of q and k and a few v clamped), the raw top 2 of 8 (norm_topk_prob
    # false, as OLMoE-1B-7B), biases on q, k, v and o, adapters on attention and the experts
    "olmoe": dict(seed=1301, family="olmoe", experts=True, bf16=True,
                  arch=dict(ref.FAM, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                            clip_qkv=1.5, attention_bias=True, eos_token_id=2,
                            pad_token_id=1)),
    # Qwen2-MoE: a shared expert (48 wide, the dense layer's MLP 64) gated by
    # sigmoid(shared_expert_gate(x)) beside the raw top 2 of 8, layer 1 dense, biases on q,
    # k, v; adapters on attention, the shared expert's and dense layer's gate/up/down and
    # the experts (PEFT's v4-to-v5 target conversion, which would move gate_proj / up_proj /
    # down_proj onto the experts, is turned off here: PEFT's LoRA on those Linear modules)
    "qwen2_moe": dict(seed=1401, family="qwen2_moe", experts=True, bf16=True, eps=1e-3,
                      targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                               "down_proj"],
                      arch=dict(ref.FAM, num_hidden_layers=3, num_experts=8,
                                num_experts_per_tok=2, moe_intermediate_size=32,
                                shared_expert_intermediate_size=48, decoder_sparse_step=1,
                                mlp_only_layers=[1], norm_topk_prob=False)),
    # Qwen3.5-MoE's text decoder: Gated DeltaNet layers 0 and 2 and gated full attention on
    # 1 and 3 as the qwen3_5_text case, every layer sparse (top 2 of 8 always renormalised)
    # beside a shared expert (48 wide) gated by sigmoid(shared_expert_gate(x)); adapters on
    # attention, the Gated DeltaNet's projections, the shared expert and the experts (AdamW
    # eps 1e-2 as qwen3_5_text)
    "qwen3_5_moe": dict(seed=1601, family="qwen3_5_moe_text", experts=True, bf16=True, eps=1e-2,
                        targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                 "down_proj", "in_proj_qkv", "in_proj_z", "in_proj_b",
                                 "in_proj_a", "out_proj"],
                        arch=dict(ref.FAMILY_CASES["qwen3_5_text"]["arch"], num_experts=8,
                                  num_experts_per_tok=2, moe_intermediate_size=32,
                                  shared_expert_intermediate_size=48)),
    # Qwen3-Next: the same hybrid layers with the fused in_proj_qkvz and in_proj_ba (columns
    # per key head group: 4 key heads, each read by 4 of the 16 value heads), layers 1 and 3
    # sparse (the raw top 2 of 8: norm_topk_prob false) beside a shared expert, 0 and 2 a
    # dense MLP of 64; adapters as qwen3_5_moe's
    "qwen3_next": dict(seed=1701, family="qwen3_next", experts=True, eps=1e-2,
                       targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                "down_proj", "in_proj_qkvz", "in_proj_ba", "out_proj"],
                       arch=dict(ref.FAMILY_CASES["qwen3_5_text"]["arch"], num_experts=8,
                                 num_experts_per_tok=2, moe_intermediate_size=32,
                                 shared_expert_intermediate_size=48, decoder_sparse_step=2,
                                 norm_topk_prob=False)),
    # Gemma 4's MoE block (26B-A4B): on every layer the dense MLP (64) beside 8 experts of
    # 32 (top 2, renormalised, times per_expert_scale), each branch with its own norms; the
    # router reading unitnorm(x) * router.scale * hidden^-1/2; sliding and full layers as
    # the gemma4_text case (k = v, per-layer heads, proportional rope, layer_scalar);
    # adapters on attention, the dense MLP and the experts
    # (AdamW eps 1e-2: at 1e-3 a build at -O1 (the sanitizers') put a 5-step adapter 2% past
    # the 1e-4 tolerance: the experts' last-bit differences through eps)
    "gemma4_moe": dict(seed=1801, family="gemma4_text", experts=True, bf16=True, eps=1e-2,
                       targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                "down_proj"],
                       arch=dict(ref.FAM, num_hidden_layers=2, head_dim=16, global_head_dim=32,
                                 num_global_key_value_heads=1, attention_k_eq_v=True,
                                 hidden_size_per_layer_input=0, sliding_window=ref.WINDOW,
                                 final_logit_softcapping=5.0, enable_moe_block=True,
                                 num_experts=8, top_k_experts=2, moe_intermediate_size=32,
                                 layer_types=["sliding_attention", "full_attention"])),
    # gpt-oss: the experts MXFP4 in model.safetensors (per-row magnitudes, so the blocks'
    # scale bytes differ), biases on them, gate and up interleaved in gate_up_proj, the
    # clamped SwiGLU (swiglu_limit GPT_OSS_LIMIT: 6% of the gate values and 14% of the up
    # values clamped), routers with a bias (softmax of the top-2 logits), attention sinks,
    # biases on q, k, v and o, layers sliding (37) then full, YaRN (factor 4 over 256
    # original positions: of the 8 frequencies one extrapolated, three between, four
    # interpolated; truncate false, attention scaling 1 + 0.1 ln 4); the load-balancing
    # loss (coefficient 0.05, AdamW eps 1e-3 as qwen3_moe_aux), adapters on attention and
    # the experts; also a bfloat16 run (the RMSNorms float32), compared within 1.5%: its
    # clamps make bfloat16 runs stray (PyTorch's own bfloat16 losses are up to 0.9% from
    # its float32 ones over the 5 steps; kqlora's, with AVX512_BF16 products on an AMD Zen
    # 4, 1.04% from PyTorch's bfloat16 ones at step 5 and 0.53% from its float32 ones)
    "gpt_oss": dict(seed=1501, family="gpt_oss", experts=True, bf16=True, eps=1e-3,
                    bf16_rtol=0.015,
                    arch=dict(ref.FAM, head_dim=16, intermediate_size=32, num_local_experts=8,
                              num_experts_per_tok=2, max_position_embeddings=1024,
                              layer_types=["sliding_attention", "full_attention"],
                              sliding_window=ref.WINDOW, attention_bias=True,
                              tie_word_embeddings=False, rms_norm_eps=1e-5,
                              swiglu_alpha=1.702, swiglu_limit=GPT_OSS_LIMIT,
                              rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                               "factor": 4.0, "beta_fast": 32.0,
                                               "beta_slow": 1.0,
                                               "original_max_position_embeddings": 256,
                                               "truncate": False},
                              output_router_logits=True, router_aux_loss_coef=0.05)),
}
# model_type -> (config class, model class, the hub's names: experts module, router module,
# gate / up / down names)
FAMILIES = {
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM,
                  ("mlp.experts", "mlp.gate", "gate_proj", "up_proj", "down_proj")),
    "mixtral": (MixtralConfig, MixtralForCausalLM,
                ("block_sparse_moe.experts", "block_sparse_moe.gate", "w1", "w3", "w2")),
    "olmoe": (OlmoeConfig, OlmoeForCausalLM,
              ("mlp.experts", "mlp.gate", "gate_proj", "up_proj", "down_proj")),
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM,
                  ("mlp.experts", "mlp.gate", "gate_proj", "up_proj", "down_proj")),
    "qwen3_5_moe_text": (Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM,
                         ("mlp.experts", "mlp.gate", "gate_proj", "up_proj", "down_proj")),
    "qwen3_next": (Qwen3NextConfig, Qwen3NextForCausalLM,
                   ("mlp.experts", "mlp.gate", "gate_proj", "up_proj", "down_proj")),
    # (Gemma 4: the experts and the router under the layer, not mlp.)
    "gemma4_text": (Gemma4TextConfig, Gemma4ForCausalLM,
                    ("experts", "router.proj", "gate_proj", "up_proj", "down_proj")),
    # (the experts' names are kqlora's own for the NF4 in init.h5: the hub file has MXFP4)
    "gpt_oss": (GptOssConfig, GptOssForCausalLM,
                ("mlp.experts", "mlp.router", "gate_proj", "up_proj", "down_proj")),
}
EXPERT_PARAMS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
# The base projections stored as NF4 (the Gated DeltaNet layers' besides attention's and
# the dense MLP's / shared expert's)
NF4_PROJ = {"qwen3_5_moe_text": ref.QWEN3_5_PROJ,
            "qwen3_next": ref.PROJ + ["in_proj_qkvz", "in_proj_ba", "out_proj"]}
# Zero-centred RMSNorms ((1 + w) n): drawn as 0.2 randn (the others 1 + 0.2 randn)
ZERO_CENTRED = ("Qwen3_5MoeRMSNorm", "Qwen3NextRMSNorm")
ROUTER_STD, TIE_GAP, CLIP_GAP = 0.3, 1e-3, 1e-4
# The attention projections: naming gate_proj, up_proj or down_proj (even by a regex that
# matches the dense layer's modules only), PEFT 0.21 puts adapters on the experts' fused
# parameters of transformers 5 instead (its v4-to-v5 MoE mapping), which kqlora's expert
# adapters will follow (issue 50, next); these cases adapt the attention.
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def experts_modules(model):
    return [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("Experts")]


def routers(model):
    """(name, module) of each router whose .weight is [E, hidden] (Gemma 4's: its proj)."""
    out = []
    for n, m in model.named_modules():
        if type(m).__name__.endswith("TopKRouter"):
            out.append((n, m))
        elif type(m).__name__ == "Gemma4TextRouter":
            out.append((n + ".proj", m.proj))
    return out


def router_std(model):
    """ROUTER_STD, or 8 times it for Gemma 4's router, whose input is scaled by
    hidden^-1/2 (1/8 here): logits of the same spread."""
    return ROUTER_STD * (8.0 if gemma4_routers(model) else 1.0)


def gemma4_routers(model):
    return [(n, m) for n, m in model.named_modules() if type(m).__name__ == "Gemma4TextRouter"]


def randomise(model, gen):
    """Biases 0.1 randn, norms 1 + 0.2 randn, experts 0.08 randn, routers ROUTER_STD randn;
    gpt-oss: its experts GPT_OSS_STD randn, each row (an output) scaled by a factor in
    [0.3, 3] (log-uniform), their biases GPT_OSS_STD randn, the routers' biases 0.3 randn,
    the attention sinks 0.5 randn; checks every parameter was drawn."""
    done = set()
    with torch.no_grad():
        for mname, mod in model.named_modules():
            pre = mname + "." if mname else ""
            if isinstance(mod, torch.nn.Linear):
                done.add(pre + "weight")
                if mod.bias is not None:
                    mod.bias.copy_(0.1 * torch.randn(mod.bias.shape, generator=gen))
                    done.add(pre + "bias")
            elif isinstance(mod, torch.nn.Embedding):
                done.add(pre + "weight")
                if mod.padding_idx is not None and "Gemma4" in type(mod).__name__:
                    # (Gemma 4's pad row starts at zero: a router
                    # over it would see exact ties; the data's padding is that id)
                    mod.weight[mod.padding_idx].copy_(
                        0.08 * torch.randn(mod.weight.shape[1], generator=gen))
            elif isinstance(mod, torch.nn.Conv1d):  # (Gated DeltaNet's, as gen_llama_reference)
                mod.weight.copy_(0.3 * torch.randn(mod.weight.shape, generator=gen))
                done.add(pre + "weight")
            elif type(mod).__name__.endswith("GatedDeltaNet"):  # (as gen_llama_reference)
                a = 0.005 + 0.295 * torch.rand(mod.A_log.shape, generator=gen)
                mod.A_log.copy_(a.log())
                mod.dt_bias.copy_(0.5 * torch.randn(mod.dt_bias.shape, generator=gen))
                done.update({pre + "A_log", pre + "dt_bias"})
            elif "RMSNorm" in type(mod).__name__ and hasattr(mod, "weight"):  # (Gemma 4's v
                # norm and router norm have none)
                zero = type(mod).__name__ in ZERO_CENTRED
                mod.weight.copy_((0 if zero else 1) + 0.2 * torch.randn(mod.weight.shape,
                                                                          generator=gen))
                done.add(pre + "weight")
        for name, mod in experts_modules(model):
            for p in ("gate_up_proj", "down_proj"):
                w = getattr(mod, p)
                if getattr(mod, "is_transposed", False):  # gpt-oss: [E, in, out]
                    rows = 0.3 * 10 ** torch.rand(w.shape[0], 1, w.shape[2], generator=gen)
                    w.copy_(GPT_OSS_STD[p] * torch.randn(w.shape, generator=gen) * rows)
                else:
                    w.copy_(0.08 * torch.randn(w.shape, generator=gen))
                done.add(name + "." + p)
                if getattr(mod, "has_bias", False):
                    b = getattr(mod, p + "_bias")
                    b.copy_(GPT_OSS_STD[p + "_bias"] * torch.randn(b.shape, generator=gen))
                    done.add(name + "." + p + "_bias")
        for name, mod in routers(model):
            mod.weight.copy_(router_std(model) * torch.randn(mod.weight.shape, generator=gen))
            done.add(name + ".weight")
            if isinstance(getattr(mod, "bias", None), torch.nn.Parameter):  # gpt-oss
                mod.bias.copy_(0.3 * torch.randn(mod.bias.shape, generator=gen))
                done.add(name + ".bias")
        for name, mod in gemma4_routers(model):  # (its input scale 1 + 0.2 randn, its
            # per-expert scales in [0.5, 1.5])
            mod.scale.copy_(1 + 0.2 * torch.randn(mod.scale.shape, generator=gen))
            mod.per_expert_scale.copy_(0.5 + torch.rand(mod.per_expert_scale.shape, generator=gen))
            done.update({name + ".scale", name + ".per_expert_scale"})
        for name, mod in model.named_modules():
            if hasattr(mod, "layer_scalar"):  # (Gemma 4's, a buffer: in [0.5, 1.5])
                mod.layer_scalar.copy_(0.5 + torch.rand(mod.layer_scalar.shape, generator=gen))
            if isinstance(getattr(mod, "sinks", None), torch.nn.Parameter):  # gpt-oss
                mod.sinks.copy_(0.5 * torch.randn(mod.sinks.shape, generator=gen))
                done.add(name + ".sinks")
    for name, _ in model.named_parameters():
        assert name in done, "parameter not randomised: " + name


def expert_slices(mod):
    """(j, kind, tensor) of each expert's gate, up and down (views of the fused params;
    kind 0, 1, 2), each [out, in]."""
    if getattr(mod, "is_transposed", False):  # gpt-oss: [E, H, 2I] gate/up interleaved, [E, I, H]
        for j in range(mod.num_experts):
            yield j, 0, mod.gate_up_proj[j][:, 0::2].T
            yield j, 1, mod.gate_up_proj[j][:, 1::2].T
            yield j, 2, mod.down_proj[j].T
        return
    inter = mod.intermediate_dim
    for j in range(mod.num_experts):
        yield j, 0, mod.gate_up_proj[j, :inter]
        yield j, 1, mod.gate_up_proj[j, inter:]
        yield j, 2, mod.down_proj[j]


def hub_expert_name(module_name, j, kind, hub):
    """transformers 5's module path model.layers.<l>.mlp.experts -> the hub's name of
    expert j's weight `kind`."""
    layer = module_name[:module_name.rindex("." + hub[0])]
    return "%s.%s.%d.%s.weight" % (layer, hub[0], j, hub[2 + kind])


def replace_experts_with_nf4(model, dtype, hub):
    """Every expert matrix becomes torchao's NF4 dequantization of it (gate and up apart),
    by its hub name."""
    nf4 = {}
    with torch.no_grad():
        for name, mod in experts_modules(model):
            for j, kind, w in expert_slices(mod):
                t = to_nf4(w.detach().to(dtype).contiguous(), ref.BLOCK, ref.SCALER_BLOCK)
                w.copy_(t.get_original_weight().to(w.dtype))
                nf4[hub_expert_name(name, j, kind, hub)] = t
    return nf4


FP4_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def mxfp4_encode(w):
    """w [..., rows, in] (in a multiple of 32) -> (blocks uint8 [..., rows, in / 32, 16],
    scales uint8 [..., rows, in / 32]): per block of 32 inputs the smallest power of two
    2^e with max |w| / 2^e <= 6 (scale byte e + 127, E8M0), each w / 2^e rounded to the
    nearest FP4 e2m1 value (ties to the even code), sign bit 8 (none on a zero), two codes
    a byte, the even element in the low nibble."""
    x = w.detach().double().reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = x.abs().amax(-1)
    e = torch.ceil(torch.log2(amax.clamp_min(2.0 ** -126) / 6.0))
    e = torch.where(amax / torch.exp2(e - 1) <= 6.0, e - 1, e)  # (log2's last bit)
    e = torch.where(amax / torch.exp2(e) > 6.0, e + 1, e).clamp_min(-127)  # (a zero block)
    assert ((amax / torch.exp2(e)) <= 6.0).all() and ((e >= -127) & (e <= 127)).all()
    y = x / torch.exp2(e)[..., None]
    dist = (y.abs()[..., None] - FP4_E2M1).abs()
    code = dist.argmin(-1)  # (the first of a tie: the lower, even when the upper is odd)
    upper = (code + 1).clamp_max(7)
    tie = (dist.gather(-1, upper[..., None])[..., 0] == dist.gather(-1, code[..., None])[..., 0])
    code = torch.where(tie & (code % 2 == 1), upper, code)
    code = code | ((y < 0) & (code > 0)).long() << 3
    blocks = (code[..., 0::2] | code[..., 1::2] << 4).to(torch.uint8)
    return blocks, (e + 127).to(torch.uint8)


def mxfp4_values(blocks, scales):
    """The float64 values of mxfp4_encode's bytes [..., rows, in] (this script's decoder)."""
    lo, hi = (blocks & 15).long(), (blocks >> 4).long()
    code = torch.stack([lo, hi], -1).reshape(*blocks.shape[:-1], 32)
    v = FP4_E2M1[code & 7] * torch.where(code >= 8, -1.0, 1.0)
    v = v * torch.exp2(scales.double() - 127)[..., None]
    return v.reshape(*blocks.shape[:-2], -1)


def to_mxfp4(model):
    """gpt-oss: every experts module's gate_up_proj and down_proj to MXFP4 in the hub's
    layout ([E, out, in] rows: transformers' parameters transposed), the parameters set to
    transformers' own decoding of those bytes (convert_moe_packed_tensors); returns the hub
    tensors by name (blocks, scales and the float32 biases)."""
    hub = {}
    with torch.no_grad():
        for name, mod in experts_modules(model):
            for p in ("gate_up_proj", "down_proj"):
                w = getattr(mod, p)
                blocks, scales = mxfp4_encode(w.transpose(1, 2))
                mine = mxfp4_values(blocks, scales)
                theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
                assert theirs.shape == w.shape
                assert torch.equal(theirs.double(), mine.transpose(1, 2)), "MXFP4 decode"
                again = mxfp4_values(*mxfp4_encode(theirs.transpose(1, 2)))  # (a fixed point)
                assert torch.equal(again, mine), "MXFP4 round trip"
                unit = torch.exp2(scales.double() - 127).repeat_interleave(32, -1)
                assert ((mine - w.transpose(1, 2)).abs() <= unit).all()  # (half the widest step)
                assert len(torch.unique(scales)) > 1, "every MXFP4 block has one scale"
                w.copy_(theirs)
                hub[name + "." + p + "_blocks"] = blocks.contiguous()
                hub[name + "." + p + "_scales"] = scales.contiguous()
                hub[name + "." + p + "_bias"] = getattr(mod, p + "_bias").detach().clone()
    scales = torch.cat([t.flatten() for n, t in hub.items() if n.endswith("_scales")])
    print("MXFP4: %d blocks, scale bytes %d..%d (%d distinct)" % (
        scales.numel(), scales.min(), scales.max(), len(torch.unique(scales))))
    return hub


def hub_state_dict(model, hub, mxfp4=None):
    """The model's tensors in the hub's layout: per-expert weights, the hub's router name;
    or with mxfp4 (gpt-oss) its MXFP4 experts."""
    sd = {}
    fused = {name for name, _ in experts_modules(model)}
    router_names = {n + ".weight" for n, _ in routers(model)}
    tied = getattr(model.config, "tie_word_embeddings", False)
    for name, t in model.state_dict().items():
        if name.rsplit(".", 1)[0] in fused or (tied and name == "lm_head.weight"):
            continue
        if name in router_names:
            name = name.replace(".mlp.gate.", "." + hub[1] + ".")
        sd[name] = t.detach().contiguous()
    if mxfp4 is not None:
        sd.update(mxfp4)
        return sd
    for name, mod in experts_modules(model):
        for j, kind, w in expert_slices(mod):
            sd[hub_expert_name(name, j, kind, hub)] = w.detach().clone().contiguous()
    return sd


def router_gap(model, ids):
    """The smallest logit gap between each token's k-th and (k+1)-th experts, any layer."""
    gaps = []
    k = getattr(model.config, "top_k_experts", None) or model.config.num_experts_per_tok

    def hook(mod, inp, out):
        logits = out[0].detach().float()
        if type(mod).__name__ == "Gemma4TextRouter":  # (its probabilities: their logs)
            logits = logits.log()
        top = torch.topk(logits, k + 1, dim=-1).values
        gaps.append((top[:, k - 1] - top[:, k]).min().item())

    # (Gemma 4's router returns its probabilities first: their gaps are read)
    mods = gemma4_routers(model) or routers(model)
    handles = [m.register_forward_hook(hook) for _, m in mods]
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        for h in handles:
            h.remove()
    return min(gaps)


def clip_stats(model, ids):
    """(the fraction of q, k and v values clamped by clip_qkv, the smallest distance of a
    clamp input to the bound) of a model with clip_qkv, or None."""
    clip = getattr(model.config, "clip_qkv", None)
    if clip is None:
        return None
    values = []
    mods = [m for n, m in model.named_modules()
            if n.endswith(("self_attn.q_norm", "self_attn.k_norm", "self_attn.v_proj"))]
    handles = [m.register_forward_hook(lambda mod, i, o: values.append(o.detach().float().clone()))
               for m in mods]
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        for h in handles:
            h.remove()
    x = torch.cat([v.flatten() for v in values]).abs()
    return (x > clip).float().mean().item(), (x - clip).abs().min().item()


def swiglu_stats(model, ids):
    """(the fraction of gate values above swiglu_limit, of up values outside [-limit,
    limit], the smallest distance of a clamp input to its bound) of a gpt-oss model, or
    None."""
    limit = getattr(model.config, "swiglu_limit", None)
    if limit is None:
        return None
    values, mods = [], [m for _, m in experts_modules(model)]
    for m in mods:
        m._apply_gate = (lambda orig: lambda gu: (values.append(gu.detach().float().clone()),
                                                  orig(gu))[1])(m._apply_gate)
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        for m in mods:
            del m._apply_gate
    gu = torch.cat([v.reshape(-1, v.shape[-1]) for v in values])
    gate, up = gu[:, 0::2].flatten(), gu[:, 1::2].flatten()
    near = min((gate - limit).abs().min().item(), (up.abs() - limit).abs().min().item())
    return (gate > limit).float().mean().item(), (up.abs() > limit).float().mean().item(), near


def kq_expert_adapters(params, arch, hub, interleaved=False, module="mlp.experts"):
    """PEFT's expert adapters in kqlora's names and expert-major layout (causal_lm.cpp):
    A [E * r, in] as PEFT's lora_A; B [E * out, r] from PEFT's lora_B [out, r * E], whose
    column k * E + e is expert e's k-th. Which wrapper is gate_up and which down (PEFT nests
    them: experts.base_layer.lora_* and experts.lora_*) is told by A's in-features.
    interleaved (gpt-oss): gate_up's B rows alternate gate and up (gate_up_proj's columns);
    kqlora's expert e has its I gate rows, then its I up rows."""
    E, H = arch.get("num_experts", arch.get("num_local_experts")), arch["hidden_size"]
    out = {}
    for n, p in params.items():
        if "." + module + "." not in n:  # (module: the experts' path, Gemma 4's "experts")
            out[n] = (n, None)
            continue
        layer = n[:n.index("." + module + ".")]
        a_name = n.replace("lora_b", "lora_a")
        in_features = params[a_name].shape[1]
        which = "gate_up_proj" if in_features == H else "down_proj"
        kind = "b" if "lora_b" in n else None
        if kind and interleaved and which == "gate_up_proj":
            kind = "b_interleaved"
        out[n] = ("%s.%s.%s.%s.weight" % (layer, hub[0], which, "lora_a" if "lora_a" in n
                                                   else "lora_b"), kind)
    def convert(n, t):
        new, kind = out[n]
        if kind == "b":  # [out, r * E] -> [E * out, r]
            o, re = t.shape
            t = t.reshape(o, re // E, E).permute(2, 0, 1).reshape(E * o, re // E)
        elif kind == "b_interleaved":  # [2I, r * E] -> [E, 2I, r], rows gate..., up...
            o, re = t.shape
            t = t.reshape(o, re // E, E).permute(2, 0, 1)
            t = torch.cat([t[:, 0::2], t[:, 1::2]], 1).reshape(E * o, re // E)
        return new, t.contiguous()
    return convert


def run_steps(peft_model, params, ids, labels, dtype, eps=1e-8, **kw):
    """gen_llama_reference.run_steps with AdamW's eps and the model's extra arguments (an
    attention mask)."""
    masters = {n: p.detach().float().clone().requires_grad_(True) for n, p in params.items()}
    opt = torch.optim.AdamW(list(masters.values()), lr=ref.LR, eps=eps)
    losses = []
    for _ in range(ref.STEPS):
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(masters[n].to(dtype))
        peft_model.zero_grad()
        loss = peft_model(input_ids=ids, labels=labels, **kw).loss
        loss.backward()
        losses.append(loss.item())
        for n, p in params.items():
            masters[n].grad = p.grad.detach().float().clone()
        opt.step()
    return losses, {n: m.detach() for n, m in masters.items()}


GPT_OSS_QUANTIZATION = {"quant_method": "mxfp4",  # (as openai/gpt-oss-20b's config.json)
                        "modules_to_not_convert": ["model.layers.*.self_attn",
                                                   "model.layers.*.mlp.router",
                                                   "model.embed_tokens", "lm_head"]}


def check_expert_deltas(peft_model, convert, layer="model.layers.0"):
    """gpt-oss: kqlora's expert adapters (convert's layout) reproduce PEFT's
    get_delta_weight of one layer's gate_up_proj and down_proj (gate, up, down apart)."""
    from peft.tuners.lora.layer import ParamWrapper
    kq = dict(convert(ref.kq_name(n), p.detach()) for n, p in peft_model.named_parameters()
              if "lora_" in n and layer + ".mlp.experts." in n)
    scale = ref.ALPHA / ref.RANK
    worst = 0.0
    for n, m in peft_model.named_modules():
        if not (isinstance(m, ParamWrapper) and (layer + ".mlp.experts") in n):
            continue
        delta = m.get_delta_weight("default").detach()  # [E, in, out] (is_transposed)
        pre = "%s.mlp.experts.%s." % (layer, m.parameter_name)
        a, b = kq[pre + "lora_a.weight"], kq[pre + "lora_b.weight"]
        E, r = delta.shape[0], ref.RANK
        for e in range(E):
            d = scale * b.reshape(E, -1, r)[e] @ a.reshape(E, r, -1)[e]  # [out, in], kqlora's
            if m.parameter_name == "gate_up_proj":
                want = torch.cat([delta[e][:, 0::2].T, delta[e][:, 1::2].T])  # gate, up
            else:
                want = delta[e].T
            worst = max(worst, (d - want).abs().max().item())
    assert worst < 1e-6, worst
    print("expert adapters: kqlora's layout reproduces PEFT's get_delta_weight of %s's "
          "gate (0::2), up (1::2) and down, max |diff| %.2e" % (layer, worst))


def yarn_report(model):
    rot = model.model.rotary_emb
    rp = model.config.rope_parameters
    if rp.get("rope_type") != "yarn":
        return
    dim = model.config.head_dim
    extra = 1.0 / rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    print("yarn inv_freq", ["%.9g" % x for x in rot.inv_freq.tolist()])
    print("yarn (extrapolated", ["%.6g" % x for x in extra.tolist()], "interpolated /",
          rp["factor"], ") attention_scaling %r" % rot.attention_scaling)


def topk_report(model, ids, layer=0, tokens=4):
    """Layer `layer`'s top-k experts and routing weights of row 0's first tokens."""
    seen = []
    router = [m for _, m in routers(model)][layer]
    h = router.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        h.remove()
    logits, scores, idx = seen[0]
    for t in range(tokens):
        print("layer %d token %d: experts %s weights %s (logits %s)" % (
            layer, t, idx[t].tolist(), ["%.7f" % x for x in scores[t].tolist()],
            ["%.5f" % x for x in logits[t, idx[t]].tolist()]))


def generate(name, case, folder, gen):
    os.makedirs(folder, exist_ok=True)
    family = case.get("family", "qwen3_moe")
    cfg_cls, model_cls, hub = FAMILIES[family]
    targets = case.get("targets", TARGETS)
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    config = cfg_cls(**case["arch"])
    config._attn_implementation = "eager"
    if family == "gpt_oss":
        config._experts_implementation = "eager"  # (GptOssExperts' own loop)
    model = model_cls(config).float().eval()
    if family == "gpt_oss":
        assert model.config._experts_implementation == "eager"
    randomise(model, gen)
    mxfp4 = to_mxfp4(model) if family == "gpt_oss" else None
    ids, labels, valid = ref.make_data(gen, case["arch"]["vocab_size"], ref.S_FAMILY,
                                       ref.LAYOUT_FAMILY)
    proj = NF4_PROJ.get(family, ref.PROJ)
    for attempt in range(50):  # no near-ties in any routing (on the NF4 model, as both run)
        trial = copy.deepcopy(model)
        ref.replace_with_nf4(trial, torch.float32, proj)
        replace_experts_with_nf4(trial, torch.float32, hub)
        gap = router_gap(trial, ids)
        if gap > TIE_GAP:
            break
        with torch.no_grad():
            for _, mod in routers(model):
                mod.weight.copy_(router_std(model) * torch.randn(mod.weight.shape, generator=gen))
    else:
        sys.exit("%s: no router draw without a near-tie" % name)
    config.save_pretrained(folder)
    if mxfp4 is not None:
        path = os.path.join(folder, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg["quantization_config"] = GPT_OSS_QUANTIZATION
        with open(path, "w") as f:
            f.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_file(hub_state_dict(model, hub, mxfp4), os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(folder, "case.txt"), "w") as f:
        f.write("lora_targets = %s\n" % ",".join(
            targets + (["experts.gate_up_proj", "experts.down_proj"] if case.get("experts") else [])))
        if case.get("bf16"):
            f.write("bf16 = true\n")
        if "eps" in case:
            f.write("adamw_eps = %g\n" % case["eps"])
        if "bf16_rtol" in case:
            f.write("bf16_rtol = %g\n" % case["bf16_rtol"])
    float_model = copy.deepcopy(model)
    nf4 = ref.replace_with_nf4(model, torch.float32, proj)
    nf4.update(replace_experts_with_nf4(model, torch.float32, hub))
    experts = ((["experts.gate_up_proj", "experts.down_proj"] if family == "gemma4_text"
                else EXPERT_PARAMS) if case.get("experts") else None)  # (Gemma 4's: no mlp.)
    peft_model = get_peft_model(model, LoraConfig(r=ref.RANK, lora_alpha=ref.ALPHA,
                                                  lora_dropout=0.0, target_modules=targets,
                                                  target_parameters=experts))
    params = ref.lora_params(peft_model)
    assert bool(experts) == any("experts" in n for n in params), "adapters on the experts?"
    convert = kq_expert_adapters(params, case["arch"], hub, interleaved=family == "gpt_oss",
                                 module="experts" if family == "gemma4_text" else "mlp.experts")
    kq = lambda d: dict(convert(n, t.detach()) for n, t in d.items())  # noqa: E731
    with torch.no_grad():
        for n, p in params.items():
            torch.nn.init.kaiming_uniform_(p, a=math.sqrt(5), generator=gen)
            if ".lora_b." in n:
                p.mul_(0.5)
    if family == "gpt_oss":
        check_expert_deltas(peft_model, convert)
    ref.write_init(os.path.join(folder, "init.h5"), nf4, kq(params), ref.FAMILY_LIBVER)
    if case.get("bf16"):
        ref.write_init(os.path.join(folder, "init_adapters.h5"), {}, kq(params),
                       ref.FAMILY_LIBVER)
    with ref.h5_create(os.path.join(folder, "data.h5"), ref.FAMILY_LIBVER) as f:
        f.create_dataset("input_ids", data=ids.numpy().astype(np.int32))
        f.create_dataset("labels", data=labels.numpy().astype(np.int32))
        f.attrs["vocab_size"] = np.int64(case["arch"]["vocab_size"])
    gap_lora = router_gap(peft_model.base_model.model, ids)
    if gap_lora <= TIE_GAP:
        return gap_lora  # (the caller draws again)
    clipped = clip_stats(peft_model.base_model.model, ids)
    if clipped is not None:  # (a clamp input at the bound could fall either side)
        print(name, "clip_qkv: %.3f of q, k, v clamped, nearest %.2e from the bound" % clipped)
        if clipped[1] <= CLIP_GAP:
            return 0.0
    clamped = swiglu_stats(peft_model.base_model.model, ids)
    if clamped is not None:  # (the same for the SwiGLU's clamps)
        print(name, "swiglu_limit %g: %.3f of gate values clamped, %.3f of up values, "
              "nearest %.2e from a bound" % ((config.swiglu_limit,) + clamped))
        if clamped[2] <= CLIP_GAP:
            return 0.0
    if family == "gpt_oss":
        yarn_report(peft_model.base_model.model)
        topk_report(peft_model.base_model.model, ids)
    # (the aux loss over the real tokens: transformers counts those the attention mask covers)
    kw = dict(attention_mask=valid) if case["arch"].get("output_router_logits") else {}
    out_ = peft_model(input_ids=ids, labels=labels, **kw)
    out_.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in params.items()}
    init = {n: p.detach().clone() for n, p in params.items()}
    eps = case.get("eps", 1e-8)
    losses, final = run_steps(peft_model, params, ids, labels, torch.float32, eps, **kw)
    losses16 = None
    with ref.h5_create(os.path.join(folder, "reference.h5"), ref.FAMILY_LIBVER) as f:
        f.create_dataset("logits", data=out_.logits.detach().numpy())
        f.create_dataset("valid", data=valid.numpy())
        f.create_dataset("loss", data=np.array([out_.loss.item()]))
        f.create_dataset("losses", data=np.array(losses))
        if getattr(out_, "aux_loss", None) is not None:  # (its share of the loss: coef * aux)
            f.create_dataset("aux_loss", data=np.array(
                [case["arch"]["router_aux_loss_coef"] * out_.aux_loss.item()]))
        for n, g in kq(grads).items():
            f.create_dataset("grads/" + n, data=g.numpy())
        for n, v in kq(final).items():
            f.create_dataset("final/" + n, data=v.numpy())
        if case.get("bf16"):
            # The same run in bfloat16: the float32 model rounded to bfloat16, NF4 of the
            # bfloat16 weights (kqlora quantizes model.safetensors itself), float32 masters.
            # (gpt-oss's RMSNorms too: its _keep_in_fp32_modules holds for float16 loads
            # only in transformers 5.25, so a bfloat16 load rounds their weights; the norm
            # still multiplies in float32 and rounds once)
            model16 = float_model.to(torch.bfloat16).eval()
            ref.replace_with_nf4(model16, torch.bfloat16, proj)
            replace_experts_with_nf4(model16, torch.bfloat16, hub)
            peft16 = get_peft_model(model16, LoraConfig(r=ref.RANK, lora_alpha=ref.ALPHA,
                                                        lora_dropout=0.0,
                                                        target_modules=targets,
                                                        target_parameters=experts))
            params16 = ref.lora_params(peft16)
            with torch.no_grad():
                for n, p in params16.items():
                    p.copy_(init[n].to(torch.bfloat16))
            losses16, _ = run_steps(peft16, params16, ids, labels, torch.bfloat16, eps, **kw)
            f.create_dataset("losses_bf16", data=np.array(losses16))
    aux = getattr(out_, "aux_loss", None)
    print(name, "router gap %.4f, with the adapters %.4f" % (gap, gap_lora), "loss",
          out_.loss.item(), "aux %s" % (None if aux is None else "%.6f" % aux.item()),
          "losses", ["%.6f" % x for x in losses])
    if losses16 is not None:
        print(name, "losses_bf16", ["%.6f" % x for x in losses16])
    return gap_lora


def no_target_conversion(peft_config, model, conversions):
    """PEFT's LoRA on the Linear modules a config names, as it is without the v4-to-v5 MoE
    conversion (which would read gate_proj / up_proj / down_proj as the experts')."""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data/family_reference",
                    help="write DIR/<case> (default: tests/data/family_reference)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma list (default: all)")
    args = ap.parse_args(argv)
    for name in [c.strip() for c in args.cases.split(",") if c.strip()]:
        if name not in CASES:
            sys.exit("unknown case '%s' (%s)" % (name, ",".join(CASES)))
        case = CASES[name]
        if "targets" in case:  # (the shared expert's own gate_proj, up_proj, down_proj)
            peft_conversion.convert_peft_config_for_transformers = no_target_conversion
        # (the adapters move the routers' inputs: a draw with a near-tie there is drawn again)
        for attempt in range(20):
            gen = torch.Generator().manual_seed(case["seed"] + 1000 * attempt)
            if generate(name, case, os.path.join(args.out, name), gen) > TIE_GAP:
                break
        else:
            sys.exit("%s: no draw without a near-tie" % name)


if __name__ == "__main__":
    main()
