#!/usr/bin/env python3
"""kqlora's adapters of a Hugging Face decoder back in the ecosystem (ctest
llama_export_transformers, family_export):

    python3 tests/check_llama_export.py KQLORA_TRAIN KQLORA_EXPORT CASE_DIR WORKDIR \
        [CASE_DIR WORKDIR ...]

CASE_DIR is a tests/data/llama_reference or family_reference case (config.json,
model.safetensors, data.h5); CASE_DIR@multimodal, a qwen3_5_text (qwen3_5_moe_text) case written
first as the hub ships Qwen3.5 (a multimodal qwen3_5 or qwen3_5_moe directory,
multimodal_directory below), where
PEFT must also put --peft's adapters on AutoModelForCausalLM of that directory. Several cases run in one process, so torch, transformers and
PEFT are imported once (11 s on a slow CPU); each is checked even after one fails. transformers runs with eager attention (its soft-caps and
windows are the eager path's).
Trains 5 AdamW steps with kqlora-train (LoRA dropout on, eval over data.h5 after the last
step), exports --peft, --base and --merged, then, with transformers and PEFT in float32:
  PeftModel.from_pretrained(AutoModelForCausalLM(--base dir), --peft dir)  and
  AutoModelForCausalLM(--merged dir)
each give kqlora's eval loss on data.h5 (rtol 1e-4); adapter_config.json says what PEFT
needs; PEFT's save_pretrained of the loaded adapters, as kqlora-train's init_file, gives
the same eval loss again; the rows packed into one (position_ids) give kqlora the same
eval loss, and transformers too, given position_ids and no attention mask (its
packed-sequence masking). Exit 77 (ctest: skipped) with a message when torch, transformers, peft or h5py
cannot be imported.
"""
import json
import os
import shutil
import subprocess
import sys

try:
    import h5py
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
except ImportError as e:  # the suite must not need them
    print("SKIPPED: %s (pip install torch transformers peft h5py to run this test)" % e)
    sys.exit(77)


def linear_names(case):
    """PEFT's all-linear for the family: every Linear's module name but the LM head."""
    from transformers import AutoConfig
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(case))
    # (a multimodal model's text decoder's: its towers' are never targets)
    text = any(".language_model." in n for n, _ in model.named_modules())
    return sorted({n.split(".")[-1] for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and n != "lm_head"
                   and (not text or ".language_model." in n)})


def main():
    train, export, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
    if len(pairs) < 2 or len(pairs) % 2:
        sys.exit("usage: check_llama_export.py KQLORA_TRAIN KQLORA_EXPORT CASE_DIR WORKDIR "
                 "[CASE_DIR WORKDIR ...]")
    failed = []
    for case, work in zip(pairs[0::2], pairs[1::2]):
        print("== %s" % case, flush=True)
        try:
            if case.endswith("@multimodal"):  # (the Qwen3.5 text case as the hub ships it)
                case = multimodal_directory(case[:-len("@multimodal")], work + "_model")
            ok = check_case(train, export, case, work)
        except subprocess.CalledProcessError as e:  # a kqlora app failed: its output
            print("FAILED: %s exited %d\n%s" % (" ".join(e.cmd), e.returncode, e.stdout))
            ok = False
        if not ok:
            failed.append(case)
    print("Passed!" if not failed else "Failed: " + ", ".join(failed))
    return 0 if not failed else 1


