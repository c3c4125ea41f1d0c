#!/usr/bin/env python3
"""Writes a random-weight Hugging Face model directory for one decoder family, any shape.

    python3 tools/make_hf_model.py OUT_DIR --family qwen2 --preset qwen2.5-7b --dtype bf16
    python3 tools/make_hf_model.py OUT_DIR --family gemma2 --preset tiny
    python3 tools/make_hf_model.py OUT_DIR --family llama --preset llama3.2-1b \\
        --config '{"num_hidden_layers": 4}'
    python3 tools/make_hf_model.py OUT_DIR --family phi3 --config my_config.json

Families: llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3, smollm3, olmo2, olmo3,
granite (presets smollm3-3b, olmo2-1b, olmo2-7b, olmo3-7b, granite-3.3-2b, granite-3.3-8b),
qwen3_5_text (Qwen3.5's text decoder: Gated DeltaNet and gated attention layers; preset
qwen3.5-0.8b), and the mixtures of experts qwen3_moe, qwen2_moe, mixtral, olmoe,
qwen3_5_moe_text (Qwen3.5's layers, every MLP experts and a shared expert; preset
qwen3.5-35b-a3b) and qwen3_next (the same with Gated DeltaNet's fused in_proj_qkvz and
in_proj_ba; preset qwen3-next-80b-a3b) (each expert's tensors in the hub's per-expert
names; presets olmoe-1b-7b, qwen3-30b-a3b, ...), gemma4_text (Gemma 4's text decoder:
sliding and full layers of their own head sizes, attention_k_eq_v, key/value sharing,
double-wide MLPs, per-layer inputs, layer_scalar; presets gemma-4-e2b, gemma-4-e4b,
gemma-4-31b) and gemma4 (Gemma 4 as the hub ships it, Gemma4ForConditionalGeneration: the
text decoder under model.language_model. beside a vision tower and its embedder, no audio
tower; the gemma4_text presets give its text_config, with that model's vision_config; a
--config's text_config and vision_config objects update the preset's field by field).
The shape comes from --preset (realistic shapes of public models, and "tiny" per family:
PRESETS) with --config (a JSON object, inline or a file) overriding fields; neither: the
family's transformers defaults. OUT_DIR gets:
  config.json                       the family's transformers config class's own
                                    save_pretrained (so every default is the family's),
                                    with architectures and dtype set
  model.safetensors                 or model-0000k-of-0000n.safetensors shards of at most
                                    --shard-mb megabytes (10^6 bytes, as transformers'
                                    max_shard_size) + model.safetensors.index.json
The tensor names and shapes are derived from the config here, per family (tensor_specs),
without instantiating the model: tensors are generated one at a time in fixed-size chunks
and streamed to disk, so a 7B/8B shape needs well under a gigabyte of memory. Each tensor
has its own generator, seeded from --seed and the tensor's name, so its values depend on
neither the order, the sharding nor the other tensors:
  matrices (projections, embedding, head)    normal(0, initializer_range)
  biases                                     0.1 * randn
  Llama-kind RMSNorm weights (w * x)         1 + 0.2 * randn   (llama, mistral, qwen2,
                                             qwen3 incl. q_norm/k_norm, phi3, smollm3,
                                             granite, olmo2/olmo3/olmoe incl. their
                                             whole-projection q_norm/k_norm; every
                                             gemma4_text/gemma4 norm, their
                                             layer_scalar and the vision tower's
                                             std_scale)
  Gemma-kind RMSNorm weights ((1 + w) * x)   0.2 * randn       (gemma2, gemma3_text incl.
                                             q_norm/k_norm; every qwen3_5_text,
                                             qwen3_5_moe_text and qwen3_next norm but the
                                             Gated DeltaNet's gated norm, Llama's kind)
  Gated DeltaNet's conv1d.weight             normal(0, initializer_range)
  Gated DeltaNet's A_log, dt_bias            log(U(0.005, 0.3)), 0.5 * randn (decays
                                             exp(-exp(A_log) softplus(a + dt_bias)) that
                                             carry the state over many tokens)
  Gemma 4's vision clamp bounds (scalars)    -inf and inf, transformers' initial values
                                             (no clipping)
Tied embeddings (tie_word_embeddings) write no lm_head.weight. BF16 is float32 rounded to
nearest even (the top 16 bits). The safetensors writer is this file's own: an 8-byte
little-endian header length, the JSON header (dtype, shape, data_offsets; metadata
format "pt"), padded with spaces to a multiple of 8, then the tensors' bytes in order.

No output destroys an input (tools/safe_output.py, docs/RELIABILITY.md): the directory is
written whole into a temporary directory beside OUT_DIR and swapped in at the end (with
--check, after the check), so a failure (exit 1) or a kill leaves an earlier OUT_DIR as it
was. An existing OUT_DIR must be an earlier model directory: config.json, the weights and
index (replaced), tokenizer files and generation_config.json (kept, carried into the new
one); one holding anything else, or the --config file, is refused (exit 2), as is a file
where the directory should be.

Phi-3 presets' longrope factor lists are synthetic (smooth, deterministic), of the right
length (rotary_dim / 2); the weights of every preset are random, never a real model's.
"""
import argparse
import copy
import hashlib
import json
import math
import os
import re
import struct
import sys

import numpy as np
import torch

from safe_output import check_output_directory, directory_output

FAMILIES = {
    # family: (config class name, model class name)
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM"),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM"),
    "granite": ("GraniteConfig", "GraniteForCausalLM"),
    "qwen3_5_text": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
    "gemma4_text": ("Gemma4TextConfig", "Gemma4ForCausalLM"),
    # Gemma 4 as the hub ships it: the text decoder under model.language_model. beside a
    # vision tower (what AutoModelForCausalLM.from_pretrained builds from such a directory)
    "gemma4": ("Gemma4Config", "Gemma4ForConditionalGeneration"),
}
MOE = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "qwen3_5_moe_text", "qwen3_next")
# Qwen3.5's hybrid layers (Gated DeltaNet and gated full attention by layer_types)
HYBRID = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
# a shared expert beside the routed ones, gated by sigmoid(shared_expert_gate(x))
SHARED_EXPERT = ("qwen2_moe", "qwen3_5_moe_text", "qwen3_next")
GEMMA_KIND = ("gemma2", "gemma3_text")
# zero-centred ((1 + w) * x) RMSNorm weights without Gemma's sandwich norms
ZERO_CENTRED = GEMMA_KIND + HYBRID
# post-norm blocks: no input_layernorm, no norm before the MLP; q_norm / k_norm over the
# whole q and k projections, post_attention_layernorm and post_feedforward_layernorm
OLMO_KIND = ("olmo2", "olmo3")
# Gemma 4: its text decoder alone (gemma4_text) and as the hub ships it (gemma4); w * x norms
GEMMA4 = ("gemma4_text", "gemma4")


def _longrope(n, long_max):
    """Synthetic longrope factors: short ~1..1.5, long 1..long_max, geometric in the index."""
    short = [round(1.0 + 0.5 * (i / max(n - 1, 1)) ** 2, 4) for i in range(n)]
    long = [round(long_max ** (i / max(n - 1, 1)), 4) for i in range(n)]
    return short, long


_P35_S, _P35_L = _longrope(48, 64.0)   # head_dim 96, full rotary
_P4_S, _P4_L = _longrope(48, 64.0)     # head_dim 128 * 0.75 = 96 rotary dims

