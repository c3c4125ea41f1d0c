#!/usr/bin/env python3
"""kqlora-export --gguf for every family llama.cpp can run (ctest gguf_families):

    python3 tests/check_gguf_families.py KQLORA_TRAIN KQLORA_EXPORT WORKDIR [FAMILY ...]

For each case, a tiny random model of the family (tools/make_hf_model.py, its "tiny"
preset with the fields llama.cpp can express: docs/GGUF.md, "Families"; Gemma 4's built here
by transformers, gemma4_model) is trained for 4
AdamW steps by kqlora-train (LoRA on every projection, eval after the last step) and
exported with --merged and --gguf (f32, bf16, q8_0). Then:
  - transformers' GGUF loader, given --merged's config.json (it drops fields), gives
    kqlora's eval loss: f32 rtol 1e-4, bf16 1e-2, q8_0 2% (not for the architectures it
    does not read as trained: NO_HF_GGUF, checked by llama.cpp alone);
  - the GGUF's hyperparameter keys equal config.json's (read back with the gguf package;
    Granite's multipliers, YaRN's factor and original context, OLMo 3's window and layer
    pattern, the Gated DeltaNet sizes, layer pattern and mrope sections of Qwen3.5,
    Qwen3.5-MoE and Qwen3-Next, Gemma 4's per-type head sizes and ropes, kv heads and MLP
    widths a layer and rope_freqs too);
  - where llama-cpp-python can be imported (tools/install_llama_cpp.sh puts it into
    .venv-tools, which this script then re-runs itself under): llama.cpp's logits for
    every position of each eval row match transformers' on --merged (float32 KV cache,
    one thread): the argmax agrees wherever transformers' top-2 margin exceeds 1e-3, and
    the max abs difference is printed and bounded (5e-3 of the logits' range);
  - settings llama.cpp cannot express are refused with exit 2 naming the config.json
    field (the family reference cases' query_pre_attn_scalar, windows, longrope, ...;
    REFUSED_TINY: tiny models with one such setting each).
Exit 77 (ctest: skipped) when torch, transformers, gguf or h5py cannot be imported.
"""
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv-tools", "bin", "python")


def have(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


# llama.cpp through the tools venv when this interpreter lacks it.
if not have("llama_cpp") and os.path.exists(VENV_PY) and \
        os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv-tools")) and \
        subprocess.run([VENV_PY, "-c", "import llama_cpp, torch, transformers, gguf, h5py"],
                       capture_output=True).returncode == 0:
    os.execv(VENV_PY, [VENV_PY] + sys.argv)

try:
    import h5py
    import numpy as np
    import torch
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoModelForCausalLM
except ImportError as e:  # the suite must not need them
    print("SKIPPED: %s (pip install torch transformers gguf h5py to run this test)" % e)
    sys.exit(77)
from tool_in_process import make_hf_model  # noqa: E402

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
               "rope_theta": 10000.0}