def multimodal_directory(text_case, out):
    """A qwen3_5_text (qwen3_5_moe_text, gemma4_text) case as a multimodal qwen3_5
    (qwen3_5_moe, gemma4) directory (Qwen3_5ForConditionalGeneration, ...: the case's
    decoder under model.language_model., a tiny random vision tower beside it), with the
    case's data.h5 and case.txt."""
    import transformers
    shutil.rmtree(out, ignore_errors=True)
    text_type = json.load(open(os.path.join(text_case, "config.json")))["model_type"]
    name = {"qwen3_5_text": "Qwen3_5", "qwen3_5_moe_text": "Qwen3_5Moe",
            "gemma4_text": "Gemma4"}[text_type]
    Config, ForCausalLM, ForConditionalGeneration = (
        getattr(transformers, name + suffix)
        for suffix in ("Config", "ForCausalLM", "ForConditionalGeneration"))
    text = ForCausalLM.from_pretrained(text_case, dtype=torch.float32)
    tc = text.config.to_dict()
    vision = (dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=2, head_dim=16)
              if name == "Gemma4" else
              dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32,
                   out_hidden_size=tc["hidden_size"]))
    torch.manual_seed(5)
    model = ForConditionalGeneration(Config(
        text_config=tc, vision_config=vision,
        tie_word_embeddings=tc.get("tie_word_embeddings", False))).float()
    state = {("model.language_model." + k[6:] if k.startswith("model.") else k): v
             for k, v in text.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    towers = ("model.visual.", "model.vision_tower.", "model.embed_vision.")
    assert not unexpected and all(k.startswith(towers) for k in missing), (missing, unexpected)
    model.save_pretrained(out)
    for name in ("data.h5", "case.txt"):
        if os.path.exists(os.path.join(text_case, name)):
            shutil.copy(os.path.join(text_case, name), os.path.join(out, name))
    return out


def check_case(train, export, case, work):
    """True when every check of one case passes (each printed)."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    deck = os.path.join(work, "deck.in")
    with open(deck, "w") as f:
        f.write("model = causal_lm\n")
    data = os.path.join(case, "data.h5")
    run = lambda *cmd: subprocess.run(cmd, check=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True).stdout
    hf_cfg = json.load(open(os.path.join(case, "config.json")))
    towers = hf_cfg.get("model_type") == "gemma4"  # (AutoModelForCausalLM: the whole model)
    hf_cfg = dict(hf_cfg, **hf_cfg.get("text_config", {}))  # (a multimodal one's decoder's)
    # (a model with experts: all-linear adapts them too, and PEFT refuses dropout there)
    # (Gemma 4 writes num_experts null without its MoE block)
    experts = bool(hf_cfg.get("num_experts") or hf_cfg.get("num_local_experts"))
    dropout = 0.0 if experts else 0.1
    # PEFT reads gate_proj / up_proj / down_proj of a model with experts as the experts'
    # (its v4-to-v5 conversion): a dense layer's adapters of those names are refused by
    # --peft (checked below), so such a model trains the attention and the experts.
    # (Gemma 4's per_layer_model_projection and its router's proj stay frozen in kqlora, as
    # every router: docs/MODELS.md)
    want_targets = [t for t in linear_names(case)
                    if t not in ("per_layer_model_projection", "proj")]
    dense_mlp = experts and "gate_proj" in want_targets
    if dense_mlp:  # (the attention's, a Gated DeltaNet's too; the shared expert's [1, hidden]
        # gate frozen as the router: docs/MODELS.md, "Experts")
        want_targets = [t for t in want_targets if t not in (
            "gate_proj", "up_proj", "down_proj", "shared_expert_gate")]
    targets = (["lora_targets=" + ",".join(want_targets + ["experts.gate_up_proj",
                                                           "experts.down_proj"])]
               if dense_mlp else [])
    if hf_cfg.get("output_router_logits"):
        targets.append("router_aux_loss=off")
    run(train, deck, "hf_model_dir=" + case, "data_file=" + data, "eval_file=" + data,
        "eval_every=5", "num_steps=5", "global_bs=3", "lora_rank=4", "lora_alpha=8", *targets,
        "lora_dropout=%g" % dropout, "block_size=32", "scaler_block_size=32", "optimizer=adamw",
        "lr=1e-2", "save_dir=" + os.path.join(work, "ckpt"),
        "metrics_file=" + os.path.join(work, "metrics.jsonl"))
    want = [json.loads(l)["eval_loss"] for l in open(os.path.join(work, "metrics.jsonl"))
            if "eval_loss" in l][-1]
    ckpt = os.path.join(work, "ckpt")
    for kind in ("peft", "base", "merged"):
        print(run(export, ckpt, "--" + kind, os.path.join(work, kind)).strip())

    cfg = json.load(open(os.path.join(work, "peft", "adapter_config.json")))
    checks = [("task_type", cfg["task_type"] == "CAUSAL_LM"),
              ("r and lora_alpha", (cfg["r"], cfg["lora_alpha"]) == (4, 8)),
              ("lora_dropout", abs(cfg["lora_dropout"] - dropout) < 1e-12),
              # (a multimodal model's: a regular expression, the text decoder's names alone)
              ("target_modules %s" % (cfg["target_modules"],),
               sorted(cfg["target_modules"]) == want_targets if not towers else
               cfg["target_modules"] == r"model\.language_model\..*\.(%s)" %
               "|".join(sorted(want_targets, key=[
                   "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                   "down_proj", "per_layer_input_gate", "per_layer_projection"].index))),
              ("base_model_name_or_path",
               cfg["base_model_name_or_path"] == os.path.realpath(case))]
    with open(os.path.join(work, "merged", "model.safetensors"), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        names = set(json.loads(f.read(n))) - {"__metadata__"}
    checks.append(("lm_head.weight only when untied",
                   ("lm_head.weight" in names) != hf_cfg.get("tie_word_embeddings", False)))
    if dense_mlp:  # all-linear: the dense layer's gate_proj beside the experts, refused
        run(train, deck, "hf_model_dir=" + case, "data_file=" + data, "eval_file=" + data,
            "eval_every=2", "num_steps=2", "global_bs=3", "lora_rank=4", "lora_alpha=8",
            "block_size=32", "scaler_block_size=32", "optimizer=adamw", "lr=1e-2",
            "save_dir=" + os.path.join(work, "all_linear"),
            "metrics_file=" + os.path.join(work, "all_linear.jsonl"))
        refused = subprocess.run([export, os.path.join(work, "all_linear"), "--peft",
                                  os.path.join(work, "peft_all_linear")],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        checks.append(("--peft of a dense gate_proj beside experts: exit 2 naming it",
                       refused.returncode == 2 and "gate_proj" in refused.stdout
                       and "PEFT" in refused.stdout))
        # ... which --merged carries: the dense (and shared expert's) adapters merged too
        run(export, os.path.join(work, "all_linear"), "--merged",
            os.path.join(work, "merged_all_linear"))
        all_linear_want = [json.loads(l)["eval_loss"]
                           for l in open(os.path.join(work, "all_linear.jsonl"))
                           if "eval_loss" in l][-1]
        all_linear_merged = os.path.join(work, "merged_all_linear")
    if experts:  # PEFT's target_parameters; --merged in transformers 5's fused layout
        # (Gemma 4's experts are under the layer, not its mlp)
        m = "experts" if hf_cfg.get("model_type") == "gemma4_text" else "mlp.experts"
        checks.append(("target_parameters %s" % cfg.get("target_parameters"),
                       cfg.get("target_parameters") == [m + ".down_proj", m + ".gate_up_proj"]))
        checks.append(("--merged: the fused experts (model.layers.L.%s.gate_up_proj)" % m,
                       any(n.endswith("." + m + ".gate_up_proj") for n in names) and
                       not any(".experts.0." in n for n in names)))

    with h5py.File(data) as f:
        ids = torch.tensor(f["input_ids"][...], dtype=torch.long)
        labels = torch.tensor(f["labels"][...], dtype=torch.long)

    # (the load-balancing loss off on both sides: it depends on how rows are batched, and
    # the reference cases check it)
    no_aux = {"output_router_logits": False} if hf_cfg.get("output_router_logits") else {}

    def loss_of(model):
        model.eval()
        with torch.no_grad():
            return model(input_ids=ids, labels=labels, **no_aux).loss.item()

    base = AutoModelForCausalLM.from_pretrained(os.path.join(work, "base"), dtype=torch.float32,
                                                 attn_implementation="eager")
    peft_model = PeftModel.from_pretrained(base, os.path.join(work, "peft"))
    got_peft = loss_of(peft_model)
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(work, "merged"),
                                                  dtype=torch.float32,
                                                  attn_implementation="eager")
    got_merged = loss_of(merged)
    if dense_mlp:
        got = loss_of(AutoModelForCausalLM.from_pretrained(
            all_linear_merged, dtype=torch.float32, attn_implementation="eager"))
        checks.append(("--merged of all-linear (the dense MLP's adapters too): loss %.7f vs "
                       "kqlora's %.7f" % (got, all_linear_want),
                       abs(got - all_linear_want) <= 1e-4 * abs(all_linear_want)))
    untrained = loss_of(AutoModelForCausalLM.from_pretrained(
        os.path.join(work, "base"), dtype=torch.float32, attn_implementation="eager"))
    if "text_config" in hf_cfg:
        # A multimodal directory (Qwen3.5): PEFT puts --peft's adapters on the model a user
        # loads from the case's own directory (AutoModelForCausalLM: its text decoder),
        # every tensor of the file at its place.
        from safetensors.torch import load_file
        own = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(case, dtype=torch.float32), os.path.join(
                work, "peft"))
        saved = load_file(os.path.join(work, "peft", "adapter_model.safetensors"))
        params = {n.replace(".default", ""): p for n, p in own.named_parameters()
                  if "lora_" in n}
        same = sorted(params) == sorted(saved) and all(
            torch.equal(params[n].detach(), saved[n]) for n in saved)
        checks.append(("PEFT loads --peft onto AutoModelForCausalLM(%s) (%s): %d tensors "
                       "in place" % (os.path.basename(case), type(own.base_model.model).__name__,
                                     len(saved)), same))
    # PEFT's own writer, read back by kqlora (init_file = a PEFT adapter directory; lr 0
    # leaves the adapters as loaded): the same eval loss.
    peft_model.save_pretrained(os.path.join(work, "peft_saved"))

    def kqlora_eval(name, eval_file):
        """kqlora's eval loss of the PEFT-saved adapters over eval_file."""
        run(train, deck, "hf_model_dir=" + case, "data_file=" + data, "eval_file=" + eval_file,
            "eval_every=1", "num_steps=1", "global_bs=3", "lora_rank=4", "lora_alpha=8",
            *targets, "block_size=32", "scaler_block_size=32", "optimizer=adamw", "lr=0",
            "init_file=" + os.path.join(work, "peft_saved"), "save_dir=" + os.path.join(work, name),
            "metrics_file=" + os.path.join(work, name + ".jsonl"))
        return [json.loads(l)["eval_loss"] for l in open(os.path.join(work, name + ".jsonl"))
                if "eval_loss" in l][-1]
    again = kqlora_eval("again", data)
    # The same rows packed into one (position_ids; each row's first label -100): kqlora's
    # eval loss is the unpacked one, and so is transformers' given position_ids and no
    # attention mask (its packed-sequence masking).
    packed = os.path.join(work, "packed.h5")
    rows = []
    for i in range(ids.shape[0]):
        n = int((labels[i] != -100).nonzero().max()) + 1
        rows.append((ids[i, :n], labels[i, :n].clone()))
    p_ids = torch.cat([r[0] for r in rows])[None]
    p_pos = torch.cat([torch.arange(len(r[0])) for r in rows])[None]
    p_labels = torch.cat([torch.cat([torch.tensor([-100]), r[1][1:]]) for r in rows])[None]
    with h5py.File(packed, "w", libver=("v110", "v110")) as f:
        f["input_ids"] = p_ids.numpy().astype("int32")
        f["labels"] = p_labels.numpy().astype("int32")
        f["position_ids"] = p_pos.numpy().astype("int32")
    kq_packed = kqlora_eval("packed", packed)
    with torch.no_grad():
        hf_packed = merged(input_ids=p_ids, position_ids=p_pos, labels=p_labels,
                           use_cache=False, **no_aux).loss.item()  # (a cache turns its detection off)
    # --gguf (the llama architecture): transformers' GGUF loader, given --merged's config
    # (its loader drops fields), gives kqlora's eval loss: f32 1e-4, bf16 and f16 1e-2,
    # q8_0 within 2% (docs/GGUF.md).
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
        have_gguf = True
    except ImportError:
        have_gguf = False
        print("note: the --gguf checks skipped: Python package gguf not installed")
    if hf_cfg.get("model_type") == "llama" and have_gguf:
        from transformers import AutoConfig
        merged_cfg = AutoConfig.from_pretrained(os.path.join(work, "merged"))
        for gtype, tol in (("f32", 1e-4), ("f16", 1e-2), ("bf16", 1e-2), ("q8_0", 2e-2)):
            name = "model-%s.gguf" % gtype
            print(run(export, ckpt, "--gguf", os.path.join(work, name), "--gguf-type",
                      gtype).strip())
            g = AutoModelForCausalLM.from_pretrained(work, gguf_file=name, config=merged_cfg,
                                                     dtype=torch.float32,
                                                     attn_implementation="eager")
            got = loss_of(g)
            if gtype == "f32":  # the hyperparameters llama.cpp reads (transformers took config=)
                from gguf import GGUFReader
                fields = GGUFReader(os.path.join(work, name)).fields
                rope = hf_cfg.get("rope_parameters") or {}
                theta = hf_cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
                head_dim = hf_cfg.get("head_dim") or \
                    hf_cfg["hidden_size"] // hf_cfg["num_attention_heads"]
                meta = {"llama.rope.freq_base": float(theta),
                        "llama.attention.head_count": hf_cfg["num_attention_heads"],
                        "llama.attention.head_count_kv": hf_cfg["num_key_value_heads"],
                        "llama.attention.key_length": head_dim,
                        "llama.block_count": hf_cfg["num_hidden_layers"],
                        "llama.embedding_length": hf_cfg["hidden_size"],
                        "llama.feed_forward_length": hf_cfg["intermediate_size"],
                        "llama.context_length": hf_cfg["max_position_embeddings"]}
                for k, v in meta.items():
                    checks.append(("--gguf %s = %r (config.json %r)"
                                   % (k, fields[k].contents(), v),
                                   abs(fields[k].contents() - v) <= 1e-6 * abs(v)))
                eps = fields["llama.attention.layer_norm_rms_epsilon"].contents()
                checks.append(("--gguf rms eps %g" % eps,
                               abs(eps - hf_cfg["rms_norm_eps"]) <= 1e-6 * hf_cfg["rms_norm_eps"]))
            checks.append(("--gguf %s in transformers: loss %.7f vs kqlora's %.7f"
                           % (gtype, got, want), abs(got - want) <= tol * abs(want)))
        # --gguf-of base: the dequantized NF4 alone, the fine-tune's "before".
        print(run(export, ckpt, "--gguf", os.path.join(work, "base.gguf"), "--gguf-of", "base",
                  "--gguf-type", "f32").strip())
        got = loss_of(AutoModelForCausalLM.from_pretrained(
            work, gguf_file="base.gguf", config=merged_cfg, dtype=torch.float32,
            attn_implementation="eager"))
        checks.append(("--gguf-of base in transformers: loss %.7f vs --base's %.7f"
                       % (got, untrained), abs(got - untrained) <= 1e-4 * abs(untrained)))
    checks += [("PEFT on --base: loss %.7f vs kqlora's %.7f" % (got_peft, want),
                abs(got_peft - want) <= 1e-4 * abs(want)),
               ("--merged: loss %.7f vs kqlora's %.7f" % (got_merged, want),
                abs(got_merged - want) <= 1e-4 * abs(want)),
               ("init_file = PEFT's save_pretrained directory: eval loss %.7f" % again,
                abs(again - want) <= 1e-5 * abs(want)),
               ("packed eval rows: kqlora %.7f vs unpacked %.7f" % (kq_packed, want),
                abs(kq_packed - want) <= 1e-5 * abs(want)),
               ("the adapters matter: --base alone %.7f" % untrained,
                abs(untrained - want) > 1e-3 * abs(want))]
    # (transformers 5.25's GptOssModel builds its masks without position_ids: its packed
    # rows' documents see each other, so only kqlora's packed = unpacked is checked there)
    # (transformers' Gated DeltaNet torch path carries its state and conv across documents)
    if hf_cfg.get("model_type") == "gpt_oss":
        print("note: transformers' packed rows not compared: GptOssModel ignores position_ids "
              "in its masks (%.7f)" % hf_packed)
    elif "linear_attention" in (hf_cfg.get("text_config") or hf_cfg).get("layer_types", []):
        print("note: transformers' packed rows not compared: its Gated DeltaNet layers carry "
              "their state across documents (%.7f)" % hf_packed)
    else:
        checks.append(("packed rows in transformers (position_ids, no mask): %.7f vs kqlora's "
                       "%.7f" % (hf_packed, kq_packed),
                       abs(hf_packed - kq_packed) <= 1e-4 * abs(kq_packed)))
    ok = True
    for name, passed in checks:
        print("%s: %s" % ("ok" if passed else "FAILED", name))
        ok &= passed
    return ok


if __name__ == "__main__":
    sys.exit(main())