PRESETS = {
    # ---- llama ----
    "llama2-7b": ("llama", dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                                num_hidden_layers=32, num_attention_heads=32,
                                num_key_value_heads=32, max_position_embeddings=4096,
                                rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                                tie_word_embeddings=False,
                                rope_parameters={"rope_type": "default",
                                                 "rope_theta": 10000.0})),
    "llama3.1-8b": ("llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                  num_hidden_layers=32, num_attention_heads=32,
                                  num_key_value_heads=8, max_position_embeddings=131072,
                                  rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=128001,
                                  tie_word_embeddings=False,
                                  rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                                   "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 8192})),
    "llama3.2-1b": ("llama", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                  num_hidden_layers=16, num_attention_heads=32,
                                  num_key_value_heads=8, head_dim=64,
                                  max_position_embeddings=131072, rms_norm_eps=1e-5,
                                  bos_token_id=128000, eos_token_id=128001,
                                  tie_word_embeddings=True,
                                  rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                                   "factor": 32.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 8192})),
    "smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                   num_hidden_layers=30, num_attention_heads=9,
                                   num_key_value_heads=3, max_position_embeddings=8192,
                                   rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                                   tie_word_embeddings=True, initializer_range=0.041666666666666664,
                                   rope_parameters={"rope_type": "default",
                                                    "rope_theta": 100000.0})),
    # ---- mistral ----
    "mistral-7b-v0.1": ("mistral", dict(vocab_size=32000, hidden_size=4096,
                                        intermediate_size=14336, num_hidden_layers=32,
                                        num_attention_heads=32, num_key_value_heads=8,
                                        max_position_embeddings=32768, rms_norm_eps=1e-5,
                                        sliding_window=4096, tie_word_embeddings=False,
                                        rope_parameters={"rope_type": "default",
                                                         "rope_theta": 10000.0})),
    "mistral-7b-v0.3": ("mistral", dict(vocab_size=32768, hidden_size=4096,
                                        intermediate_size=14336, num_hidden_layers=32,
                                        num_attention_heads=32, num_key_value_heads=8,
                                        max_position_embeddings=32768, rms_norm_eps=1e-5,
                                        sliding_window=None, tie_word_embeddings=False,
                                        rope_parameters={"rope_type": "default",
                                                         "rope_theta": 1000000.0})),
    # ---- qwen2 ----
    "qwen2.5-0.5b": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                   num_hidden_layers=24, num_attention_heads=14,
                                   num_key_value_heads=2, max_position_embeddings=32768,
                                   max_window_layers=24, use_sliding_window=False,
                                   sliding_window=32768, rms_norm_eps=1e-6,
                                   bos_token_id=151643, eos_token_id=151643,
                                   tie_word_embeddings=True,
                                   rope_parameters={"rope_type": "default",
                                                    "rope_theta": 1000000.0})),
    "qwen2.5-7b": ("qwen2", dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                 num_hidden_layers=28, num_attention_heads=28,
                                 num_key_value_heads=4, max_position_embeddings=131072,
                                 max_window_layers=28, use_sliding_window=False,
                                 sliding_window=131072, rms_norm_eps=1e-6,
                                 bos_token_id=151643, eos_token_id=151643,
                                 tie_word_embeddings=False,
                                 rope_parameters={"rope_type": "default",
                                                  "rope_theta": 1000000.0})),
    # ---- qwen3 ----
    "qwen3-0.6b": ("qwen3", dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                 num_hidden_layers=28, num_attention_heads=16,
                                 num_key_value_heads=8, head_dim=128,
                                 max_position_embeddings=40960, max_window_layers=28,
                                 use_sliding_window=False, sliding_window=None,
                                 rms_norm_eps=1e-6, attention_bias=False,
                                 bos_token_id=151643, eos_token_id=151645,
                                 tie_word_embeddings=True,
                                 rope_parameters={"rope_type": "default",
                                                  "rope_theta": 1000000.0})),
    "qwen3-8b": ("qwen3", dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                               num_hidden_layers=36, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=128,
                               max_position_embeddings=40960, max_window_layers=36,
                               use_sliding_window=False, sliding_window=None,
                               rms_norm_eps=1e-6, attention_bias=False,
                               bos_token_id=151643, eos_token_id=151645,
                               tie_word_embeddings=False,
                               rope_parameters={"rope_type": "default",
                                                "rope_theta": 1000000.0})),
    # ---- gemma2 ----
    "gemma2-2b": ("gemma2", dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                                 num_hidden_layers=26, num_attention_heads=8,
                                 num_key_value_heads=4, head_dim=256,
                                 query_pre_attn_scalar=256, sliding_window=4096,
                                 final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                                 max_position_embeddings=8192, rms_norm_eps=1e-6,
                                 hidden_activation="gelu_pytorch_tanh",
                                 tie_word_embeddings=True, pad_token_id=0, bos_token_id=2,
                                 eos_token_id=1,
                                 rope_parameters={"rope_type": "default",
                                                  "rope_theta": 10000.0})),
    # ---- gemma3_text ----
    "gemma3-1b": ("gemma3_text", dict(vocab_size=262144, hidden_size=1152,
                                      intermediate_size=6912, num_hidden_layers=26,
                                      num_attention_heads=4, num_key_value_heads=1,
                                      head_dim=256, query_pre_attn_scalar=256,
                                      sliding_window=512,
                                      layer_types=["full_attention" if (i + 1) % 6 == 0
                                                   else "sliding_attention" for i in range(26)],
                                      max_position_embeddings=32768, rms_norm_eps=1e-6,
                                      final_logit_softcapping=None,
                                      attn_logit_softcapping=None,
                                      hidden_activation="gelu_pytorch_tanh",
                                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=2,
                                      eos_token_id=1,
                                      rope_parameters={
                                          "sliding_attention": {"rope_type": "default",
                                                                "rope_theta": 10000.0},
                                          "full_attention": {"rope_type": "default",
                                                             "rope_theta": 1000000.0}})),
    # ---- phi3 ----
    "phi3.5-mini": ("phi3", dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192,
                                 num_hidden_layers=32, num_attention_heads=32,
                                 num_key_value_heads=32, max_position_embeddings=131072,
                                 original_max_position_embeddings=4096, sliding_window=262144,
                                 rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=32000,
                                 pad_token_id=32000, tie_word_embeddings=False,
                                 rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                  "short_factor": _P35_S,
                                                  "long_factor": _P35_L})),
    "phi4-mini": ("phi3", dict(vocab_size=200064, hidden_size=3072, intermediate_size=8192,
                               num_hidden_layers=32, num_attention_heads=24,
                               num_key_value_heads=8, max_position_embeddings=131072,
                               original_max_position_embeddings=4096, sliding_window=262144,
                               partial_rotary_factor=0.75, rms_norm_eps=1e-5,
                               bos_token_id=199999, eos_token_id=199999, pad_token_id=199999,
                               tie_word_embeddings=True,
                               rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                "short_factor": _P4_S, "long_factor": _P4_L})),
}

