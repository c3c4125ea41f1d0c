#!/usr/bin/env python3
"""Reference numbers for kqlora's decoder models from transformers + PEFT + torchao (CPU).

    python3 tools/gen_llama_reference.py                      # the four Llama cases
    python3 tools/gen_llama_reference.py --cases qwen2,phi3   # some family cases
    python3 tools/gen_llama_reference.py --cases families     # every family case
    python3 tools/gen_llama_reference.py --cases all --out /tmp/ref

Needs torch, torchao, transformers (5.x), peft, safetensors, h5py (pip). Run once; the
outputs are committed (well under a megabyte per case). Two groups of cases:

  llama cases (gqa, tied_head_dim, llama3_qv, mistral)  -> tests/data/llama_reference/<case>
      Llama / Mistral, sequences of 12 tokens, the default attention implementation; the
      four share one random stream (seeded 20261201, in that order), so they are written
      together (naming some but not all of them is refused) and bit for bit as before.
  family cases (qwen2, qwen3, gemma2, gemma3_text, phi3, phi3_long, mistral_window,
                smollm3, olmo2, olmo3, granite)
                                                        -> tests/data/family_reference/<case>
      one model family each (FAMILY_CASES), sequences of 136 tokens, sliding windows of 37
      tokens, attn_implementation="eager" (the soft-caps' and windows' eager semantics),
      each case its own random stream (a generator seeded from the case's own constant, so
      adding a case changes no other). Every bias is randomised (0.1 randn: transformers
      zeroes them), every norm weight too: Llama-kind norms (w * x) 1 + 0.2 randn,
      Gemma-kind norms ((1 + w) * x) 0.2 randn. Each folder also has case.txt:
          lora_targets = all-linear        (or the comma list the case uses)
          bf16 = true                      (bfloat16 cases only)
          adamw_eps = 0.001                (the steps' AdamW eps, where not 1e-8)

--out DIR puts every selected case under DIR/<case> instead. tools/check_family_reference.py
re-derives any case's logits and loss from its files alone (the families' semantics written
out, no transformers modeling code).

For each case (a small random-initialised configuration) it writes into <out>/<case>/:
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
Every base projection's weight (q/k/v/o, gate/up/down, and Phi-3's fused qkv_proj and
gate_up_proj) is replaced by torchao's NF4 dequantization of it (block_size 32,
scaler_block_size 32: sizes torchao's to_nf4 accepts), so both sides compute with the same
weights. The bfloat16 run's kqlora side quantizes model.safetensors itself; its model is
the float32 directory loaded and cast with .to(torch.bfloat16), which rounds every float
buffer too (the rotary inv_freq, Gemma's embedding normalizer).
"""
import argparse
import math
import os
import sys

import h5py
import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          Gemma4ForCausalLM, Gemma4TextConfig,
                          GraniteConfig, GraniteForCausalLM, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Olmo2Config, Olmo2ForCausalLM,
                          Olmo3Config, Olmo3ForCausalLM, Phi3Config, Phi3ForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3_5ForCausalLM, Qwen3_5TextConfig,
                          Qwen3Config, Qwen3ForCausalLM, SmolLM3Config, SmolLM3ForCausalLM)
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet, Qwen3_5RMSNorm

from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

torch.set_num_threads(1)

BLOCK, SCALER_BLOCK, RANK, ALPHA = 32, 32, 4, 8.0
N, STEPS, LR = 3, 5, 1e-2
PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PHI3_PROJ = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]  # kept fused
# Qwen3.5: the attention's and MLP's, and the Gated DeltaNet layers' five
QWEN3_5_PROJ = PROJ + ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"]
MODULE = {p: ("self_attn." if p in PROJ[:4] else "mlp.") + p for p in PROJ}

