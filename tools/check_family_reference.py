#!/usr/bin/env python3
"""Re-derives a reference case's logits and loss from its files alone, with the family
semantics written out here (no transformers modeling code), in float64.

    python3 tools/check_family_reference.py tests/data/family_reference/*  [--effects]

Each argument is a case folder written by tools/gen_llama_reference.py (config.json,
model.safetensors, init.h5, data.h5, reference.h5). The dense tensors (embedding, norms,
biases, head) come from model.safetensors, every projection from init.h5's NF4 components
(dequantized as docs/NF4.md says), the LoRA adapters from init.h5 (scale alpha / r = 2).
It prints max |logits - reference| / max |reference| (and the max itself) and the loss
per case and exits 1 when the relative difference exceeds 1e-4 (float32 reference vs
float64 here). --effects also reruns each case with one feature switched off at a time
(the sliding window, the soft-caps, longrope's factor choice, longrope's and YaRN's
attention factors, partial rotary, the Gemma normalizer, the q/k norms, the biases,
SmolLM3's rope-less layers, OLMo's post-norms and whole-projection q/k norms, YaRN and the
per-layer-type ropes, each Granite multiplier) and prints how much the logits move: a
feature that moves nothing is not exercised by the case. The mixture-of-experts cases
(tools/gen_moe_reference.py) and Qwen3.5's (Gated DeltaNet layers: their float64 form is
tests/test_gated_delta_rule.cpp's and tests/test_gated_deltanet.cpp's) are not re-derived
here: they are listed as skipped.

This is the executable form of the per-family semantics a C++ port has to reproduce; the
comments name the transformers code each step follows (5.24; SmolLM3, OLMo 2, OLMo 3 and
Granite: 5.25).
"""
import argparse
import json
import math
import os
import sys

import h5py
import numpy as np
import torch
from safetensors.numpy import load_file

torch.set_num_threads(1)
RANK, ALPHA = 4, 8.0
NF4 = None


def nf4_codebook():
    """torchao's 16 NF4 values (float32)."""
    global NF4
    if NF4 is None:
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4
        NF4 = to_nf4(torch.randn(1024), 32, 32).nf4.float().numpy()
    return NF4


def dequant(g):
    """float32 NF4 group of init.h5 -> weight (docs/NF4.md)."""
    shape = tuple(int(x) for x in g.attrs["shape"])
    bs, sbs = int(g.attrs["block_size"]), int(g.attrs["scaler_block_size"])
    data = g["quantized_data"][()]
    codes = np.empty(data.size * 2, np.uint8)
    codes[0::2], codes[1::2] = data >> 4, data & 15
    qs = g["quantized_scalers"][()].astype(np.float32)
    qf = g["quantization_factor"][()].astype(np.float32)
    mean = np.float32(g["scaler_mean"][()][0])
    scale = (qs / np.repeat(qf, sbs)[:qs.size]).astype(np.float32) + mean
    w = nf4_codebook()[codes] * np.repeat(scale.astype(np.float32), bs)
    return torch.from_numpy(w.astype(np.float32).reshape(shape)).double()


class Case:
    def __init__(self, folder):
        self.folder = folder
        self.cfg = json.load(open(os.path.join(folder, "config.json")))
        st = load_file(os.path.join(folder, "model.safetensors"))
        self.w = {k: torch.from_numpy(v.astype(np.float32)).double() for k, v in st.items()}
        self.lora = {}
        with h5py.File(os.path.join(folder, "init.h5"), "r") as f:
            for name, obj in f["params"].items():
                if isinstance(obj, h5py.Group):
                    self.w[name] = dequant(obj)  # NF4 takes precedence over the file
                else:
                    self.lora[name] = torch.from_numpy(obj[()]).double()
        with h5py.File(os.path.join(folder, "data.h5"), "r") as f:
            self.ids = torch.from_numpy(f["input_ids"][()].astype(np.int64))
            self.labels = torch.from_numpy(f["labels"][()].astype(np.int64))
        with h5py.File(os.path.join(folder, "reference.h5"), "r") as f:
            self.ref_logits = torch.from_numpy(f["logits"][()]).double()
            self.ref_loss = float(f["loss"][()][0])