# "tiny" per family: a few hundred kilobytes, every family feature switched on
_TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             initializer_range=0.08)
# ---- mixtures of experts (the experts in the hub's per-expert layout) ----
PRESETS.update({
    "olmoe-1b-7b": ("olmoe", dict(vocab_size=50304, hidden_size=2048, intermediate_size=1024,
                                  num_hidden_layers=16, num_attention_heads=16,
                                  num_key_value_heads=16, max_position_embeddings=4096,
                                  rms_norm_eps=1e-5, num_experts=64, num_experts_per_tok=8,
                                  norm_topk_prob=False, clip_qkv=None, pad_token_id=1,
                                  eos_token_id=50279, tie_word_embeddings=False,
                                  rope_parameters={"rope_type": "default",
                                                   "rope_theta": 10000.0})),
    "qwen3-30b-a3b": ("qwen3_moe", dict(vocab_size=151936, hidden_size=2048,
                                        intermediate_size=6144, moe_intermediate_size=768,
                                        num_hidden_layers=48, num_attention_heads=32,
                                        num_key_value_heads=4, head_dim=128,
                                        max_position_embeddings=40960, rms_norm_eps=1e-6,
                                        num_experts=128, num_experts_per_tok=8,
                                        norm_topk_prob=True, decoder_sparse_step=1,
                                        mlp_only_layers=[], bos_token_id=151643,
                                        eos_token_id=151645, tie_word_embeddings=False,
                                        rope_parameters={"rope_type": "default",
                                                         "rope_theta": 1000000.0})),
    "qwen1.5-moe-a2.7b": ("qwen2_moe", dict(vocab_size=151936, hidden_size=2048,
                                            intermediate_size=5632, moe_intermediate_size=1408,
                                            shared_expert_intermediate_size=5632,
                                            num_hidden_layers=24, num_attention_heads=16,
                                            num_key_value_heads=16,
                                            max_position_embeddings=8192, rms_norm_eps=1e-6,
                                            num_experts=60, num_experts_per_tok=4,
                                            norm_topk_prob=False, tie_word_embeddings=False,
                                            rope_parameters={"rope_type": "default",
                                                             "rope_theta": 1000000.0})),
    "mixtral-8x7b": ("mixtral", dict(vocab_size=32000, hidden_size=4096,
                                     intermediate_size=14336, num_hidden_layers=32,
                                     num_attention_heads=32, num_key_value_heads=8,
                                     max_position_embeddings=32768, rms_norm_eps=1e-5,
                                     num_local_experts=8, num_experts_per_tok=2,
                                     tie_word_embeddings=False,
                                     rope_parameters={"rope_type": "default",
                                                      "rope_theta": 1000000.0})),
})

# ---- SmolLM3, OLMo 2 / 3, Granite 3 (shapes from the hub's config.json of each model named) ----
_OLMO3_LAYERS = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(32)]
PRESETS.update({
    # HuggingFaceTB/SmolLM3-3B: every fourth layer without rope (no_rope_layers from
    # no_rope_layer_interval 4), no windows, a tied head; eos is the instruct model's <|im_end|>
    "smollm3-3b": ("smollm3", dict(vocab_size=128256, hidden_size=2048, intermediate_size=11008,
                                   num_hidden_layers=36, num_attention_heads=16,
                                   num_key_value_heads=4, max_position_embeddings=65536,
                                   rms_norm_eps=1e-6, no_rope_layer_interval=4,
                                   use_sliding_window=False, sliding_window=None,
                                   attention_bias=False, mlp_bias=False, bos_token_id=None,
                                   eos_token_id=128012, pad_token_id=128004,
                                   tie_word_embeddings=True,
                                   rope_parameters={"rope_type": "default",
                                                    "rope_theta": 5000000.0})),
    # allenai/OLMo-2-0425-1B
    "olmo2-1b": ("olmo2", dict(vocab_size=100352, hidden_size=2048, intermediate_size=8192,
                               num_hidden_layers=16, num_attention_heads=16,
                               num_key_value_heads=16, max_position_embeddings=4096,
                               rms_norm_eps=1e-6, attention_bias=False, bos_token_id=None,
                               eos_token_id=100257, pad_token_id=100277,
                               tie_word_embeddings=False,
                               rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    # allenai/OLMo-2-1124-7B
    "olmo2-7b": ("olmo2", dict(vocab_size=100352, hidden_size=4096, intermediate_size=11008,
                               num_hidden_layers=32, num_attention_heads=32,
                               num_key_value_heads=32, max_position_embeddings=4096,
                               rms_norm_eps=1e-6, attention_bias=False, bos_token_id=None,
                               eos_token_id=100257, pad_token_id=100277,
                               tie_word_embeddings=False,
                               rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    # allenai/Olmo-3-1025-7B: three sliding layers (window 4096) to one full one, the full
    # layers' rope YaRN-scaled 8x from 8192 positions (the hub's rope_scaling, kept by
    # transformers 5 as the full_attention entry of rope_parameters), the sliding ones' not
    "olmo3-7b": ("olmo3", dict(vocab_size=100278, hidden_size=4096, intermediate_size=11008,
                               num_hidden_layers=32, num_attention_heads=32,
                               num_key_value_heads=32, max_position_embeddings=65536,
                               rms_norm_eps=1e-6, attention_bias=False, sliding_window=4096,
                               layer_types=_OLMO3_LAYERS, bos_token_id=None,
                               eos_token_id=100257, pad_token_id=100277,
                               tie_word_embeddings=False,
                               rope_parameters={
                                   "full_attention": {"rope_type": "yarn", "factor": 8.0,
                                                      "original_max_position_embeddings": 8192,
                                                      "attention_factor": 1.2079441541679836,
                                                      "beta_fast": 32.0, "beta_slow": 1.0,
                                                      "rope_theta": 500000.0},
                                   "sliding_attention": {"rope_type": "default",
                                                         "rope_theta": 500000.0}})),
    # ibm-granite/granite-3.3-2b-instruct
    "granite-3.3-2b": ("granite", dict(vocab_size=49159, hidden_size=2048,
                                       intermediate_size=8192, num_hidden_layers=40,
                                       num_attention_heads=32, num_key_value_heads=8,
                                       max_position_embeddings=131072, rms_norm_eps=1e-5,
                                       embedding_multiplier=12.0, residual_multiplier=0.22,
                                       attention_multiplier=0.015625, logits_scaling=8.0,
                                       attention_bias=False, mlp_bias=False, bos_token_id=0,
                                       eos_token_id=0, pad_token_id=0, tie_word_embeddings=True,
                                       rope_parameters={"rope_type": "default",
                                                        "rope_theta": 10000000.0})),
    # ibm-granite/granite-3.3-8b-instruct
    "granite-3.3-8b": ("granite", dict(vocab_size=49159, hidden_size=4096,
                                       intermediate_size=12800, num_hidden_layers=40,
                                       num_attention_heads=32, num_key_value_heads=8,
                                       max_position_embeddings=131072, rms_norm_eps=1e-5,
                                       embedding_multiplier=12.0, residual_multiplier=0.22,
                                       attention_multiplier=0.0078125, logits_scaling=16.0,
                                       attention_bias=False, mlp_bias=False, bos_token_id=0,
                                       eos_token_id=0, pad_token_id=0, tie_word_embeddings=True,
                                       rope_parameters={"rope_type": "default",
                                                        "rope_theta": 10000000.0})),
})

# ---- Qwen3.5's text decoder ----
PRESETS.update({
    # Qwen/Qwen3.5-0.8B: its config.json's text_config (mirrored in public repositories;
    # llama.cpp's qwen35 loader names 24 layers of width 1024 "0.8B"): three Gated DeltaNet
    # layers to one gated full-attention layer (full_attention_interval 4), 16 key and 16
    # value heads of 128, a tied head, interleaved mrope over 64 of head_dim 256
    "qwen3.5-0.8b": ("qwen3_5_text", dict(
        vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256,
        max_position_embeddings=262144, rms_norm_eps=1e-6, attention_bias=False,
        linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                     for i in range(24)],
        eos_token_id=248044, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                         "mrope_interleaved": True})),
    # Qwen/Qwen3.5-35B-A3B: transformers' Qwen3_5MoeTextConfig defaults (its docstring's
    # model; llama.cpp's qwen35moe loader names 40 layers "35B.A3B"): three Gated DeltaNet
    # layers to one gated full-attention layer, 16 key heads each read by 2 of 32 value heads
    # of 128, every layer 256 experts of 512 (top 8, renormalised) beside a shared expert of
    # 512, rope over 64 of head_dim 256
    "qwen3.5-35b-a3b": ("qwen3_5_moe_text", dict(
        vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
        num_key_value_heads=2, head_dim=256, max_position_embeddings=32768,
        rms_norm_eps=1e-6, attention_bias=False, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                     for i in range(40)],
        num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25})),
    # Qwen/Qwen3-Next-80B-A3B: transformers' Qwen3NextConfig defaults (its docstring's
    # model; llama.cpp's qwen3next loader names 48 layers "80B.A3B"): Qwen3.5's layers with
    # the fused in_proj_qkvz / in_proj_ba, every layer 512 experts of 512 (top 10,
    # renormalised) beside a shared expert of 512
    "qwen3-next-80b-a3b": ("qwen3_next", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=48,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        max_position_embeddings=32768, rms_norm_eps=1e-6, attention_bias=False,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                     for i in range(48)],
        num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25})),
})