# model_type -> (config class, model class, projection names = PEFT's target modules)
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, PROJ),
    "mistral": (MistralConfig, MistralForCausalLM, PROJ),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, PROJ),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, PROJ),
    "gemma2": (Gemma2Config, Gemma2ForCausalLM, PROJ),
    "gemma3_text": (Gemma3TextConfig, Gemma3ForCausalLM, PROJ),
    "phi3": (Phi3Config, Phi3ForCausalLM, PHI3_PROJ),
    "smollm3": (SmolLM3Config, SmolLM3ForCausalLM, PROJ),
    "olmo2": (Olmo2Config, Olmo2ForCausalLM, PROJ),
    "olmo3": (Olmo3Config, Olmo3ForCausalLM, PROJ),
    "granite": (GraniteConfig, GraniteForCausalLM, PROJ),
    "qwen3_5_text": (Qwen3_5TextConfig, Qwen3_5ForCausalLM, QWEN3_5_PROJ),
    "gemma4_text": (Gemma4TextConfig, Gemma4ForCausalLM, PROJ),
    # (with per-layer inputs: their per-layer Linears are targets too; the model's
    # per_layer_model_projection NF4 but frozen, as kqlora keeps it: docs/MODELS.md)
    "gemma4_text_ple": (Gemma4TextConfig, Gemma4ForCausalLM,
                        PROJ + ["per_layer_input_gate", "per_layer_projection",
                                "per_layer_model_projection"]),
}
# Norms computing (1 + w) * x (weights initialised to 0); every other RMSNorm is w * x.
GEMMA_NORMS = (Gemma2RMSNorm, Gemma3RMSNorm, Qwen3_5RMSNorm)

# ---- the Llama cases (tests/data/llama_reference): unchanged since they were committed ----
S_LLAMA = 12
BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
            initializer_range=0.08, max_position_embeddings=64)
LLAMA_CASES = {
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
    "mistral": dict(arch=dict(BASE, sliding_window=32), targets=PROJ, family="mistral"),
}
LLAMA_SEED = 20261201

# ---- the family cases (tests/data/family_reference) ----
S_FAMILY, WINDOW = 136, 37  # the window: shorter than the sequences, not a multiple of 64
# Rows as make_data's 12-token pattern scaled to 136: a 34-token prompt in row 1, right
# padding of 45 tokens (row 1, longer than the window) and 23 tokens (row 2).
LAYOUT_FAMILY = (34, 45, 23)
FAM = dict(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, initializer_range=0.08,
           max_position_embeddings=256)
# The family cases' HDF5 files use the 1.10 file format (what kqlora writes itself: one
# chunk per dataset needs no B-tree, a third of the size of the default format's files);
# groups, datasets, attributes, dtypes, chunks and filters are the Llama cases'.
FAMILY_LIBVER = ("v110", "v110")


def _factors(seed, n):
    """n longrope factors in [1, 3], from their own generator (config values)."""
    g = torch.Generator().manual_seed(seed)
    return [round(1.0 + 2.0 * float(x), 4) for x in torch.rand(n, generator=g)]