def rms(x, w, eps, gemma):
    # Llama/Qwen/Phi/Mistral: x * rsqrt(mean(x^2) + eps), cast back to the input dtype,
    # then * w (modeling_qwen2.py Qwen2RMSNorm.forward). Gemma: the same in float32, then
    # * (1 + w) in float32, then cast (modeling_gemma2.py Gemma2RMSNorm.forward). OLMo 2/3:
    # w * n in float32, then cast (Olmo2RMSNorm.forward): the same in float64.
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return n * (1.0 + w) if gemma else n * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Spec:
    """The per-family reading of config.json. off: names of features to switch off."""

    def __init__(self, cfg, S, off=()):
        self.c, self.off, self.S = cfg, set(off), S
        mt = cfg["model_type"]
        self.mt = mt
        self.gemma = mt in ("gemma2", "gemma3_text")
        # OLMo 2/3: no input norms; each sublayer's output normed before its residual add
        # (post_attention_layernorm, post_feedforward_layernorm), and q_norm / k_norm over
        # the whole q and k projections (nh * hd and nkv * hd wide), not per head
        self.olmo = mt in ("olmo2", "olmo3")
        H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        self.nh, self.nkv = nh, cfg.get("num_key_value_heads") or nh
        # phi3 and qwen2 have no head_dim field: hidden / heads
        self.hd = cfg.get("head_dim") or H // nh
        self.L = cfg["num_hidden_layers"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
        if self.gemma:
            self.scaling = cfg["query_pre_attn_scalar"] ** -0.5
        elif mt == "granite" and "attention_multiplier" not in self.off:
            # GraniteAttention.scaling = attention_multiplier (no head_dim ** -0.5)
            self.scaling = cfg["attention_multiplier"]
        else:
            self.scaling = self.hd ** -0.5
        # Granite (modeling_granite.py): inputs_embeds * embedding_multiplier; each sublayer's
        # output * residual_multiplier before its residual add; logits / logits_scaling
        gr = mt == "granite"
        self.embed_mult = cfg["embedding_multiplier"] if gr and "embedding_multiplier" \
            not in self.off else 1.0
        self.resid_mult = cfg["residual_multiplier"] if gr and "residual_multiplier" \
            not in self.off else 1.0
        self.logits_div = cfg["logits_scaling"] if gr and "logits_scaling" not in self.off \
            else 1.0
        self.attn_cap = cfg.get("attn_logit_softcapping") if mt == "gemma2" else None
        self.final_cap = cfg.get("final_logit_softcapping") if self.gemma else None
        if "attn_softcap" in self.off:
            self.attn_cap = None
        if "final_softcap" in self.off:
            self.final_cap = None
        self.window = [self.layer_window(i) for i in range(self.L)]
        self.rope = [self.layer_rope(i) for i in range(self.L)]
        self.rotary = [self.layer_rotates(i) for i in range(self.L)]

    def no_rope_layers(self):
        """SmolLM3's per-layer 1 (rotates q and k) / 0 (does not); the config's default:
        0 on every no_rope_layer_interval-th layer."""
        nr = self.c.get("no_rope_layers")
        if nr is None:
            n = self.c.get("no_rope_layer_interval", 4)
            nr = [int((j + 1) % n != 0) for j in range(self.L)]
        return nr

    def layer_rotates(self, i):
        # SmolLM3Attention.use_rope = no_rope_layers[i]
        if self.mt != "smollm3" or "no_rope" in self.off:
            return True
        return bool(self.no_rope_layers()[i])

    def layer_types(self):
        c, mt = self.c, self.mt
        if c.get("layer_types"):
            return c["layer_types"]
        if mt in ("qwen2", "qwen3"):
            sw = c.get("sliding_window") if c.get("use_sliding_window") else None
            return ["sliding_attention" if sw is not None and i >= c.get("max_window_layers", 28)
                    else "full_attention" for i in range(self.L)]
        if mt == "gemma2":
            return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(self.L)]
        if mt == "gemma3_text":
            p = c.get("sliding_window_pattern", 6)
            return ["sliding_attention" if (i + 1) % p else "full_attention" for i in range(self.L)]
        if mt == "smollm3":  # SmolLM3Config: sliding where rope-less, given a window
            sw = c.get("sliding_window") if c.get("use_sliding_window") else None
            return ["sliding_attention" if sw is not None and not r else "full_attention"
                    for r in self.no_rope_layers()]
        if mt == "olmo3":  # Olmo3Config: every 4th layer full
            return ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(self.L)]
        return None

    def layer_window(self, i):
        if "window" in self.off:
            return None
        c, mt = self.c, self.mt
        if mt in ("mistral", "phi3"):  # every layer, when set
            return c.get("sliding_window")
        if mt in ("qwen2", "qwen3", "gemma2", "gemma3_text"):
            sw = c.get("sliding_window")
            if mt in ("qwen2", "qwen3") and not c.get("use_sliding_window", False):
                sw = None
            return sw if self.layer_types()[i] == "sliding_attention" else None
        if mt == "smollm3":
            # SmolLM3Attention.sliding_window: sliding_window when use_sliding_window and the
            # layer's layer_types entry is sliding (eager's mask keys on layer_types alone;
            # the config derives those from use_sliding_window)
            sw = c.get("sliding_window") if c.get("use_sliding_window", False) else None
            return sw if self.layer_types()[i] == "sliding_attention" else None
        if mt == "olmo3":  # Olmo3Attention: sliding_window on the sliding layer_types
            return c.get("sliding_window") if self.layer_types()[i] == "sliding_attention" \
                else None
        return None  # llama, olmo2, granite

    def rope_params(self, i):
        rp = self.c.get("rope_parameters") or {}
        if self.mt in ("gemma3_text", "olmo3"):  # keyed by layer type
            # layer_ropes off: every layer takes the full layers' rope
            t = "full_attention" if "layer_ropes" in self.off else self.layer_types()[i]
            return rp[t]
        return rp

    def layer_rope(self, i):
        """-> (inv_freq float32 [rotary_dim/2], attention factor)"""
        rp = self.rope_params(i)
        rtype = rp.get("rope_type", "default")
        base = rp.get("rope_theta", 10000.0)
        prf = rp.get("partial_rotary_factor", self.c.get("partial_rotary_factor", 1.0))
        if "partial_rotary" in self.off and rtype != "longrope":  # factors fit rotary_dim
            prf = 1.0
        dim = int(self.hd * prf)
        expo = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        if rtype == "default" or (rtype == "yarn" and "yarn" in self.off):
            return 1.0 / (base ** expo), 1.0
        if rtype == "linear":  # modeling_rope_utils.py _compute_linear_scaling_rope_parameters
            inv = 1.0 / (base ** expo)
            return (inv if "linear_factor" in self.off else inv / rp["factor"]), 1.0
        if rtype == "longrope":  # _compute_longrope_parameters + longrope_frequency_update
            omp = rp["original_max_position_embeddings"]
            seq_len = self.S  # max(position_ids) + 1
            long = seq_len > omp
            if "longrope_choice" in self.off:
                long = not long
            ext = torch.tensor(rp["long_factor"] if long else rp["short_factor"],
                               dtype=torch.float32)
            inv = 1.0 / (ext * base ** expo)
            factor = rp.get("factor") or self.c["max_position_embeddings"] / omp
            af = rp.get("attention_factor")
            if af is None:
                af = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(omp))
            if "attention_factor" in self.off:
                af = 1.0
            return inv, af
        if rtype == "llama3":  # _compute_llama3_parameters
            inv = 1.0 / (base ** expo)
            f, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
            old = rp["original_max_position_embeddings"]
            wavelen = 2 * math.pi / inv
            out = torch.where(wavelen > old / lo, inv / f, inv)
            smooth = (old / wavelen - lo) / (hi - lo)
            smoothed = (1 - smooth) * out / f + smooth * out
            medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
            return torch.where(medium, smoothed, out), 1.0
        if rtype == "yarn":  # _compute_yarn_parameters (all float32 tensors as there)
            factor = rp.get("factor")
            omp = rp["original_max_position_embeddings"]
            if factor is None:
                factor = self.c["max_position_embeddings"] / omp
            af = rp.get("attention_factor")
            if af is None:  # yarn_get_mscale: 0.1 * mscale * ln(factor) + 1 (1 for factor <= 1)
                def mscale(f, m=1.0):
                    return 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1.0
                ms, msa = rp.get("mscale"), rp.get("mscale_all_dim")
                af = float(mscale(factor, ms) / mscale(factor, msa)) if ms and msa \
                    else mscale(factor)
            if "attention_factor" in self.off:
                af = 1.0
            beta_fast = rp.get("beta_fast") or 32
            beta_slow = rp.get("beta_slow") or 1

            def corr_dim(rotations):  # the dimension that turns `rotations` times over omp
                return dim * math.log(omp / (rotations * 2 * math.pi)) / (2 * math.log(base))
            lo, hi = corr_dim(beta_fast), corr_dim(beta_slow)
            # truncate is read from the config's top-level rope_parameters (for OLMo 3 the
            # dict keyed by layer type, so the default True)
            if (self.c.get("rope_parameters") or {}).get("truncate", True):
                lo, hi = math.floor(lo), math.ceil(hi)
            lo, hi = max(lo, 0), min(hi, dim - 1)
            if lo == hi:
                hi += 0.001
            ramp = ((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
            extrap = 1 - ramp            # 1: the pair keeps its frequency; 0: divided by factor
            pos_freqs = base ** expo
            inv = (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap
            return inv, af
        raise ValueError("rope_type %s not in this checker" % rtype)


def lin(case, name, x, off):
    y = x @ case.w[name + ".weight"].T
    if name + ".bias" in case.w and "bias" not in off:
        y = y + case.w[name + ".bias"]
    a = case.lora.get(name + ".lora_a.weight")
    if a is not None:
        y = y + (ALPHA / RANK) * ((x @ a.T) @ case.lora[name + ".lora_b.weight"].T)
    return y


def act(name, x):
    if name == "silu":
        return x * torch.sigmoid(x)
    if name in ("gelu_pytorch_tanh", "gelu_python_tanh"):
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    raise ValueError(name)


def forward(case, off=()):
    c = case.cfg
    N, S = case.ids.shape
    sp = Spec(c, S, off)
    E = case.w["model.embed_tokens.weight"]
    x = E[case.ids]
    if sp.gemma and "normalizer" not in off:
        # Gemma*TextScaledWordEmbedding: * sqrt(hidden) as a float32 tensor, cast to the
        # weight's dtype (float32 here; bfloat16 in a bfloat16 model)
        x = x * float(torch.tensor(c["hidden_size"] ** 0.5, dtype=torch.float32))
    x = x * sp.embed_mult                                        # Granite (else 1)
    pos = torch.arange(S, dtype=torch.float32)
    qi = torch.arange(S)[:, None]
    ki = torch.arange(S)[None, :]
    for i in range(sp.L):
        p = "model.layers.%d." % i
        if sp.olmo:  # no input norm: the attention reads the residual stream itself
            h = x
        else:
            h = rms(x, case.w[p + "input_layernorm.weight"], sp.eps, sp.gemma)
        if sp.mt == "phi3":
            qkv = lin(case, p + "self_attn.qkv_proj", h, off)
            nq, nk = sp.nh * sp.hd, sp.nkv * sp.hd
            q, k, v = qkv[..., :nq], qkv[..., nq:nq + nk], qkv[..., nq + nk:]
        else:
            q = lin(case, p + "self_attn.q_proj", h, off)
            k = lin(case, p + "self_attn.k_proj", h, off)
            v = lin(case, p + "self_attn.v_proj", h, off)
        if sp.olmo and "qk_norm" not in off:
            # OLMo: q_norm over all nh * hd of q_proj's output, k_norm over all nkv * hd of
            # k_proj's (Olmo2Attention.forward), before the heads are split and rotated.
            # qk_norm_per_head off: each head normed over its own hd, the same weights
            # (Qwen3's placement) -- shows that the width matters
            wq, wk = case.w[p + "self_attn.q_norm.weight"], case.w[p + "self_attn.k_norm.weight"]
            if "qk_norm_per_head" in off:
                q = rms(q.view(N, S, sp.nh, sp.hd), wq.view(sp.nh, sp.hd), sp.eps, False)
                k = rms(k.view(N, S, sp.nkv, sp.hd), wk.view(sp.nkv, sp.hd), sp.eps, False)
            else:
                q, k = rms(q, wq, sp.eps, False), rms(k, wk, sp.eps, False)
        q = q.view(N, S, sp.nh, sp.hd)
        k = k.view(N, S, sp.nkv, sp.hd)
        v = v.view(N, S, sp.nkv, sp.hd)
        if not sp.olmo and p + "self_attn.q_norm.weight" in case.w and "qk_norm" not in off:
            # per head over head_dim, before the rotary (qwen3: w * x; gemma3: (1 + w) * x)
            q = rms(q, case.w[p + "self_attn.q_norm.weight"], sp.eps, sp.gemma)
            k = rms(k, case.w[p + "self_attn.k_norm.weight"], sp.eps, sp.gemma)
        inv, af = sp.rope[i]
        freqs = pos[:, None] * inv[None, :]                      # float32
        emb = torch.cat((freqs, freqs), -1)
        cos = (emb.cos() * af).double()[None, :, None, :]       # * attention factor, float32
        sin = (emb.sin() * af).double()[None, :, None, :]
        rd = emb.shape[-1]                                       # rotary dims: the first rd
        if sp.rotary[i]:                                         # SmolLM3: not on no_rope layers
            q = torch.cat((q[..., :rd] * cos + rotate_half(q[..., :rd]) * sin, q[..., rd:]), -1)
            k = torch.cat((k[..., :rd] * cos + rotate_half(k[..., :rd]) * sin, k[..., rd:]), -1)
        rep = sp.nh // sp.nkv                                    # query head j: kv head j // rep
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        s = torch.einsum("nqhd,nkhd->nhqk", q, k) * sp.scaling
        if sp.attn_cap is not None:
            s = sp.attn_cap * torch.tanh(s / sp.attn_cap)
        W = sp.window[i]
        visible = (ki <= qi) if W is None else ((ki <= qi) & (ki > qi - W))
        s = s.masked_fill(~visible, float("-inf"))
        a = torch.softmax(s, -1)
        o = torch.einsum("nhqk,nkhd->nqhd", a, v).reshape(N, S, sp.nh * sp.hd)
        o = lin(case, p + "self_attn.o_proj", o, off)
        if sp.gemma:
            o = rms(o, case.w[p + "post_attention_layernorm.weight"], sp.eps, True)
            x = x + o
            h = rms(x, case.w[p + "pre_feedforward_layernorm.weight"], sp.eps, True)
        elif sp.olmo:  # x + post_attention_layernorm(attn(x)); the MLP reads x unnormed
            if "post_norm" not in off:
                o = rms(o, case.w[p + "post_attention_layernorm.weight"], sp.eps, False)
            x = x + o
            h = x
        else:
            x = x + o * sp.resid_mult                            # Granite (else 1)
            h = rms(x, case.w[p + "post_attention_layernorm.weight"], sp.eps, False)
        if sp.mt == "phi3":
            gu = lin(case, p + "mlp.gate_up_proj", h, off)
            I = gu.shape[-1] // 2
            m = act(sp.act, gu[..., :I]) * gu[..., I:]           # chunk(2): gate first
        else:
            m = act(sp.act, lin(case, p + "mlp.gate_proj", h, off)) * \
                lin(case, p + "mlp.up_proj", h, off)
        m = lin(case, p + "mlp.down_proj", m, off)
        if sp.gemma:
            m = rms(m, case.w[p + "post_feedforward_layernorm.weight"], sp.eps, True)
        elif sp.olmo and "post_norm" not in off:
            m = rms(m, case.w[p + "post_feedforward_layernorm.weight"], sp.eps, False)
        x = x + m * sp.resid_mult                                # Granite (else 1)
    x = rms(x, case.w["model.norm.weight"], sp.eps, sp.gemma)
    head = case.w.get("lm_head.weight", E)  # tied: the embedding (never the normalizer)
    logits = x @ head.T / sp.logits_div                          # Granite (else 1)
    if sp.final_cap is not None:
        logits = sp.final_cap * torch.tanh(logits / sp.final_cap)
    # loss: labels shifted left, -100 ignored, mean over the scored tokens
    lab = torch.cat((case.labels[:, 1:], torch.full((N, 1), -100)), 1)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             lab.reshape(-1), ignore_index=-100)
    return logits, float(loss)


FEATURES = ["window", "attn_softcap", "final_softcap", "longrope_choice", "attention_factor",
            "partial_rotary", "normalizer", "qk_norm", "bias", "linear_factor",
            # SmolLM3: every layer rotates; OLMo: no post-norms, q/k norms per head; OLMo 3:
            # plain rope on the full layers, the full layers' rope on every layer; Granite
            "no_rope", "post_norm", "qk_norm_per_head", "yarn", "layer_ropes",
            "embedding_multiplier", "residual_multiplier", "attention_multiplier",
            "logits_scaling"]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--effects", action="store_true")
    args = ap.parse_args()
    ok = True
    for folder in args.cases:
        name = os.path.basename(folder.rstrip("/"))
        cfg = json.load(open(os.path.join(folder, "config.json")))
        if cfg.get("num_experts") or cfg.get("num_local_experts"):
            print("%-16s skip  (%s: experts, not re-derived here)" % (name, cfg["model_type"]))
            continue
        if "linear_attention" in (cfg.get("layer_types") or []):
            print("%-16s skip  (%s: Gated DeltaNet layers, not re-derived here; the float64 "
                  "form is in tests/test_gated_delta_rule.cpp)" % (name, cfg["model_type"]))
            continue
        case = Case(folder)
        logits, loss = forward(case)
        diff = float((logits - case.ref_logits).abs().max())
        rel = diff / float(case.ref_logits.abs().max())
        good = rel <= 1e-4 and abs(loss - case.ref_loss) <= 1e-4 * abs(case.ref_loss)
        ok &= good
        print("%-16s %s  logits rel %.2e (abs %.2e)  loss %.6f vs %.6f" % (
            name, "ok  " if good else "FAIL", rel, diff, loss, case.ref_loss))
        if args.effects:
            for feat in FEATURES:
                lg, _ = forward(case, off=[feat])
                d = float((lg - logits).abs().max() / logits.abs().max())
                if d > 0:
                    print("    without %-20s logits move %.2e (relative)" % (feat, d))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