# ---- Gemma 4's text decoder ----
# The hub's config.json text_config of each model (no hub access here: read from public
# copies of it, named per preset; where they disagree or say nothing, the comment says so
# and the value is Gemma4TextConfig's default). Sources for E2B and E4B: a Rust adapter in a
# public repository pinned to google/gemma-4-E2B and -E4B revisions (3e22461f, ee0ef602)
# that checks every text_config field exactly; public test fixtures of E2B's and E4B's
# whole config.json (Rust, Swift, Go; E2B's with its vision and audio configs); NVIDIA
# Megatron-Bridge's E4B recipe (docs.nvidia.com/nemo/megatron-bridge, bridge.recipes.
# gemma.h100.gemma4: 42 layers of 2560, MLP 10240, 8 heads, 2 kv heads, full layers of
# head 512 every sixth, ropes 1e4 and 1e6 x 0.25, per-layer inputs 256 x 262144, the last
# 18 layers sharing); google/gemma.cpp PR 919 (E2B: 35 layers of 1536, 4 sliding to 1 full,
# MLP 6144, 12288 on the sharing layers; E4B: 42 of 2560, 5 to 1, MLP 10240; heads 256 and
# 512, window 512, soft-cap 30, vocab 262144); huggingface.co/FINAL-Bench/Darwin-4B-David
# (an E4B derivative's config.json). Both ropes, in every copy, are Gemma4TextConfig's
# defaults:
_GEMMA4_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1000000.0}}


def _gemma4_layers(n, period):
    """(period - 1) sliding layers to one full, the last layer full."""
    return ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(n)]


PRESETS.update({
    # google/gemma-4-E2B(-it): 35 layers of 1536, 8 heads of 256 and 1 kv head on the
    # sliding layers (window 512), the full layers (every fifth) heads of 512 and the same
    # kv head (num_global_key_value_heads null; attention_k_eq_v false); the last 20 layers
    # share the keys and values of layers 13 (sliding) and 14 (full), their MLPs double-wide
    # (12288); per-layer inputs of 256 a layer from a table of 262144 rows; a tied head
    "gemma-4-e2b": ("gemma4_text", dict(
        vocab_size=262144, hidden_size=1536, intermediate_size=6144, num_hidden_layers=35,
        num_attention_heads=8, num_key_value_heads=1, head_dim=256, global_head_dim=512,
        attention_k_eq_v=False, sliding_window=512, layer_types=_gemma4_layers(35, 5),
        max_position_embeddings=131072, rms_norm_eps=1e-6, final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh", hidden_size_per_layer_input=256,
        vocab_size_per_layer_input=262144, num_kv_shared_layers=20, use_double_wide_mlp=True,
        enable_moe_block=False, use_bidirectional_attention=None, attention_bias=False,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1,
        rope_parameters=_GEMMA4_ROPE)),
    # google/gemma-4-E4B(-it): 42 layers of 2560, 8 heads of 256 and 2 kv heads (window
    # 512), every sixth layer full with heads of 512 (the same 2 kv heads); the last 18
    # layers share the keys and values of layers 22 (sliding) and 23 (full), MLPs not
    # double-wide (10240); per-layer inputs of 256 x 262144; tied (one Swift fixture writes
    # tie_word_embeddings false; the pinned adapter and the other copies say true)
    "gemma-4-e4b": ("gemma4_text", dict(
        vocab_size=262144, hidden_size=2560, intermediate_size=10240, num_hidden_layers=42,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256, global_head_dim=512,
        attention_k_eq_v=False, sliding_window=512, layer_types=_gemma4_layers(42, 6),
        max_position_embeddings=131072, rms_norm_eps=1e-6, final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh", hidden_size_per_layer_input=256,
        vocab_size_per_layer_input=262144, num_kv_shared_layers=18, use_double_wide_mlp=False,
        enable_moe_block=False, use_bidirectional_attention=None, attention_bias=False,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1,
        rope_parameters=_GEMMA4_ROPE)),
    # google/gemma-4-31B(-it): 60 layers of 5376 (MLP 21504), 32 heads of 256 and 16 kv
    # heads (window 1024), every sixth layer full with heads of 512, 4 kv heads and v =
    # k_proj's output (attention_k_eq_v); no per-layer inputs, no sharing; tied. Sources:
    # the text_config of huggingface.co/lthn/lemrd (an MLX quantization of it) and
    # OpenMOSE/Gemma4-Text (hidden, MLP, head sizes, k_eq_v, soft-cap 30, 5 sliding to 1
    # full, no per-layer inputs); a Rust fixture of its text_config cut to 6 layers (32
    # heads, kv heads 16 and 4, window 1024, 262144 positions, no sharing, no double-wide
    # MLP, use_bidirectional_attention "vision"); a Gemma 4 reference in Spanish in a
    # public repository (all four models' text_configs: 60 layers) and
    # apxml.com/models/gemma-4-31b (60 layers, window 1024, 30.7B parameters, which the
    # tensors here sum to). The hub writes use_bidirectional_attention "vision" (image
    # tokens attend both ways; text-only rows are causal either way); kqlora refuses any
    # value but null, so the preset writes null (--config
    # '{"use_bidirectional_attention": "vision"}' writes the hub's)
    "gemma-4-31b": ("gemma4_text", dict(
        vocab_size=262144, hidden_size=5376, intermediate_size=21504, num_hidden_layers=60,
        num_attention_heads=32, num_key_value_heads=16, head_dim=256, global_head_dim=512,
        num_global_key_value_heads=4, attention_k_eq_v=True, sliding_window=1024,
        layer_types=_gemma4_layers(60, 6), max_position_embeddings=262144,
        rms_norm_eps=1e-6, final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=262144,
        num_kv_shared_layers=0, use_double_wide_mlp=False, enable_moe_block=False,
        use_bidirectional_attention=None, attention_bias=False, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=2, eos_token_id=1, rope_parameters=_GEMMA4_ROPE)),
})
# --family gemma4 with a gemma-4-* preset: its text_config beside that model's vision tower
# (no audio tower: E2B's and E4B's are not written; kqlora reads neither). E2B's
# vision_config from the E2B fixture above (768 wide, 16 layers, 12 heads and kv heads of
# 64, MLP 3072, patch 16, pooling 3, 10240 positions, clipped linears); E4B's taken the
# same (the Spanish reference gives both towers 768 x 16 layers, 12 heads, patch 16;
# use_clipped_linears not found for E4B: E2B's true); the 31B's from the Spanish
# reference and a Go fixture of a gemma4 tower 1152 wide (27 layers, 16 heads of 72, MLP
# 4304, standardize true); its kv heads not found: 16, the heads (the attention needs a
# divisor of them); use_clipped_linears not found: false, as a 26B-A4B-derived copy's. The
# rest are Gemma4VisionConfig's defaults.
GEMMA4_VISION = {
    "gemma-4-e2b": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=16,
                        num_attention_heads=12, num_key_value_heads=12, head_dim=64,
                        patch_size=16, pooling_kernel_size=3, position_embedding_size=10240,
                        use_clipped_linears=True, standardize=False),
    "gemma-4-31b": dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                        num_attention_heads=16, num_key_value_heads=16, head_dim=72,
                        patch_size=16, pooling_kernel_size=3, position_embedding_size=10240,
                        use_clipped_linears=False, standardize=True),
}
GEMMA4_VISION["gemma-4-e4b"] = dict(GEMMA4_VISION["gemma-4-e2b"])