# family, --config over the tiny preset: what llama.cpp expresses, every feature it has.
CASES = {
    "llama": ("llama", {"rope_parameters": LLAMA3_ROPE, "attention_bias": True}),
    # rows of 48: not whole Q8_0 blocks, so q8_0 writes those matrices as F16
    "llama_rows48": ("llama", {"hidden_size": 48}),
    # (a window of max_position_embeddings hides nothing: exported as full attention)
    "mistral": ("mistral", {"sliding_window": 256, "rope_theta": 20000.0}),
    "qwen2": ("qwen2", {"use_sliding_window": False, "tie_word_embeddings": True}),
    "qwen3": ("qwen3", {"attention_bias": False, "rope_parameters": {
        "rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}),
    "gemma2": ("gemma2", {"query_pre_attn_scalar": 16, "sliding_window": 21,
                          "tie_word_embeddings": True}),
    "gemma3_text": ("gemma3_text", {"query_pre_attn_scalar": 16, "sliding_window": 21,
                                    "tie_word_embeddings": False}),
    "phi3": ("phi3", {"sliding_window": None, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0}, "partial_rotary_factor": 0.5}),
    # experts on every layer (llama.cpp has no dense layer there), the routing each renormalises
    # or not as llama.cpp does; qwen2moe's shared expert
    "qwen3_moe": ("qwen3_moe", {"mlp_only_layers": [], "norm_topk_prob": True}),
    "qwen2_moe": ("qwen2_moe", {"mlp_only_layers": [], "norm_topk_prob": False}),
    # Mixtral as llama with experts (always renormalised, no window); OLMoE's whole-
    # projection q/k norms, as many kv heads as heads, no clip_qkv, no biases
    "mixtral": ("mixtral", {"sliding_window": None}),
    "olmoe": ("olmoe", {"clip_qkv": None, "attention_bias": False, "num_key_value_heads": 4,
                        "norm_topk_prob": False}),
    # SmolLM3: llama.cpp's rope-less layers (every fourth), no windows, no o or MLP biases
    # (so none: attention_bias gives q, k, v and o theirs), YaRN
    "smollm3": ("smollm3", {"no_rope_layers": [1, 1, 1, 0], "use_sliding_window": False,
                            "attention_bias": False, "mlp_bias": False,
                            "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 64,
                                                "rope_theta": 10000.0}}),
    # OLMo 2: post-norm blocks, whole-projection q/k norms (GQA), no biases, linear rope
    "olmo2": ("olmo2", {"attention_bias": False, "rope_parameters": {
        "rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}),
    # OLMo 3: windows on the layers layer_types names (not llama.cpp's default of all but
    # every fourth), the full layers' YaRN with an attention factor of its own
    "olmo3": ("olmo3", {"attention_bias": False, "sliding_window": 21,
                        "rope_parameters": {
                            "full_attention": {"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 64,
                                               "attention_factor": 1.3,
                                               "rope_theta": 10000.0},
                            "sliding_attention": {"rope_type": "default",
                                                  "rope_theta": 10000.0}}}),
    # Granite: the four multipliers, q/k/v/o and MLP biases, llama3 rope (rope_freqs), a tied
    # head (as Granite 3.3's)
    "granite": ("granite", {"rope_parameters": LLAMA3_ROPE, "tie_word_embeddings": True}),
    # Qwen3.5: Gated DeltaNet layers (2 key heads read by 4 value heads: the value heads
    # reordered as llama.cpp's) around one gated attention layer, a pattern no
    # full_attention_interval gives (attention.recurrent_layers), partial rotary 0.5 with
    # mrope sections llama.cpp rotates text by, zero-centred norms; no biases
    "qwen3_5_text": ("qwen3_5_text", {"attention_bias": False, "layer_types": [
        "linear_attention", "full_attention", "linear_attention", "linear_attention"]}),
    # the same as the hub ships Qwen3.5: a multimodal qwen3_5 directory (MULTIMODAL below)
    "qwen3_5": ("qwen3_5_text", {"attention_bias": False, "layer_types": [
        "linear_attention", "full_attention", "linear_attention", "linear_attention"]}),
    # Qwen3.5-MoE: qwen3_5_text's layers (value heads reordered, recurrent_layers, mrope),
    # every MLP 8 experts (top 2, renormalised) beside a shared expert and its gate
    "qwen3_5_moe_text": ("qwen3_5_moe_text", {"attention_bias": False, "layer_types": [
        "linear_attention", "full_attention", "linear_attention", "linear_attention"]}),
    # the same as the hub ships Qwen3.5-MoE: a multimodal qwen3_5_moe directory (its experts
    # in transformers 5's fused layout, as save_pretrained writes them)
    "qwen3_5_moe": ("qwen3_5_moe_text", {"attention_bias": False, "layer_types": [
        "linear_attention", "full_attention", "linear_attention", "linear_attention"]}),
    # Qwen3-Next: the fused in_proj_qkvz split into attn_qkv and attn_gate, in_proj_ba as
    # ssm_ba, 2 key heads read by 4 value heads in their grouped order; every other layer
    # full attention (full_attention_interval 2); experts on every layer (llama.cpp has no
    # dense one there), renormalised, beside a shared expert
    "qwen3_next": ("qwen3_next", {"attention_bias": False, "mlp_only_layers": [],
                                  "norm_topk_prob": True}),
    # Gemma 4 (GEMMA4_TINY, built here: make_hf_model.py has no gemma4_text): sliding layers
    # of heads 16 (2 kv heads) and full ones of heads 32 and 1 kv head whose v is k_proj's
    # raw output (attention_k_eq_v: no attn_v), proportional rope with a factor on the full
    # layers (rope_freqs), w * n norms, layer_scalar, a final soft-cap, an untied head; the
    # last 2 layers attending over layers 1 and 2's keys and values (llama.cpp's reuse: the
    # last unshared layer full, the one before it sliding) with double-wide MLPs
    "gemma4_text": ("gemma4_text", {
        "tie_word_embeddings": False, "num_hidden_layers": 5, "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                        "sliding_attention", "full_attention"]}),
    # Gemma 4 as the hub ships it: a multimodal gemma4 directory (a vision tower beside), with
    # per-layer inputs of 8 a layer (as E2B's, per_layer_token_embd, ...), tied, without a
    # soft-cap (llama.cpp's default of 30 is written as 0)
    "gemma4": ("gemma4_text", {"final_logit_softcapping": None,
                               "hidden_size_per_layer_input": 8,
                               "vocab_size_per_layer_input": 96}),
}
# Gemma 4's tiny model (tools/gen_llama_reference.py's gemma4_text case, smaller; the cases
# add key/value sharing and per-layer inputs); the last layer full, as transformers forces.
# (transformers warns of the proportional rope's "factor" as an unrecognised key, and
# divides its frequencies by it: kqlora does the same)
GEMMA4_TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
                   hidden_size_per_layer_input=0, num_kv_shared_layers=0, sliding_window=21,
                   final_logit_softcapping=5.0, max_position_embeddings=256,
                   initializer_range=0.08,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                "full_attention"],
                   rope_parameters={"sliding_attention": {"rope_type": "default",
                                                          "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "proportional",
                                                       "partial_rotary_factor": 0.5,
                                                       "factor": 2.0,
                                                       "rope_theta": 1000000.0}})
# Cases trained from their tiny model rewritten as a multimodal directory
# (check_llama_export.py's multimodal_directory: the decoder under model.language_model.,
# a vision tower beside it); their GGUF is the text decoder's.
MULTIMODAL = {"qwen3_5", "qwen3_5_moe", "gemma4"}
# Families transformers' GGUF loader does not read as trained (Mixtral's file is llama's
# architecture, which it loads without experts; no olmoe; its gemma4 maps no tensor to
# layer_scalar, which it leaves at 1): llama.cpp checks their numbers.
NO_HF_GGUF = {"mixtral", "olmoe", "smollm3", "olmo2", "olmo3", "granite", "qwen3_5_text",
              "qwen3_5", "qwen3_5_moe_text", "qwen3_next", "gemma4_text"}
# Qwen3.5's hybrid layers (Gated DeltaNet's ssm.* keys and the layer pattern)
HYBRID = {"qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"}
# Reference cases (tests/data/family_reference) llama.cpp cannot run as trained, and the
# config.json field each refusal names.
REFUSED = {"gemma2": "attention_bias", "gemma3_text": "query_pre_attn_scalar",
           "qwen2": "layer_types", "qwen3": "attention_bias", "phi3": "sliding_window",
           "phi3_long": "rope_parameters", "mistral_window": "sliding_window",
           "qwen3_moe": "mlp_only_layers", "qwen3_moe_raw": "norm_topk_prob",
           "qwen2_moe": "mlp_only_layers", "gpt_oss": "model_type", "olmoe": "clip_qkv",
           "mixtral": "sliding_window", "smollm3": "no_rope_layers", "olmo2": "attention_bias",
           # (its Gated DeltaNet heads: keys of 16, values of 4; llama.cpp sizes both by one)
           "qwen3_5_text": "linear_value_head_dim", "qwen3_5_moe": "linear_value_head_dim",
           # (dense layers 0 and 2: llama.cpp's qwen3next reads experts for every layer)
           "qwen3_next": "decoder_sparse_step",
           # (layers 3 and 4 attend over layers 2 and 1: llama.cpp's gemma4 reuses 1 and 2)
           "gemma4_kv_shared": "num_kv_shared_layers"}
# Tiny models (family, --config over the tiny preset) with a setting llama.cpp cannot express,
# each alone, and the field each refusal names.
_SMOLLM3 = {"no_rope_layers": [1, 1, 1, 0], "use_sliding_window": False, "attention_bias": False,
            "mlp_bias": False}
REFUSED_TINY = {
    # llama.cpp's smollm3 applies no window, has no o or MLP biases, no per-frequency rope
    "smollm3_window": ("smollm3", dict(_SMOLLM3, use_sliding_window=True, sliding_window=21),
                       "layer_types"),
    "smollm3_o_bias": ("smollm3", dict(_SMOLLM3, attention_bias=True), "attention_bias"),
    "smollm3_mlp_bias": ("smollm3", dict(_SMOLLM3, mlp_bias=True), "mlp_bias"),
    "smollm3_llama3": ("smollm3", dict(_SMOLLM3, rope_parameters=LLAMA3_ROPE), "rope_parameters"),
    # llama.cpp's olmo2 reads its own output.weight, sizes q by hidden_size, rotates the
    # sliding layers unscaled by the full layers' base, and has its own YaRN betas
    "olmo2_tied": ("olmo2", {"attention_bias": False, "tie_word_embeddings": True},
                   "tie_word_embeddings"),
    "olmo2_head_dim": ("olmo2", {"attention_bias": False, "head_dim": 8}, "head_dim"),
    "olmo3_sliding_theta": ("olmo3", {"attention_bias": False, "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}},
        "rope_parameters"),
    "olmo3_sliding_scaled": ("olmo3", {"attention_bias": False, "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}},
        "rope_parameters"),
    "olmo3_yarn_beta": ("olmo3", {"attention_bias": False, "rope_parameters": {
        "full_attention": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 2.0,
                           "original_max_position_embeddings": 64, "rope_theta": 10000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
        "rope_parameters"),
    # llama.cpp's converter drops Granite's head_dim (llama.cpp takes hidden / heads)
    "granite_head_dim": ("granite", {"head_dim": 8}, "head_dim"),
    # llama.cpp's qwen3next always renormalises the top k
    "qwen3_next_raw_topk": ("qwen3_next", {"attention_bias": False, "mlp_only_layers": [],
                                           "norm_topk_prob": False}, "norm_topk_prob"),
    # llama.cpp's gemma4 has no attention biases, rotates its sliding layers unscaled over the
    # whole head (proportional rope there has no tensor), and aborts without a sliding layer
    "gemma4_bias": ("gemma4_text", {"attention_bias": True}, "attention_bias"),
    "gemma4_sliding_rope": ("gemma4_text", {"rope_parameters": dict(
        GEMMA4_TINY["rope_parameters"], sliding_attention={
            "rope_type": "proportional", "partial_rotary_factor": 0.5,
            "rope_theta": 10000.0})}, "rope_parameters"),
    "gemma4_all_full": ("gemma4_text", {"layer_types": ["full_attention"] * 4}, "layer_types"),
    # (llama.cpp's gemma4 sizes the per-layer input table by vocab_size: a larger table is
    # refused; a smaller one kqlora-train refuses itself, as a token would have no row)
    "gemma4_ple_vocab": ("gemma4_text", {"hidden_size_per_layer_input": 8,
                                         "vocab_size_per_layer_input": 200},
                         "vocab_size_per_layer_input"),
}
ROWS, T = 3, 64


def run(*cmd, ok=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if ok and p.returncode != 0:
        raise SystemExit("command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stdout))
    return p


def train(train_bin, model_dir, data, work, steps):
    deck = os.path.join(work, "deck.in")
    with open(deck, "w") as f:
        f.write("model = causal_lm\n")
    run(train_bin, deck, "hf_model_dir=" + model_dir, "data_file=" + data,
        "eval_file=" + data, "eval_every=%d" % steps, "num_steps=%d" % steps, "global_bs=3",
        "lora_rank=4", "lora_alpha=8", "block_size=32", "scaler_block_size=32",
        "optimizer=adamw", "lr=2e-2", "save_dir=" + os.path.join(work, "ckpt"),
        "metrics_file=" + os.path.join(work, "metrics.jsonl"))
    return [json.loads(l)["eval_loss"] for l in open(os.path.join(work, "metrics.jsonl"))
            if "eval_loss" in l][-1]


def llama_cpp_logits(path, ids):
    """llama.cpp's logits at every position of `ids` (one sequence), float32 KV cache."""
    import llama_cpp
    llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_batch=256, n_threads=1,
                          logits_all=True, verbose=False,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    llm.reset()
    llm.eval(list(int(t) for t in ids))
    out = np.array(llm.scores[:len(ids)], dtype=np.float64)
    llm.close()
    return out


def gemma4_model(out, over):
    """A tiny random Gemma 4 text decoder (GEMMA4_TINY with `over`), saved by transformers:
    projections normal(0, initializer_range), norm weights 1 + 0.2 randn (w * n), each
    layer_scalar in [0.5, 1.5]."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    torch.manual_seed(11)
    model = Gemma4ForCausalLM(Gemma4TextConfig(**dict(GEMMA4_TINY, **over))).float()
    g = torch.Generator().manual_seed(13)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    model.save_pretrained(out)


def check_case(name, family, over, train_bin, export_bin, work, checks):
    work = os.path.join(work, name)
    os.makedirs(work)
    model = os.path.join(work, "model")
    if family == "gemma4_text":
        gemma4_model(model, over)
    else:
        make_hf_model(model, "--family", family, "--preset", "tiny", "--config",
                      json.dumps(over), "--dtype", "f32")
    cfg = json.load(open(os.path.join(model, "config.json")))
    if name in MULTIMODAL:
        from check_llama_export import multimodal_directory
        model = multimodal_directory(model, os.path.join(work, "model_multimodal"))
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, cfg["vocab_size"], (ROWS, T), generator=g)
    labels = ids.clone()
    labels[:, :5] = -100
    data = os.path.join(work, "data.h5")
    with h5py.File(data, "w", libver=("v110", "v110")) as f:
        f["input_ids"] = ids.numpy().astype("int32")
        f["labels"] = labels.numpy().astype("int32")
    want = train(train_bin, model, data, work, 4)
    ckpt = os.path.join(work, "ckpt")
    run(export_bin, ckpt, "--merged", os.path.join(work, "merged"))
    merged_cfg = AutoConfig.from_pretrained(os.path.join(work, "merged"))
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(work, "merged"),
                                                  dtype=torch.float32,
                                                  attn_implementation="eager").eval()
    with torch.no_grad():  # (its logits are llama.cpp's reference below)
        out = merged(input_ids=ids, labels=labels)
    got_merged, ref = out.loss.item(), out.logits.double().numpy()
    checks.append(("%s: --merged loss %.7f vs kqlora's %.7f" % (name, got_merged, want),
                   abs(got_merged - want) <= 1e-4 * abs(want)))
    for gtype, tol in (("f32", 1e-4), ("bf16", 1e-2), ("q8_0", 2e-2)):
        gname = "model-%s.gguf" % gtype
        out = run(export_bin, ckpt, "--gguf", os.path.join(work, gname), "--gguf-type",
                  gtype).stdout
        print(out.strip())
        if gtype == "q8_0" and name == "llama_rows48":
            kinds = {t.name: t.tensor_type.name for t in GGUFReader(
                os.path.join(work, gname)).tensors}
            checks.append(("%s: q8_0 file: rows of 48 as F16, of 96 as Q8_0 (%s, %s)"
                           % (name, kinds["blk.0.attn_q.weight"], kinds["blk.0.ffn_down.weight"]),
                           kinds["blk.0.attn_q.weight"] == "F16" and
                           kinds["blk.0.ffn_down.weight"] == "Q8_0" and "as f16" in out))
        if family in NO_HF_GGUF:
            print("%s: transformers' GGUF loader does not read %s as trained: llama.cpp "
                  "checks it" % (name, family))
            continue
        # (transformers' loader knows mistral by no gguf architecture: the file's llama.*
        # keys alone configure it, the same numbers without a window)
        extra = {} if family == "mistral" else {"config": merged_cfg}
        m = AutoModelForCausalLM.from_pretrained(work, gguf_file=gname, dtype=torch.float32,
                                                 attn_implementation="eager", **extra).eval()
        with torch.no_grad():
            got = m(input_ids=ids, labels=labels).loss.item()
        checks.append(("%s: --gguf-type %s in transformers: loss %.7f vs kqlora's %.7f"
                       % (name, gtype, got, want), abs(got - want) <= tol * abs(want)))
    # The hyperparameters llama.cpp reads (transformers took them from config=).
    fields = GGUFReader(os.path.join(work, "model-f32.gguf")).fields
    arch = fields["general.architecture"].contents()
    expect_arch = {"mistral": "llama", "gemma3_text": "gemma3", "qwen3_moe": "qwen3moe",
                   "qwen2_moe": "qwen2moe", "mixtral": "llama",
                   "olmo3": "olmo2", "qwen3_5_text": "qwen35",
                   "qwen3_5_moe_text": "qwen35moe", "qwen3_next": "qwen3next",
                   "gemma4_text": "gemma4"}.get(family, family)
    checks.append(("%s: general.architecture %r" % (name, arch), arch == expect_arch))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    partial = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    # (Qwen3.5-MoE has no dense MLP: the shared expert's width stands in)
    meta = {"block_count": cfg["num_hidden_layers"], "embedding_length": cfg["hidden_size"],
            "feed_forward_length": cfg["shared_expert_intermediate_size"]
            if family == "qwen3_5_moe_text" else cfg["intermediate_size"],
            "attention.head_count": cfg["num_attention_heads"],
            "attention.head_count_kv": cfg["num_key_value_heads"],
            "attention.key_length": head_dim, "context_length": cfg["max_position_embeddings"],
            "attention.layer_norm_rms_epsilon": cfg["rms_norm_eps"],
            "rope.dimension_count": int(head_dim * partial)}
    experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    if family == "gemma4_text":
        check_gemma4_keys(name, cfg, fields, work, meta, checks)
    if family == "granite":  # (the multipliers under llama.cpp's names)
        meta.update({"attention.scale": cfg["attention_multiplier"],
                     "embedding_scale": cfg["embedding_multiplier"],
                     "residual_scale": cfg["residual_multiplier"],
                     "logit_scale": cfg["logits_scaling"]})
    if rope.get("rope_type") == "yarn":
        meta.update({"rope.scaling.factor": rope["factor"],
                     "rope.scaling.original_context_length":
                         rope["original_max_position_embeddings"]})
        checks.append(("%s: rope.scaling.type yarn" % name,
                       fields[arch + ".rope.scaling.type"].contents() == "yarn"))
    if family == "olmo3":  # the windows, on the layers layer_types names
        meta["attention.sliding_window"] = cfg["sliding_window"]
        pattern = fields[arch + ".attention.sliding_window_pattern"].contents()
        want_pattern = [t == "sliding_attention" for t in cfg["layer_types"]]
        checks.append(("%s: attention.sliding_window_pattern %s (layer_types %s)"
                       % (name, pattern, cfg["layer_types"]), pattern == want_pattern))
    if family in HYBRID:  # the Gated DeltaNet sizes, the layer pattern, mrope
        meta.update({"ssm.conv_kernel": cfg["linear_conv_kernel_dim"],
                     "ssm.state_size": cfg["linear_key_head_dim"],
                     "ssm.group_count": cfg["linear_num_key_heads"],
                     "ssm.time_step_rank": cfg["linear_num_value_heads"],
                     "ssm.inner_size": cfg["linear_num_value_heads"] *
                     cfg["linear_value_head_dim"]})
        linear = [t == "linear_attention" for t in cfg["layer_types"]]
        every = [n for n in range(1, len(linear) + 2)
                 if linear == [(l + 1) % n != 0 for l in range(len(linear))]]
        if every:  # (every n-th layer full attention: the interval, as the converter)
            got = fields[arch + ".full_attention_interval"].contents()
            checks.append(("%s: full_attention_interval %s (layer_types %s)"
                           % (name, got, cfg["layer_types"]), got == every[0]))
        else:
            got = fields[arch + ".attention.recurrent_layers"].contents()
            checks.append(("%s: attention.recurrent_layers %s (layer_types %s)"
                           % (name, got, cfg["layer_types"]), got == linear))
        if family == "qwen3_next":  # (NEOX rope, no mrope)
            checks.append(("%s: no rope.dimension_sections" % name,
                           arch + ".rope.dimension_sections" not in fields))
        else:
            got = fields[arch + ".rope.dimension_sections"].contents()
            checks.append(("%s: rope.dimension_sections %s (mrope_section %s)"
                           % (name, got, rope["mrope_section"]),
                           got == rope["mrope_section"] + [0]))
    if experts:
        meta.update({"expert_count": experts,
                     "expert_used_count": cfg["num_experts_per_tok"],
                     "expert_feed_forward_length": cfg.get("moe_intermediate_size") or
                     cfg["intermediate_size"]})
        if "shared_expert_intermediate_size" in cfg:
            meta["expert_shared_feed_forward_length"] = cfg["shared_expert_intermediate_size"]
    for k, v in meta.items():
        got = fields[arch + "." + k].contents()
        checks.append(("%s: %s.%s = %r (config.json %r)" % (name, arch, k, got, v),
                       abs(got - v) <= 1e-6 * abs(v)))
    checks.append(("%s: general.name %r" % (name, fields["general.name"].contents()),
                   "kqlora-lora-step-4" in fields["general.name"].contents()))

    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("%s: llama.cpp check skipped (no llama_cpp: bash tools/install_llama_cpp.sh)"
              % name)
        return
    worst, disagree, total = 0.0, 0, 0
    for r in range(ROWS):
        lc = llama_cpp_logits(os.path.join(work, "model-f32.gguf"), ids[r].tolist())
        hf = ref[r]
        worst = max(worst, float(np.abs(lc - hf).max()))
        top2 = np.sort(hf, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 1e-3
        disagree += int(((lc.argmax(1) != hf.argmax(1)) & clear).sum())
        total += int(clear.sum())
    span = float(ref.max() - ref.min())
    checks.append(("%s: llama.cpp logits vs transformers on --merged: max abs diff %.2e "
                   "(logits span %.2f), argmax differs at %d of %d clear positions"
                   % (name, worst, span, disagree, total),
                   disagree == 0 and worst <= 5e-3 * span))


def check_gemma4_keys(name, cfg, fields, work, meta, checks):
    """Gemma 4's keys (into `meta`, checked by the caller, or checked here): the full layers'
    head size, rope base and dims as the main keys, the sliding layers' as *_swa, the kv
    heads a layer, the window and its layers, the soft-cap (0: none), and rope_freqs (the
    full layers' frequency divisors: the factor where rotated, 1e30 where not)."""
    sliding = [t == "sliding_attention" for t in cfg["layer_types"]]
    per = cfg.get("per_layer_config") or {}
    full_head = [per[str(l)]["head_dim"] for l in range(len(sliding))
                 if not sliding[l] and str(l) in per][0]
    kv = [per.get(str(l), {}).get("num_key_value_heads", cfg["num_key_value_heads"])
          for l in range(len(sliding))]
    ropes = cfg["rope_parameters"]
    full, swa = ropes["full_attention"], ropes["sliding_attention"]
    del meta["attention.head_count_kv"], meta["feed_forward_length"]
    shared = cfg.get("num_kv_shared_layers") or 0
    widths = [cfg["intermediate_size"] * (2 if cfg.get("use_double_wide_mlp") and
                                          l >= len(sliding) - shared else 1)
              for l in range(len(sliding))]
    got = fields["gemma4.feed_forward_length"].contents()
    checks.append(("%s: feed_forward_length %s (use_double_wide_mlp %s)"
                   % (name, got, cfg.get("use_double_wide_mlp")),
                   (list(got) if isinstance(got, list) else [got] * len(widths)) == widths))
    meta["attention.shared_kv_layers"] = shared
    meta["embedding_length_per_layer_input"] = cfg.get("hidden_size_per_layer_input") or 0
    meta.update({"attention.key_length": full_head, "attention.value_length": full_head,
                 "rope.dimension_count": full_head, "rope.freq_base": full["rope_theta"],
                 "attention.key_length_swa": cfg["head_dim"],
                 "attention.value_length_swa": cfg["head_dim"],
                 "rope.dimension_count_swa": cfg["head_dim"],
                 "rope.freq_base_swa": swa["rope_theta"],
                 "attention.sliding_window": cfg["sliding_window"]})
    got = list(fields["gemma4.attention.head_count_kv"].contents())
    checks.append(("%s: attention.head_count_kv %s (per_layer_config %s)" % (name, got, kv),
                   got == kv))
    got = fields["gemma4.attention.sliding_window_pattern"].contents()
    checks.append(("%s: attention.sliding_window_pattern %s (layer_types %s)"
                   % (name, got, cfg["layer_types"]), got == sliding))
    cap = fields["gemma4.final_logit_softcapping"].contents()
    checks.append(("%s: final_logit_softcapping %s (config.json %s)"
                   % (name, cap, cfg["final_logit_softcapping"]),
                   abs(cap - (cfg["final_logit_softcapping"] or 0)) <= 1e-6))
    rotated = int(full["partial_rotary_factor"] * full_head / 2)
    want = [full.get("factor", 1.0)] * rotated + [1e30] * (full_head // 2 - rotated)
    got = [float(t.data[i]) for t in GGUFReader(os.path.join(work, "model-f32.gguf")).tensors
           if t.name == "rope_freqs.weight" for i in range(len(t.data))]
    checks.append(("%s: rope_freqs.weight %s (proportional, %d of %d pairs rotated, factor %s)"
                   % (name, got, rotated, full_head // 2, full.get("factor", 1.0)),
                   np.allclose(got, want, rtol=1e-6)))


def check_refusal(case, field, train_bin, export_bin, work, checks, tiny=None):
    """The reference case `case` (or, tiny = (family, config), a tiny model of the family)
    trained a step: --gguf exits 2 naming config.json's `field`, and writes nothing."""
    w = os.path.join(work, "refused_" + case)
    os.makedirs(w)
    if tiny:
        src = os.path.join(w, "model")
        if tiny[0] == "gemma4_text":
            gemma4_model(src, tiny[1])
        else:
            make_hf_model(src, "--family", tiny[0], "--preset", "tiny", "--config",
                          json.dumps(tiny[1]), "--dtype", "f32")
        data = os.path.join(w, "data.h5")
        ids = np.random.default_rng(7).integers(3, 96, size=(3, 40)).astype(np.int32)
        with h5py.File(data, "w", libver=("v110", "v110")) as f:
            f["input_ids"] = ids
            f["labels"] = ids
    else:
        src = os.path.join(ROOT, "tests", "data", "family_reference", case)
        data = os.path.join(src, "data.h5")
    train(train_bin, src, data, w, 1)
    p = run(export_bin, os.path.join(w, "ckpt"), "--gguf", os.path.join(w, "x.gguf"), ok=False)
    msg = ([l for l in p.stdout.splitlines() if "--gguf:" in l] or [""])[-1]
    checks.append(("refused %s: exit %d, %r" % (case, p.returncode, msg),
                   p.returncode == 2 and ("config.json's " + field) in msg and
                   not os.path.exists(os.path.join(w, "x.gguf"))))


def main():
    train_bin, export_bin, work = sys.argv[1:4]
    only = sys.argv[4:]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    checks = []
    for name, (family, over) in CASES.items():
        if not only or name in only:
            check_case(name, family, over, train_bin, export_bin, work, checks)
    for case, field in REFUSED.items():
        if not only or case in only:
            check_refusal(case, field, train_bin, export_bin, work, checks)
    for case, (family, over, field) in REFUSED_TINY.items():
        if not only or case in only:
            check_refusal(case, field, train_bin, export_bin, work, checks, (family, over))
    ok = True
    for name, passed in checks:
        print("%s: %s" % ("ok" if passed else "FAILED", name))
        ok &= passed
    print("Passed!" if ok else "Failed!")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