PHI3 = dict(FAM, pad_token_id=0, eos_token_id=2, partial_rotary_factor=0.5,
            sliding_window=WINDOW, max_position_embeddings=1024,
            original_max_position_embeddings=256,
            # rotary_dim = 16 * 0.5 = 8: 4 factors each
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                             "short_factor": _factors(31, 4), "long_factor": _factors(32, 4)})
FAMILY_CASES = {
    # q/k/v biases (o_proj has none in Qwen2); use_sliding_window with max_window_layers 1:
    # layer 0 full, layer 1 slides (Qwen2Config writes layer_types); untied head
    "qwen2": dict(family="qwen2", seed=1001,
                  arch=dict(FAM, use_sliding_window=True, sliding_window=WINDOW,
                            max_window_layers=1)),
    # head_dim 24 != hidden / heads, biases on q, k, v and o, q_norm / k_norm (w * x), GQA,
    # tied head (as Qwen3's small models)
    "qwen3": dict(family="qwen3", seed=1002, bf16=True,
                  arch=dict(FAM, head_dim=24, attention_bias=True, tie_word_embeddings=True)),
    # hidden 32 (sqrt 32 is not a bfloat16: the embedding normalizer rounds) with 4 heads of
    # 16 (heads * head_dim != hidden), query_pre_attn_scalar 20 != head_dim, soft-caps of 5
    # on attention scores and logits (q/k and the tied embedding scaled up so both bend),
    # layer_types as Gemma2Config derives them (sliding, full, sliding, full), tied head;
    # biases on q, k, v and o (attention_bias); also a bfloat16 run
    "gemma2": dict(family="gemma2", seed=1003, bf16=True,
                   arch=dict(FAM, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                             head_dim=16, query_pre_attn_scalar=20, sliding_window=WINDOW,
                             attn_logit_softcapping=5.0, final_logit_softcapping=5.0,
                             attention_bias=True),
                   scale={"embed_tokens.weight": 8.0, "q_proj.weight": 5.0,
                          "k_proj.weight": 5.0}),
    # q_norm / k_norm ((1 + w) * x), 3 sliding layers (local rope base 10000) then a full one
    # (rope_theta 1e6 with linear scaling 2), query_pre_attn_scalar 20, final soft-cap 5
    # (Gemma3's attention takes no soft-cap in transformers 5.24: attn_logit_softcapping
    # stays null), tied head
    "gemma3_text": dict(family="gemma3_text", seed=1004,
                        arch=dict(FAM, hidden_size=32, num_hidden_layers=4, head_dim=16,
                                  query_pre_attn_scalar=20,
                                  sliding_window=WINDOW, final_logit_softcapping=5.0,
                                  layer_types=["sliding_attention"] * 3 + ["full_attention"],
                                  rope_parameters={
                                      "sliding_attention": {"rope_type": "default",
                                                            "rope_theta": 10000.0},
                                      "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                         "rope_theta": 1000000.0}}),
                        scale={"embed_tokens.weight": 6.0}),
    # fused qkv_proj / gate_up_proj, partial rotary 0.5, a window of 37 on every layer,
    # longrope with original_max_position_embeddings 256 > 136: the short factors
    "phi3": dict(family="phi3", seed=1005, bf16=True, arch=dict(PHI3)),
    # longrope with original_max_position_embeddings 64 < 136: the long factors, no window
    "phi3_long": dict(family="phi3", seed=1006,
                      arch=dict(PHI3, original_max_position_embeddings=64,
                                max_position_embeddings=512, sliding_window=None)),
    # Mistral with a window shorter than the sequences
    "mistral_window": dict(family="mistral", seed=1007, arch=dict(FAM, sliding_window=WINDOW)),
    # The 2026 families (these and later cases: AdamW eps 1e-3, so that last-bit gradient
    # differences of near-zero entries do not become steps of up to lr).
    # SmolLM3: no rope on layer 1 (no_rope_layers 0), a window of 37 on layers 1 and 2 (one
    # without rope, one with), q/k/v/o and MLP biases, tied head
    "smollm3": dict(family="smollm3", seed=1008, bf16=True, eps=1e-3,
                    arch=dict(FAM, num_hidden_layers=3, no_rope_layers=[1, 0, 1],
                              pad_token_id=0, bos_token_id=1, eos_token_id=2,
                              use_sliding_window=True, sliding_window=WINDOW,
                              layer_types=["full_attention", "sliding_attention",
                                           "sliding_attention"],
                              attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    # OLMo 2: post-norms only, q/k norms over the whole projections (k's over 2 kv heads),
    # norms w * n in float32, q/k/v/o biases, rope base 5e5
    "olmo2": dict(family="olmo2", seed=1009, bf16=True, eps=1e-3,
                  arch=dict(FAM, attention_bias=True,
                            rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    # OLMo 3: three sliding layers (window 37) then a full one whose rope is YaRN (factor 4
    # over an original context of 64 < 136, a partial ramp), the sliding layers' unscaled
    "olmo3": dict(family="olmo3", seed=1010, eps=1e-3,
                  arch=dict(FAM, num_hidden_layers=4, sliding_window=WINDOW,
                            rope_parameters={
                                "full_attention": {"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 64,
                                                   "rope_theta": 500000.0},
                                "sliding_attention": {"rope_type": "default",
                                                      "rope_theta": 500000.0}})),
    # Qwen3.5's text decoder: Gated DeltaNet layers 0 and 2 (4 key heads each read by 4 of
    # 16 value heads, dk 16, dv 4, conv kernel 4; 136 tokens: chunks of 64, 64 and 8) and
    # gated full-attention layers 1 and 3 (q_proj's [q | gate] per head, zero-centred q/k
    # norms, partial rotary 0.5 with mrope fields); every norm (1 + w) n. AdamW eps 1e-2:
    # the delta rule's gradients carry float32 rounding of about 1e-5 of each tensor's
    # largest (transformers' float32 run against its float64 run, and kqlora's), which
    # Adam at eps 1e-3 turned into 5-step adapter differences of 5.5e-4 between
    # transformers' own float32 and float64 runs (measured with dk 8; 8.7e-5 at eps 1e-2);
    # here kqlora's run is within 1.1e-5 of transformers' float32 one.
    "qwen3_5_text": dict(family="qwen3_5_text", seed=1012, bf16=True, eps=1e-2,
                         arch=dict(FAM, num_hidden_layers=4, head_dim=16,
                                   linear_num_key_heads=4, linear_num_value_heads=16,
                                   linear_key_head_dim=16, linear_value_head_dim=4,
                                   linear_conv_kernel_dim=4,
                                   layer_types=["linear_attention", "full_attention",
                                                "linear_attention", "full_attention"],
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                    "partial_rotary_factor": 0.5,
                                                    "mrope_section": [1, 1, 2],
                                                    "mrope_interleaved": True})),
    # Gemma 4's text decoder: sliding layers 0 and 2 (window 37, head 16, 2 kv heads) and
    # full layers 1 and 3 with heads of 32 and 1 kv head (global_head_dim,
    # num_global_key_value_heads) whose v is k_proj's raw output (attention_k_eq_v: no
    # v_proj); q/k norms w * n, v norms without a weight; proportional rope on the full
    # layers (8 of 16 pairs rotated), default on the sliding ones; attention scale 1; each
    # layer's output times its layer_scalar (drawn in [0.5, 1.5]); final soft-cap 5. The q/k
    # norms' weights times 0.6: scaled by 1, scores of up to 23 made transformers' own
    # float32 logits differ from its float64 ones by 1.4e-5 of their largest, above the 1e-5
    # the tests ask (now |s| < 9)
    "gemma4_text": dict(family="gemma4_text", seed=1013, bf16=True, eps=1e-3,
                        scale={"q_norm.weight": 0.6, "k_norm.weight": 0.6},
                        arch=dict(FAM, num_hidden_layers=4, head_dim=16, global_head_dim=32,
                                  num_global_key_value_heads=1, attention_k_eq_v=True,
                                  hidden_size_per_layer_input=0, sliding_window=WINDOW,
                                  final_logit_softcapping=5.0,
                                  layer_types=["sliding_attention", "full_attention",
                                               "sliding_attention", "full_attention"],
                                  rope_parameters={
                                      "sliding_attention": {"rope_type": "default",
                                                            "rope_theta": 10000.0},
                                      "full_attention": {"rope_type": "proportional",
                                                         "partial_rotary_factor": 0.5,
                                                         "rope_theta": 1000000.0}})),
    # Gemma 4's key/value sharing: layers 3 (sliding) and 4 (full) attend over the keys and
    # values of layers 2 and 1 (the last earlier layer of their type), with no k_proj,
    # v_proj or k/v norms, and double-wide MLPs (128); otherwise as gemma4_text
    "gemma4_kv_shared": dict(family="gemma4_text", seed=1014, bf16=True, eps=1e-3,
                             scale={"q_norm.weight": 0.6, "k_norm.weight": 0.6},
                             arch=dict(FAM, num_hidden_layers=5, head_dim=16, global_head_dim=32,
                                       num_global_key_value_heads=1, attention_k_eq_v=True,
                                       hidden_size_per_layer_input=0, sliding_window=WINDOW,
                                       num_kv_shared_layers=2, use_double_wide_mlp=True,
                                       final_logit_softcapping=5.0,
                                       layer_types=["sliding_attention", "full_attention",
                                                    "sliding_attention", "sliding_attention",
                                                    "full_attention"])),
    # Gemma 4 E2B's per-layer inputs: a table of 96 rows of 4 x 16, the model's projection
    # (NF4, frozen) and norm, each layer's gate and projection (adapters on both) and
    # norm; with key/value sharing on the last layer (over layer 2's, sliding)
    "gemma4_ple": dict(family="gemma4_text_ple", seed=1015, bf16=True, eps=1e-3,
                       scale={"q_norm.weight": 0.6, "k_norm.weight": 0.6},
                       targets=PROJ + ["per_layer_input_gate", "per_layer_projection"],
                       arch=dict(FAM, num_hidden_layers=4, head_dim=16, global_head_dim=32,
                                 num_global_key_value_heads=1, attention_k_eq_v=True,
                                 hidden_size_per_layer_input=16, vocab_size_per_layer_input=96,
                                 sliding_window=WINDOW, num_kv_shared_layers=1,
                                 final_logit_softcapping=5.0,
                                 layer_types=["sliding_attention", "full_attention",
                                              "sliding_attention", "full_attention"])),
    # Granite 3: embeddings times 6, sublayer outputs times 0.5, scores times 0.3 (not
    # head_dim^-1/2), logits over 3; q/k/v/o and MLP biases
    "granite": dict(family="granite", seed=1011, bf16=True, eps=1e-3,
                    arch=dict(FAM, embedding_multiplier=6.0, residual_multiplier=0.5,
                              attention_multiplier=0.3, logits_scaling=3.0,
                              attention_bias=True, mlp_bias=True)),
}

GROUPS = {"llama": (LLAMA_CASES, "tests/data/llama_reference"),
          "families": (FAMILY_CASES, "tests/data/family_reference")}


def kq_name(peft_name):
    """base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight ->
    model.layers.0.self_attn.q_proj.lora_a.weight"""
    n = peft_name.replace("base_model.model.", "", 1).replace(".default", "")
    return n.replace("lora_A", "lora_a").replace("lora_B", "lora_b")


def make_data(gen, vocab, S=S_LLAMA, layout=(3, 4, 2)):
    """[N, S] ids in 1..vocab-1; row 1 a prompt of layout[0] tokens (labels -100) and right
    padding of layout[1] tokens (pad id 0, labels -100), row 2 right padding of layout[2]."""
    prompt, pad1, pad2 = layout
    ids = torch.randint(1, vocab, (N, S), generator=gen)
    labels = ids.clone()
    valid = torch.ones(N, S, dtype=torch.int32)
    labels[1, :prompt] = -100     # a prompt
    ids[1, S - pad1:] = 0         # right padding (pad id 0)
    labels[1, S - pad1:] = -100
    valid[1, S - pad1:] = 0
    ids[2, S - pad2:] = 0
    labels[2, S - pad2:] = -100
    valid[2, S - pad2:] = 0
    return ids, labels, valid


def family_of(case):
    return FAMILIES[case.get("family", "llama")]


def targets_of(case):
    return case.get("targets", family_of(case)[2])


def build(case, gen, eager=False):
    cfg_cls, model_cls, _ = family_of(case)
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    config = cfg_cls(**case["arch"])
    if eager:
        config._attn_implementation = "eager"
    model = model_cls(config).float().eval()
    if eager:
        assert model.config._attn_implementation == "eager"
        randomise_family(model, case, gen)
    else:  # the Llama cases, as they were generated
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):  # not all ones: the norms' weights are used
                    p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
    return model


def randomise_family(model, case, gen):
    """Every bias 0.1 randn, every norm weight random (Gemma kind 0.2 randn, others
    1 + 0.2 randn), then the case's scale factors; checks that no parameter is left out."""
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
            elif isinstance(mod, torch.nn.Conv1d):  # (Gated DeltaNet's: 0.3 randn)
                mod.weight.copy_(0.3 * torch.randn(mod.weight.shape, generator=gen))
                done.add(pre + "weight")
            elif isinstance(mod, Qwen3_5GatedDeltaNet):
                # decays exp(-exp(A_log) softplus(a + dt_bias)): A in [0.005, 0.3], slow
                # enough for the state to carry over a chunk of 64
                a = 0.005 + 0.295 * torch.rand(mod.A_log.shape, generator=gen)
                mod.A_log.copy_(a.log())
                mod.dt_bias.copy_(0.5 * torch.randn(mod.dt_bias.shape, generator=gen))
                done.update({pre + "A_log", pre + "dt_bias"})
            elif "RMSNorm" in type(mod).__name__ and hasattr(mod, "weight"):
                # (Gemma 4's v norm has none)
                w = mod.weight
                if isinstance(mod, GEMMA_NORMS):
                    w.copy_(0.2 * torch.randn(w.shape, generator=gen))
                else:
                    w.copy_(1 + 0.2 * torch.randn(w.shape, generator=gen))
                done.add(pre + "weight")
            elif hasattr(mod, "layer_scalar"):  # (Gemma 4's, a buffer: each in [0.5, 1.5])
                mod.layer_scalar.copy_(0.5 + torch.rand(mod.layer_scalar.shape, generator=gen))
        for name, p in model.named_parameters():
            assert name in done, "parameter not randomised: " + name
            for suffix, factor in case.get("scale", {}).items():
                if name.endswith(suffix):
                    p.mul_(factor)


def replace_with_nf4(model, dtype, proj=PROJ):
    """Every base projection's weight becomes torchao's NF4 dequantization of it; returns
    the NF4 tensors by parameter name."""
    nf4 = {}
    with torch.no_grad():
        for name, mod in model.named_modules():
            if name.split(".")[-1] in proj and isinstance(mod, torch.nn.Linear):
                t = to_nf4(mod.weight.detach().to(dtype), BLOCK, SCALER_BLOCK)
                mod.weight.copy_(t.get_original_weight().to(mod.weight.dtype))
                nf4[name + ".weight"] = t
    return nf4


def h5_create(path, libver=None):
    """h5py.File(path, "w"); libver None: h5py's default (the Llama cases' files)."""
    return h5py.File(path, "w") if libver is None else h5py.File(path, "w", libver=libver)


def write_init(path, nf4, params, libver=None):
    def dataset(group, name, array):
        array = np.ascontiguousarray(array)
        group.create_dataset(name, data=array, chunks=array.shape, fletcher32=True)
    with h5_create(path, libver) as f:
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


def run_steps(peft_model, params, ids, labels, dtype, eps=1e-8):
    """5 AdamW steps over the whole batch on float32 master copies of the adapters."""
    masters = {n: p.detach().float().clone().requires_grad_(True) for n, p in params.items()}
    opt = torch.optim.AdamW(list(masters.values()), lr=LR, eps=eps)
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


def softcap_report(model, ids):
    """For models with soft-caps: how often the pre-cap attention scores (causal entries)
    and the pre-cap logits exceed the cap, so the reference shows tanh bending."""
    cfg = model.config
    attn_cap = getattr(cfg, "attn_logit_softcapping", None)
    final_cap = getattr(cfg, "final_logit_softcapping", None)
    if attn_cap is None and final_cap is None:
        return ""
    mod = sys.modules[type(model).__module__]
    original = mod.eager_attention_forward
    scores, logits = [], []

    def spy(module, query, key, value, attention_mask, **kw):
        k = mod.repeat_kv(key, module.num_key_value_groups)
        s = (query @ k.transpose(2, 3)) * kw["scaling"]
        if attention_mask is not None:
            s = s[(attention_mask == 0).expand_as(s)]
        scores.append(s.flatten())
        return original(module, query, key, value, attention_mask, **kw)

    hook = model.lm_head.register_forward_hook(lambda m, i, o: logits.append(o.flatten()))
    mod.eager_attention_forward = spy
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        mod.eager_attention_forward = original
        hook.remove()
    s, lg = torch.cat(scores), torch.cat(logits)
    out = []
    if attn_cap is not None:
        out.append("scores |s|>%g: %.1f%% (max %.1f)" % (attn_cap, 100 * (s.abs() > attn_cap)
                                                       .float().mean(), s.abs().max()))
    else:
        out.append("scores max |s| %.1f (no attention cap)" % s.abs().max())
    if final_cap is not None:
        out.append("logits |l|>%g: %.1f%% (max %.1f)" % (final_cap, 100 * (lg.abs() > final_cap)
                                                       .float().mean(), lg.abs().max()))
    return "; ".join(out)


def build_from(folder, case, eager=False):
    model_cls = family_of(case)[1]
    kwargs = {"attn_implementation": "eager"} if eager else {}
    return model_cls.from_pretrained(folder, dtype=torch.float32, **kwargs)


def generate(name, case, folder, gen, family_case):
    """Writes one case's folder; gen: the random stream (shared by the Llama cases, the
    case's own for the family cases)."""
    S, layout = (S_FAMILY, LAYOUT_FAMILY) if family_case else (S_LLAMA, (3, 4, 2))
    proj, targets = family_of(case)[2], targets_of(case)
    libver = FAMILY_LIBVER if family_case else None
    os.makedirs(folder, exist_ok=True)
    model = build(case, gen, eager=family_case)
    model.save_pretrained(folder, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(folder, extra)):
            os.remove(os.path.join(folder, extra))
    if family_case:
        with open(os.path.join(folder, "case.txt"), "w") as f:
            f.write("lora_targets = %s\n" % ("all-linear" if list(targets) == list(proj)
                                             else ",".join(targets)))
            if case.get("bf16"):
                f.write("bf16 = true\n")
            if case.get("eps"):
                f.write("adamw_eps = %g\n" % case["eps"])
    nf4 = replace_with_nf4(model, torch.float32, proj)
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                  target_modules=targets))
    params = lora_params(peft_model)
    with torch.no_grad():  # both A and B non-zero, so every gradient is
        for n, p in params.items():
            torch.nn.init.kaiming_uniform_(p, a=math.sqrt(5), generator=gen)
            if ".lora_b." in n:
                p.mul_(0.5)
    write_init(os.path.join(folder, "init.h5"), nf4, params, libver)
    if case.get("bf16"):  # the adapters alone: kqlora quantizes the bfloat16 weights
        write_init(os.path.join(folder, "init_adapters.h5"), {}, params, libver)
    ids, labels, valid = make_data(gen, case["arch"]["vocab_size"], S, layout)
    with h5_create(os.path.join(folder, "data.h5"), libver) as f:
        f.create_dataset("input_ids", data=ids.numpy().astype(np.int32))
        f.create_dataset("labels", data=labels.numpy().astype(np.int32))
        f.attrs["vocab_size"] = np.int64(case["arch"]["vocab_size"])
    caps = softcap_report(peft_model.base_model.model, ids) if family_case else ""

    out_ = peft_model(input_ids=ids, labels=labels)
    out_.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in params.items()}
    init = {n: p.detach().clone() for n, p in params.items()}
    eps = case.get("eps", 1e-8)
    losses, final = run_steps(peft_model, params, ids, labels, torch.float32, eps)
    losses16 = None
    with h5_create(os.path.join(folder, "reference.h5"), libver) as f:
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
            model16 = build_from(folder, case, eager=family_case).to(torch.bfloat16).eval()
            replace_with_nf4(model16, torch.bfloat16, proj)
            peft16 = get_peft_model(model16, LoraConfig(r=RANK, lora_alpha=ALPHA,
                                                        lora_dropout=0.0,
                                                        target_modules=targets))
            params16 = lora_params(peft16)
            with torch.no_grad():
                for n, p in params16.items():
                    p.copy_(init[n].to(torch.bfloat16))
            losses16, _ = run_steps(peft16, params16, ids, labels, torch.bfloat16, eps)
            f.create_dataset("losses_bf16", data=np.array(losses16))
    print(name, "loss", out_.loss.item(), "losses", ["%.6f" % x for x in losses])
    if losses16 is not None:
        print(name, "losses_bf16", ["%.6f" % x for x in losses16])
    if caps:
        print(name, caps)
    return out_.loss.item(), losses, losses16


def parse_cases(text):
    """'a,b' / 'llama' / 'families' / 'all' -> [(name, case, group)] in a stable order."""
    wanted = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if item == "all":
            wanted += list(LLAMA_CASES) + list(FAMILY_CASES)
        elif item in GROUPS:
            wanted += list(GROUPS[item][0])
        elif item in LLAMA_CASES or item in FAMILY_CASES:
            wanted.append(item)
        else:
            sys.exit("unknown case '%s' (llama: %s; families: %s)" % (
                item, ",".join(LLAMA_CASES), ",".join(FAMILY_CASES)))
    llama = [n for n in LLAMA_CASES if n in wanted]
    if llama and len(llama) != len(LLAMA_CASES):
        sys.exit("the Llama cases share one random stream: generate all of them (%s) or none"
                 % ",".join(LLAMA_CASES))
    return ([(n, LLAMA_CASES[n], "llama") for n in llama]
            + [(n, FAMILY_CASES[n], "families") for n in FAMILY_CASES if n in wanted])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="cases: llama = %s; families = %s; or all" % (
                                     ",".join(LLAMA_CASES), ",".join(FAMILY_CASES)))
    ap.add_argument("out_dir", nargs="?", default=None,
                    help="the same as --out (the older spelling)")
    ap.add_argument("--out", default=None,
                    help="write DIR/<case> (default: tests/data/llama_reference for the Llama "
                         "cases, tests/data/family_reference for the family cases)")
    ap.add_argument("--cases", default="llama",
                    help="comma list of case names or groups (llama, families, all); "
                         "default: llama")
    args = ap.parse_args(argv)
    out = args.out or args.out_dir
    selected = parse_cases(args.cases)
    gen = torch.Generator().manual_seed(LLAMA_SEED)  # the Llama cases' shared stream
    table = []
    for name, case, group in selected:
        folder = os.path.join(out or GROUPS[group][1], name)
        if group == "llama":
            loss, losses, losses16 = generate(name, case, folder, gen, family_case=False)
        else:
            own = torch.Generator().manual_seed(case["seed"])
            loss, losses, losses16 = generate(name, case, folder, own, family_case=True)
        size = sum(os.path.getsize(os.path.join(folder, x)) for x in os.listdir(folder))
        table.append((name, loss, losses[-1], losses16[-1] if losses16 else None, size))
    print("\n%-15s %10s %12s %12s %9s" % ("case", "loss", "loss@step5", "bf16@step5", "bytes"))
    for name, loss, last, last16, size in table:
        print("%-15s %10.6f %12.6f %12s %9d" % (name, loss, last,
                                                "-" if last16 is None else "%.6f" % last16, size))


if __name__ == "__main__":
    main()