TINY = {
    "llama": dict(_TINY),
    "mistral": dict(_TINY, sliding_window=37),
    "qwen2": dict(_TINY, num_hidden_layers=3, use_sliding_window=True, sliding_window=37,
                  max_window_layers=1),
    "qwen3": dict(_TINY, head_dim=24, attention_bias=True, tie_word_embeddings=True),
    "gemma2": dict(_TINY, num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=20,
                   sliding_window=37, attn_logit_softcapping=5.0, final_logit_softcapping=5.0),
    "gemma3_text": dict(_TINY, num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=20,
                        sliding_window=37, final_logit_softcapping=5.0,
                        layer_types=["sliding_attention"] * 3 + ["full_attention"],
                        rope_parameters={"sliding_attention": {"rope_type": "default",
                                                               "rope_theta": 10000.0},
                                         "full_attention": {"rope_type": "linear",
                                                            "factor": 2.0,
                                                            "rope_theta": 1000000.0}}),
    "phi3": dict(_TINY, pad_token_id=0, bos_token_id=1, eos_token_id=2, sliding_window=37,
                 partial_rotary_factor=0.5, max_position_embeddings=1024,
                 original_max_position_embeddings=256,
                 rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                  "short_factor": [1.0, 1.25, 1.5, 2.0],
                                  "long_factor": [1.5, 2.0, 3.0, 4.0]}),
    "qwen3_moe": dict(_TINY, num_hidden_layers=3, head_dim=16, num_experts=8,
                      num_experts_per_tok=2, moe_intermediate_size=24, mlp_only_layers=[1],
                      norm_topk_prob=True),
    "qwen2_moe": dict(_TINY, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=24, shared_expert_intermediate_size=40,
                      mlp_only_layers=[1]),
    "mixtral": dict(_TINY, num_local_experts=4, num_experts_per_tok=2, sliding_window=37),
    "olmoe": dict(_TINY, num_experts=8, num_experts_per_tok=2, clip_qkv=2.0,
                  attention_bias=True, pad_token_id=1, eos_token_id=2),
    # layer 1 without rope (and, as transformers derives layer_types, windowed)
    "smollm3": dict(_TINY, num_hidden_layers=4, no_rope_layers=[1, 0, 1, 1],
                    use_sliding_window=True, sliding_window=37, attention_bias=True,
                    mlp_bias=True, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "olmo2": dict(_TINY, attention_bias=True, pad_token_id=1, eos_token_id=2),
    # sliding layers around a full one, the full layers' rope YaRN-scaled
    "olmo3": dict(_TINY, num_hidden_layers=4, attention_bias=True, sliding_window=37,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention",
                               "sliding_attention"], pad_token_id=1, eos_token_id=2,
                  rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 64,
                                                      "rope_theta": 500000.0},
                                   "sliding_attention": {"rope_type": "default",
                                                         "rope_theta": 500000.0}}),
    "granite": dict(_TINY, embedding_multiplier=6.0, residual_multiplier=0.5,
                    attention_multiplier=0.3, logits_scaling=3.0, attention_bias=True,
                    mlp_bias=True, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    # Gated DeltaNet layers 0 and 2 (2 key heads each read by 2 of 4 value heads), gated
    # full-attention layers 1 and 3 with biases, partial rotary 0.5 with mrope fields
    "qwen3_5_text": dict(_TINY, num_hidden_layers=4, head_dim=16, attention_bias=True,
                         linear_num_key_heads=2, linear_num_value_heads=4,
                         linear_key_head_dim=16, linear_value_head_dim=16,
                         linear_conv_kernel_dim=4,
                         layer_types=["linear_attention", "full_attention"] * 2,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "partial_rotary_factor": 0.5,
                                          "mrope_section": [2, 1, 1],
                                          "mrope_interleaved": True}),
    # qwen3_5_text's layers, every MLP 8 experts (top 2) beside a shared expert of 40 (no
    # intermediate_size: Qwen3_5MoeTextConfig has no dense MLP)
    "qwen3_5_moe_text": dict({k: v for k, v in _TINY.items() if k != "intermediate_size"},
                             num_hidden_layers=4, head_dim=16, attention_bias=True,
                             linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=16, linear_value_head_dim=16,
                             linear_conv_kernel_dim=4,
                             layer_types=["linear_attention", "full_attention"] * 2,
                             num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
                             shared_expert_intermediate_size=40,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "partial_rotary_factor": 0.5,
                                              "mrope_section": [2, 1, 1],
                                              "mrope_interleaved": True}),
    # the same layers with the fused in_proj_qkvz / in_proj_ba; layer 1 a dense MLP, the
    # others 8 experts (the raw top 2) beside a shared expert
    "qwen3_next": dict(_TINY, num_hidden_layers=4, head_dim=16, attention_bias=True,
                       linear_num_key_heads=2, linear_num_value_heads=4,
                       linear_key_head_dim=16, linear_value_head_dim=16,
                       linear_conv_kernel_dim=4,
                       layer_types=["linear_attention", "full_attention"] * 2,
                       num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
                       shared_expert_intermediate_size=40, mlp_only_layers=[1],
                       norm_topk_prob=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                        "partial_rotary_factor": 0.5}),
    # sliding layers 0, 2, 3 (heads 16, 2 kv heads, window 37) and full layers 1, 4 (heads
    # 32, 1 kv head, v = k_proj's output: attention_k_eq_v; proportional rope); layers 3
    # and 4 share the keys and values of layers 2 and 1 (no k_proj, v_proj, k_norm) with
    # double-wide MLPs (192), as E2B's; per-layer inputs of 16 a layer (E2B's, smaller); an
    # untied head, a final soft-cap
    "gemma4_text": dict(_TINY, num_hidden_layers=5, head_dim=16, global_head_dim=32,
                        num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=37,
                        layer_types=["sliding_attention", "full_attention",
                                     "sliding_attention", "sliding_attention",
                                     "full_attention"],
                        num_kv_shared_layers=2, use_double_wide_mlp=True,
                        hidden_size_per_layer_input=16, vocab_size_per_layer_input=96,
                        final_logit_softcapping=5.0, tie_word_embeddings=False),
}
# Gemma 4 as the hub ships it: the tiny gemma4_text decoder (tied, as the hub's) beside a
# vision tower of one layer with clipped linears (E2B's) and the standardizing bias and
# scale (the 31B's)
TINY["gemma4"] = dict(
    text_config=dict(TINY["gemma4_text"], tie_word_embeddings=True),
    vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, head_dim=16, patch_size=4,
                       pooling_kernel_size=2, position_embedding_size=16,
                       use_clipped_linears=True, standardize=True, initializer_range=0.08),
    initializer_range=0.08, tie_word_embeddings=True)

CHUNK = 1 << 22  # elements generated at a time (fixed: the values do not depend on memory)
DTYPES = {"f32": ("F32", 4, torch.float32), "bf16": ("BF16", 2, torch.bfloat16)}


def make_config(family, fields, dtype):
    import transformers
    cfg_cls = getattr(transformers, FAMILIES[family][0])
    cfg = cfg_cls(**fields)
    cfg.architectures = [FAMILIES[family][1]]
    cfg.dtype = DTYPES[dtype][2]
    return cfg


def tensor_specs(family, cfg):
    """[(name, shape, kind)] in the model's order; kind: matrix, bias, norm, gemma_norm,
    a_log, dt_bias, clip_min, clip_max."""
    if family in GEMMA4:
        return gemma4_specs(family, cfg)
    # (Qwen3.5-MoE has no dense MLP, so no intermediate_size)
    H, V, I = cfg.hidden_size, cfg.vocab_size, getattr(cfg, "intermediate_size", None)
    nh = cfg.num_attention_heads
    nkv = getattr(cfg, "num_key_value_heads", None) or nh
    hd = getattr(cfg, "head_dim", None) or H // nh  # qwen2/phi3 have no head_dim field
    norm = "gemma_norm" if family in ZERO_CENTRED else "norm"
    if family == "qwen2":
        attn_bias = True   # hard-wired in Qwen2Attention (no config field)
    elif family == "qwen2_moe":
        attn_bias = bool(cfg.qkv_bias)
    elif family in ("mistral", "phi3", "mixtral"):
        attn_bias = False  # hard-wired
    else:
        attn_bias = bool(getattr(cfg, "attention_bias", False))
    o_bias = attn_bias and family not in ("qwen2", "qwen2_moe")  # (biases on q, k, v only)
    mlp_bias = family in ("llama", "smollm3", "granite") and getattr(cfg, "mlp_bias", False)
    specs = [("model.embed_tokens.weight", (V, H), "matrix")]
    for i in range(cfg.num_hidden_layers):
        p = "model.layers.%d." % i

        def lin(name, out, inp, bias):
            specs.append((p + name + ".weight", (out, inp), "matrix"))
            if bias:
                specs.append((p + name + ".bias", (out,), "bias"))
        if family not in OLMO_KIND:
            specs.append((p + "input_layernorm.weight", (H,), norm))
        linear = family in HYBRID and cfg.layer_types[i] == "linear_attention"
        if linear:
            deltanet_layer(lin, specs, p, cfg, H, fused=family == "qwen3_next")
        elif family == "phi3":
            lin("self_attn.qkv_proj", (nh + 2 * nkv) * hd, H, False)
        else:  # (Qwen3.5's q_proj writes [q_h | gate_h] per head)
            lin("self_attn.q_proj", nh * hd * (2 if family in HYBRID else 1), H, attn_bias)
            lin("self_attn.k_proj", nkv * hd, H, attn_bias)
            lin("self_attn.v_proj", nkv * hd, H, attn_bias)
        if not linear:
            lin("self_attn.o_proj", H, nh * hd, o_bias)
        if family in ("qwen3", "gemma3_text", "qwen3_moe") or (family in HYBRID and not linear):
            specs.append((p + "self_attn.q_norm.weight", (hd,), norm))
            specs.append((p + "self_attn.k_norm.weight", (hd,), norm))
        if family == "olmoe" or family in OLMO_KIND:  # (over the whole projections)
            specs.append((p + "self_attn.q_norm.weight", (nh * hd,), norm))
            specs.append((p + "self_attn.k_norm.weight", (nkv * hd,), norm))
        specs.append((p + "post_attention_layernorm.weight", (H,), norm))
        if family in GEMMA_KIND:
            specs.append((p + "pre_feedforward_layernorm.weight", (H,), norm))
            specs.append((p + "post_feedforward_layernorm.weight", (H,), norm))
        if family in MOE and sparse_layer(family, cfg, i):
            moe_layer(lin, family, cfg, H)
            continue
        if family == "phi3":
            lin("mlp.gate_up_proj", 2 * I, H, False)
        else:
            lin("mlp.gate_proj", I, H, mlp_bias)
            lin("mlp.up_proj", I, H, mlp_bias)
        lin("mlp.down_proj", H, I, mlp_bias)
        if family in OLMO_KIND:
            specs.append((p + "post_feedforward_layernorm.weight", (H,), norm))
    specs.append(("model.norm.weight", (H,), norm))
    if not cfg.tie_word_embeddings:
        specs.append(("lm_head.weight", (V, H), "matrix"))
    return specs


def gemma4_specs(family, cfg):
    """Gemma 4's tensors (transformers' Gemma4ForCausalLM; gemma4: Gemma4ForConditionalGeneration,
    the text decoder under model.language_model. and the vision tower and its embedder
    beside). Per layer: the head size and key/value heads of its type (per_layer_config:
    global_head_dim, num_global_key_value_heads), no v_proj on attention_k_eq_v's full layers,
    no k_proj, v_proj or k_norm on a layer sharing an earlier one's keys and values
    (kv_sharing_modes "reuse"), then an MLP twice intermediate_size wide with
    use_double_wide_mlp; the v norm has no weight. Every norm is w * x; layer_scalar [1]."""
    if family == "gemma4":
        if cfg.audio_config is not None:
            sys.exit("audio_config: the audio tower is not written (kqlora does not read it); "
                     "leave it null")
        t, m = cfg.text_config, "model.language_model."
    else:
        t, m = cfg, "model."
    H, V, I, nh = t.hidden_size, t.vocab_size, t.intermediate_size, t.num_attention_heads
    P, L, bias = t.hidden_size_per_layer_input, t.num_hidden_layers, bool(t.attention_bias)
    if t.enable_moe_block:
        sys.exit("enable_moe_block: Gemma 4's MoE block is not written (kqlora refuses it)")
    specs = [(m + "embed_tokens.weight", (V, H), "matrix")]
    modes = t.kv_sharing_modes
    for i in range(L):
        p = "%slayers.%d." % (m, i)

        def lin(name, out, inp, with_bias=False):
            specs.append((p + name + ".weight", (out, inp), "matrix"))
            if with_bias:
                specs.append((p + name + ".bias", (out,), "bias"))
        lc = t.per_layer_config[i]
        hd, nkv = lc.head_dim, lc.num_key_value_heads
        shared = modes[i] == "reuse"
        specs.append((p + "input_layernorm.weight", (H,), "norm"))
        lin("self_attn.q_proj", nh * hd, H, bias)
        specs.append((p + "self_attn.q_norm.weight", (hd,), "norm"))
        if not shared:
            lin("self_attn.k_proj", nkv * hd, H, bias)
            if not (t.attention_k_eq_v and t.layer_types[i] != "sliding_attention"):
                lin("self_attn.v_proj", nkv * hd, H, bias)
            specs.append((p + "self_attn.k_norm.weight", (hd,), "norm"))
        lin("self_attn.o_proj", H, nh * hd, bias)
        for name in ("post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            specs.append((p + name + ".weight", (H,), "norm"))
        w = I * (2 if t.use_double_wide_mlp and shared else 1)
        lin("mlp.gate_proj", w, H)
        lin("mlp.up_proj", w, H)
        lin("mlp.down_proj", H, w)
        if P:
            lin("per_layer_input_gate", P, H)
            lin("per_layer_projection", H, P)
            specs.append((p + "post_per_layer_input_norm.weight", (H,), "norm"))
        specs.append((p + "layer_scalar", (1,), "norm"))
    specs.append((m + "norm.weight", (H,), "norm"))
    if P:
        specs.append((m + "embed_tokens_per_layer.weight",
                      (t.vocab_size_per_layer_input, L * P), "matrix"))
        specs.append((m + "per_layer_model_projection.weight", (L * P, H), "matrix"))
        specs.append((m + "per_layer_projection_norm.weight", (P,), "norm"))
    if family == "gemma4" and cfg.vision_config is not None:
        specs += gemma4_vision_specs(cfg.vision_config, H)
    tied = cfg.tie_word_embeddings if family == "gemma4" else t.tie_word_embeddings
    if not tied:
        specs.append(("lm_head.weight", (V, H), "matrix"))
    return specs


def gemma4_vision_specs(v, text_hidden):
    """Gemma 4's vision tower (Gemma4VisionModel) and its embedder into the text decoder: the
    patch embedder, encoder layers of Gemma4ClippableLinear projections (each with its
    clamp bounds, scalars, when use_clipped_linears: written as transformers initialises
    them, -inf and inf, no clipping), w * x norms and q/k norms; standardize's bias and
    scale."""
    t, H, hd = "model.vision_tower.", v.hidden_size, v.head_dim
    specs = []
    if v.standardize:
        specs += [(t + "std_bias", (H,), "bias"), (t + "std_scale", (H,), "norm")]
    specs.append((t + "patch_embedder.position_embedding_table",
                  (2, v.position_embedding_size, H), "matrix"))
    specs.append((t + "patch_embedder.input_proj.weight", (H, 3 * v.patch_size ** 2), "matrix"))
    for i in range(v.num_hidden_layers):
        p = "%sencoder.layers.%d." % (t, i)

        def lin(name, out, inp):
            if v.use_clipped_linears:
                for b in ("input_min", "input_max", "output_min", "output_max"):
                    specs.append((p + name + "." + b, (), "clip_" + b[-3:]))
            specs.append((p + name + ".linear.weight", (out, inp), "matrix"))
        lin("self_attn.q_proj", v.num_attention_heads * hd, H)
        lin("self_attn.k_proj", v.num_key_value_heads * hd, H)
        lin("self_attn.v_proj", v.num_key_value_heads * hd, H)
        lin("self_attn.o_proj", H, v.num_attention_heads * hd)
        specs.append((p + "self_attn.q_norm.weight", (hd,), "norm"))
        specs.append((p + "self_attn.k_norm.weight", (hd,), "norm"))
        lin("mlp.gate_proj", v.intermediate_size, H)
        lin("mlp.up_proj", v.intermediate_size, H)
        lin("mlp.down_proj", H, v.intermediate_size)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            specs.append((p + name + ".weight", (H,), "norm"))
    specs.append(("model.embed_vision.embedding_projection.weight", (text_hidden, H), "matrix"))
    return specs


def deltanet_layer(lin, specs, p, cfg, H, fused):
    """A Qwen3.5 Gated DeltaNet layer's tensors (transformers' Qwen3_5GatedDeltaNet): the
    projections of q, k, v (fused), z, b and a (`fused`: Qwen3-Next's in_proj_qkvz and
    in_proj_ba, their rows per key head group), the causal conv over [q | k | v], the
    decay's dt_bias and A_log, the gated norm (w * x) and out_proj."""
    m = "linear_attn."
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    kw, vw = nk * cfg.linear_key_head_dim, nv * cfg.linear_value_head_dim
    if fused:
        lin(m + "in_proj_qkvz", 2 * kw + 2 * vw, H, False)
        lin(m + "in_proj_ba", 2 * nv, H, False)
    else:
        lin(m + "in_proj_qkv", 2 * kw + vw, H, False)
        lin(m + "in_proj_z", vw, H, False)
        lin(m + "in_proj_b", nv, H, False)
        lin(m + "in_proj_a", nv, H, False)
    specs.append((p + m + "conv1d.weight", (2 * kw + vw, 1, cfg.linear_conv_kernel_dim),
                  "matrix"))
    specs.append((p + m + "dt_bias", (nv,), "dt_bias"))
    specs.append((p + m + "A_log", (nv,), "a_log"))
    specs.append((p + m + "norm.weight", (cfg.linear_value_head_dim,), "norm"))
    lin(m + "out_proj", H, vw, False)


def sparse_layer(family, cfg, i):
    """Whether layer i's MLP is the experts (Qwen-MoE: decoder_sparse_step, mlp_only_layers)."""
    if family in ("mixtral", "olmoe", "qwen3_5_moe_text"):
        return True
    return (i + 1) % cfg.decoder_sparse_step == 0 and i not in (cfg.mlp_only_layers or [])


def moe_layer(lin, family, cfg, H):
    """A sparse layer's router and experts in the hub's per-expert names (and the shared
    expert with its gate of Qwen2-MoE, Qwen3.5-MoE and Qwen3-Next)."""
    if family == "mixtral":
        E, inter, m, names = cfg.num_local_experts, cfg.intermediate_size, "block_sparse_moe", \
            ("w1", "w3", "w2")
    else:
        E = cfg.num_experts
        inter = cfg.intermediate_size if family == "olmoe" else cfg.moe_intermediate_size
        m, names = "mlp", ("gate_proj", "up_proj", "down_proj")
    lin(m + ".gate", E, H, False)
    for j in range(E):
        lin("%s.experts.%d.%s" % (m, j, names[0]), inter, H, False)
        lin("%s.experts.%d.%s" % (m, j, names[1]), inter, H, False)
        lin("%s.experts.%d.%s" % (m, j, names[2]), H, inter, False)
    if family in SHARED_EXPERT:
        S = cfg.shared_expert_intermediate_size
        lin("mlp.shared_expert.gate_proj", S, H, False)
        lin("mlp.shared_expert.up_proj", S, H, False)
        lin("mlp.shared_expert.down_proj", H, S, False)
        lin("mlp.shared_expert_gate", 1, H, False)


def tensor_seed(seed, name):
    h = hashlib.sha256(("%d:%s" % (seed, name)).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def tensor_chunks(name, shape, kind, seed, std, dtype):
    """The tensor's bytes, CHUNK elements at a time."""
    gen = torch.Generator().manual_seed(tensor_seed(seed, name))
    n = math.prod(shape)
    for start in range(0, n, CHUNK):
        x = torch.randn(min(CHUNK, n - start), generator=gen, dtype=torch.float32)
        if kind == "a_log":  # log(U(0.005, 0.3)) from the normal draw's CDF
            x = (0.005 + 0.295 * (0.5 * (1 + torch.erf(x / math.sqrt(2))))).log()
        elif kind == "dt_bias":
            x.mul_(0.5)
        elif kind == "matrix":
            x.mul_(std)
        elif kind == "bias":
            x.mul_(0.1)
        elif kind == "norm":
            x.mul_(0.2).add_(1.0)
        elif kind in ("clip_min", "clip_max"):  # (transformers' initial bounds: no clipping)
            x.fill_(-math.inf if kind == "clip_min" else math.inf)
        else:  # gemma_norm
            x.mul_(0.2)
        if dtype == "bf16":  # round to nearest even: torch's float32 -> bfloat16
            yield x.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        else:
            yield x.numpy().astype("<f4", copy=False).tobytes()


def plan_shards(specs, esize, shard_bytes):
    """Greedy, in order: a shard closes when the next tensor would pass shard_bytes (a tensor
    larger than that gets a shard of its own)."""
    shards, cur, size = [], [], 0
    for s in specs:
        nbytes = math.prod(s[1]) * esize
        if cur and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(s)
        size += nbytes
    if cur:
        shards.append(cur)
    return shards


def write_shard(path, specs, dtype, seed, std):
    st_dtype, esize, _ = DTYPES[dtype]
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in specs:
        nbytes = math.prod(shape) * esize
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape, kind in specs:
            for b in tensor_chunks(name, shape, kind, seed, std, dtype):
                f.write(b)
    os.replace(tmp, path)
    return off


# An earlier model directory's entries: written here (replaced) and kept from it.
WRITTEN = re.compile(r"config\.json|model\.safetensors(\.index\.json)?|"
                     r"model-\d{5}-of-\d{5}\.safetensors|base\.h5")
KEPT = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
        "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja",
        "chat_template.json", "generation_config.json"}


def model_dir_entry(name):
    """An entry an earlier model directory at OUT_DIR may hold."""
    return bool(WRITTEN.fullmatch(name)) or name in KEPT


def load_config_arg(text):
    if os.path.isfile(text):
        with open(text) as f:
            return json.load(f)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        sys.exit("--config: neither a file nor a JSON object (%s)" % e)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="presets: tiny (every family), " + ", ".join(
            "%s (%s)" % (k, v[0] + (" or gemma4" if v[0] == "gemma4_text" else ""))
            for k, v in PRESETS.items()))
    ap.add_argument("out_dir", help="the model directory to write (created)")
    ap.add_argument("--family", required=True, choices=sorted(FAMILIES))
    ap.add_argument("--preset", help="a realistic shape (see below) or 'tiny'")
    ap.add_argument("--config", help="JSON object or a JSON file: config fields, over the preset")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                    help="tensor dtype in the files (default bf16)")
    ap.add_argument("--shard-mb", type=float, default=2000.0,
                    help="largest shard in megabytes of 10^6 bytes (default 2000)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--nf4-base", metavar="KQLORA_QUANTIZE",
                    help="keep no safetensors: quantize each shard as soon as it is written "
                         "with this kqlora-quantize binary, append its NF4 tensors to "
                         "OUT_DIR/base.h5 and delete the shard (a base larger than the disk "
                         "could hold in BF16; train with hf_model_dir=OUT_DIR "
                         "init_file=OUT_DIR/base.h5)")
    ap.add_argument("--block-size", type=int, default=64,
                    help="--nf4-base: NF4 block size (default 64)")
    ap.add_argument("--scaler-block-size", type=int, default=256,
                    help="--nf4-base: NF4 scaler block size (default 256)")
    ap.add_argument("--check", action="store_true",
                    help="afterwards load the directory with transformers' "
                         "AutoModelForCausalLM (the whole model in memory: small shapes) and "
                         "fail on any missing, unexpected or mismatched tensor or a "
                         "non-finite forward")
    args = ap.parse_args(argv)
    if args.check and args.nf4_base:
        sys.exit("--check reads the safetensors, which --nf4-base does not keep")
    check_output_directory("OUT_DIR", args.out_dir,
                           [args.config] if args.config and os.path.isfile(args.config) else [],
                           own=model_dir_entry)

    fields = {}
    if args.preset == "tiny":
        fields = copy.deepcopy(TINY[args.family])  # transformers fills nested dicts in place
    elif args.preset:
        if args.preset not in PRESETS:
            sys.exit("unknown preset '%s' (tiny, %s)" % (args.preset, ", ".join(PRESETS)))
        fam, preset = PRESETS[args.preset]
        if args.family == "gemma4" and fam == "gemma4_text":  # (the model as the hub ships it)
            fields = dict(text_config=copy.deepcopy(preset),
                          vision_config=copy.deepcopy(GEMMA4_VISION.get(args.preset)))
        elif fam != args.family:
            sys.exit("preset %s is a %s model, not %s" % (args.preset, fam, args.family))
        else:
            fields = copy.deepcopy(preset)
    over = {}
    if args.config:
        over = load_config_arg(args.config)
        if not isinstance(over, dict):
            sys.exit("--config must be a JSON object")
        over.pop("model_type", None)
        over.pop("architectures", None)
        if args.family == "gemma4":  # (text_config and vision_config: fields over fields)
            for sub in ("text_config", "vision_config"):
                if isinstance(over.get(sub), dict):
                    over[sub].pop("model_type", None)
                    fields[sub] = dict(fields.get(sub) or {}, **over.pop(sub))
        fields.update(over)
    if args.family == "gemma4" and "tie_word_embeddings" not in over:
        # (kqlora asks the top-level tie_word_embeddings to agree with the text config's)
        fields["tie_word_embeddings"] = (fields.get("text_config") or {}).get(
            "tie_word_embeddings", True)

    cfg = make_config(args.family, fields, args.dtype)
    specs = tensor_specs(args.family, cfg)
    esize = DTYPES[args.dtype][1]
    std = float(cfg.initializer_range)
    shards = plan_shards(specs, esize, int(args.shard_mb * 1e6))
    with directory_output(args.out_dir, keep=KEPT) as out:
        cfg.save_pretrained(out)
        total, weight_map = 0, {}
        for k, shard in enumerate(shards):
            fn = "model.safetensors" if len(shards) == 1 else \
                "model-%05d-of-%05d.safetensors" % (k + 1, len(shards))
            total += write_shard(os.path.join(out, fn), shard, args.dtype, args.seed, std)
            weight_map.update({name: fn for name, _, _ in shard})
            print("wrote %s (%d tensors)" % (fn, len(shard)), flush=True)
            if args.nf4_base:
                append_nf4(args, os.path.join(out, fn), os.path.join(out, "base.h5"))
        if len(shards) > 1 and not args.nf4_base:
            n_params = sum(math.prod(s[1]) for s in specs)
            with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": total, "total_parameters": n_params},
                           "weight_map": weight_map}, f, indent=2, sort_keys=True)
                f.write("\n")
        n = sum(math.prod(s[1]) for s in specs)
        print("%s: %s %s, %d tensors, %.3f B parameters, %.2f GB in %d file(s)" % (
            args.out_dir, args.family, args.preset or "(config)", len(specs), n / 1e9,
            total / 1e9, len(shards)))
        if args.check:  # (before the swap: a failed check leaves an earlier OUT_DIR)
            check(out, args.family)


def append_nf4(args, shard, base):
    """--nf4-base: the shard quantized by kqlora-quantize into a piece, the piece's /params
    copied into base (its root attributes from the first), shard and piece deleted."""
    import subprocess
    import h5py
    piece = shard + ".nf4.h5"
    p = subprocess.run([args.nf4_base, shard, piece, "--config",
                        os.path.join(os.path.dirname(shard), "config.json"),
                        "--block-size", str(args.block_size),
                        "--scaler-block-size", str(args.scaler_block_size)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("%s failed (%d):\n%s" % (args.nf4_base, p.returncode, p.stdout[-4000:]))
    print("  " + p.stdout.strip().splitlines()[-1], flush=True)
    with h5py.File(piece, "r") as src, h5py.File(base, "a") as dst:
        if "params" not in dst:
            for k, v in src.attrs.items():
                dst.attrs[k] = v
            dst.create_group("params")
        for name in src["params"]:
            if name in dst["params"]:
                sys.exit("%s: tensor %s twice" % (base, name))
            src.copy(src["params"][name], dst["params"], name=name)
    os.remove(piece)
    os.remove(shard)


def check(out_dir, family):
    """transformers loads the directory as the family's model, every tensor accounted for,
    and a forward gives finite logits."""
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(out_dir, output_loading_info=True,
                                                       dtype="auto")
    problems = {k: sorted(v) for k, v in info.items() if v}
    if type(model).__name__ != FAMILIES[family][1] or problems:
        sys.exit("check failed: %s %s" % (type(model).__name__, problems))
    vocab = model.config.get_text_config().vocab_size  # (a multimodal model's: its text config's)
    ids = torch.randint(1, vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    if not torch.isfinite(logits).all():
        sys.exit("check failed: non-finite logits")
    print("check: %s loads with no missing/unexpected/mismatched tensors; logits %s finite" % (
        type(model).__name__, tuple(logits.shape)))


if __name__ == "__main__":
    main()
