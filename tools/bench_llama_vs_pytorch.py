#!/usr/bin/env python3
"""kqlora-train against PyTorch + PEFT + torchao on a SmolLM2-135M-shaped Llama (or any
family and shape tools/make_hf_model.py writes), one thread per rank, side by side
(docs/BENCHMARKS.md, "Llama fine-tuning speed"; a model with experts, "Experts' speed").

    python3 tools/bench_llama_vs_pytorch.py [--model DIR | --family F --preset P]
                                            [--steps 6] [--pairs 5] [--batches 1,4]
                                            [--no-ddp] [--bin build/bin]
                                            [--dtype float32|bfloat16]

Both sides train QLoRA on full rows of 256 tokens whose every label is scored: all seven
projections of every block in NF4 (torchao's to_nf4, block 64, scaler_block_size 64; the
same sizes for kqlora), LoRA rank 8, alpha 16 on all seven (PEFT on the PyTorch side,
whose base linears hold the NF4 weights: torchao dequantizes each weight in every
forward and backward), AdamW, float32, torch.set_num_threads(1). --model is a Hugging
Face directory (default models/SmolLM2-135M-Instruct when it is there, else a random
model of --family / --preset, default llama / smollm2-135m, written under run/ by
tools/make_hf_model.py). Every linear but the LM head is NF4 and a LoRA target on both
sides (PEFT's all-linear). Measured, in one run:
  B x 256 tokens per step (--batches, default 1 and 4): --pairs interleaved pairs of whole
    runs (kqlora, then PyTorch), each run's median step time after the first; printed:
    the median of each side's times and the median of the per-pair ratios (this VM's speed
    drifts over minutes, so only ratios measured side by side are compared)
  DDP at 2 ranks against 1 with global_bs 2 (kqlora): the tokens/s ratio (not with --no-ddp)
--dtype bfloat16: both sides train in bfloat16 (kqlora's dtype = bfloat16; the PyTorch model
loaded in torch.bfloat16, NF4 of its bfloat16 weights).
Prints a table and one JSON line (--json FILE writes it too).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def random_model_dir(path, family, preset):
    """A random model of the family and preset (tools/make_hf_model.py, float32)."""
    if not os.path.exists(os.path.join(path, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_hf_model.py"), path,
                        "--family", family, "--preset", preset, "--dtype", "f32"], check=True)
    return path


def token_file(path, rows, seq, vocab):
    import h5py
    import numpy as np
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=(rows, seq), dtype=np.int32)
    with h5py.File(path, "w", libver=("v110", "v110")) as f:
        f.create_dataset("input_ids", data=ids)
        f.create_dataset("labels", data=ids)
        f.attrs["vocab_size"] = np.int64(vocab)
    return ids


def has_experts(model_dir):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    cfg = dict(cfg, **cfg.get("text_config", {}))
    # (Gemma 4 writes num_experts null without its MoE block)
    return bool(cfg.get("num_experts") or cfg.get("num_local_experts"))


def torch_steps(model_dir, ids, batch, steps, dtype="float32", experts_impl=None):
    """Median seconds of a PyTorch + PEFT + torchao QLoRA step after the first. A model with
    experts: its attention's Linear modules NF4 (any other Linear, a dense or shared expert's
    MLP, frozen in `dtype`: faster than NF4, in PyTorch's favour), the experts' fused
    parameters in `dtype` (torchao's NF4 does not hold 3-D parameters), LoRA on the attention
    and, through PEFT's target_parameters, on the experts (kqlora's lora_targets the same),
    transformers' experts_implementation `experts_impl`."""
    import torch
    torch.set_num_threads(1)
    from peft import LoraConfig, get_peft_model
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4
    from transformers import AutoModelForCausalLM
    kw = {"experts_implementation": experts_impl} if experts_impl else {}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), **kw)
    linears = set()
    # A model with experts: the attention and the experts adapted on both sides (kqlora's
    # lora_targets the same); PEFT would move a dense gate_proj / up_proj / down_proj onto
    # the experts (its v4-to-v5 conversion), and a shared expert's gate stays dense.
    attention = {"q_proj", "k_proj", "v_proj", "o_proj"}
    for name, lin in model.named_modules():
        if has_experts(model_dir) and name.rsplit(".", 1)[-1] not in attention:
            continue
        if isinstance(lin, torch.nn.Linear) and name != "lm_head":
            lin.weight = torch.nn.Parameter(
                to_nf4(lin.weight.detach(), block_size=64, scaler_block_size=64),
                requires_grad=False)
            linears.add(name.rsplit(".", 1)[-1])
    if has_experts(model_dir):  # (named: PEFT's all-linear would also adapt the routers)
        lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=sorted(linears),
                          target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    elif "per_layer_model_projection" in linears:  # (Gemma 4: kqlora keeps it frozen)
        lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                          target_modules=sorted(linears - {"per_layer_model_projection"}))
    else:
        lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear")
    model = get_peft_model(model, lora)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    x = torch.tensor(ids[:batch], dtype=torch.long)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def kqlora_steps(bin_dir, model_dir, data, batch, steps, ranks, work, tag, dtype="float32"):
    """Median seconds of a kqlora-train step after the first (from its metrics file)."""
    deck = os.path.join(work, "bench.in")
    with open(deck, "w") as f:
        f.write("model = causal_lm\n")
    metrics = os.path.join(work, tag + ".jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    targets = ["lora_targets=q_proj,k_proj,v_proj,o_proj,experts.gate_up_proj,experts.down_proj"] \
        if has_experts(model_dir) else []
    cmd = [os.path.join(bin_dir, "kqlora-train"), deck, "hf_model_dir=" + model_dir, *targets,
           "data_file=" + data, "global_bs=%d" % batch, "micro_bs=%d" % batch,
           "num_steps=%d" % steps, "optimizer=adamw", "lr=1e-4", "lora_rank=8",
           "lora_alpha=16", "block_size=64", "scaler_block_size=64", "checkpoint_every=0",
           "save_dir=" + os.path.join(work, tag), "metrics_file=" + metrics, "dtype=" + dtype]
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe"] + cmd
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    elapsed = [json.loads(l)["elapsed_s"] for l in open(metrics) if '"loss"' in l]
    return statistics.median([b - a for a, b in zip(elapsed, elapsed[1:])])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct")
    ap.add_argument("--model", default=default if os.path.isdir(default) else None)
    ap.add_argument("--family", default="llama", help="for a random model (make_hf_model.py)")
    ap.add_argument("--preset", default="smollm2-135m", help="for a random model")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--no-ddp", action="store_true")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--experts-impl", default="fastest",
                    help="transformers' experts_implementation for a model with experts: "
                         "eager, batched_mm, grouped_mm, or fastest (each timed over "
                         "--steps steps at the first batch size, the fastest kept)")
    args = ap.parse_args()
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = "1"
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    work = os.path.join(ROOT, "run", "bench_llama")
    os.makedirs(work, exist_ok=True)
    model_dir = args.model or random_model_dir(
        os.path.join(work, "%s_%s" % (args.family, args.preset)), args.family, args.preset)
    vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    data = os.path.join(work, "tokens.h5")
    ids = token_file(data, 8, 256, vocab)
    print(subprocess.run([os.path.join(args.bin, "kqlora-train"), "--version"],
                         stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[0])
    print("model: %s; %d steps per measurement, medians after the first" % (model_dir, args.steps))
    result = {"model": model_dir, "dtype": args.dtype}
    batches = [int(b) for b in args.batches.split(",")]
    runs = {b: [] for b in batches}
    impl = None
    if has_experts(model_dir):
        impls = ["eager", "batched_mm", "grouped_mm"] if args.experts_impl == "fastest" \
            else [args.experts_impl]
        timed = {}
        for name in impls:
            try:
                timed[name] = torch_steps(model_dir, ids, batches[0], args.steps, args.dtype, name)
            except Exception as e:  # (an implementation this torch lacks)
                print("experts_implementation %s: %s" % (name, e))
        impl = min(timed, key=timed.get)
        print("experts_implementation: %s (%s s/step at %d x 256)" % (
            impl, ", ".join("%s %.3f" % kv for kv in timed.items()), batches[0]), flush=True)
        result["experts_implementation"] = impl
        result["experts_implementation_s"] = timed
    for pair in range(args.pairs):
        for batch in batches:
            k = kqlora_steps(args.bin, model_dir, data, batch, args.steps, 1, work, "k%d" % batch,
                             args.dtype)
            t = torch_steps(model_dir, ids, batch, args.steps, args.dtype, impl)
            runs[batch].append((k, t))
            print("pair %d, %d x 256: kqlora-train %.3f s/step, PyTorch+PEFT+torchao %.3f s/step:"
                  " %.2fx" % (pair + 1, batch, k, t, t / k), flush=True)
    for batch in batches:
        k = statistics.median(r[0] for r in runs[batch])
        t = statistics.median(r[1] for r in runs[batch])
        ratio = statistics.median(r[1] / r[0] for r in runs[batch])
        result["%dx256" % batch] = {"kqlora_s": k, "pytorch_s": t, "speedup": ratio,
                                    "pairs": [list(r) for r in runs[batch]]}
        print("%d x 256 (median of %d pairs): kqlora-train %.3f s/step (%.0f tokens/s), "
              "PyTorch+PEFT+torchao %.3f s/step (%.0f tokens/s); median ratio %.2fx"
              % (batch, len(runs[batch]), k, 256 * batch / k, t, 256 * batch / t, ratio),
              flush=True)
    if args.no_ddp:
        print(json.dumps(result))
        if args.json:
            with open(args.json, "w") as f:
                f.write(json.dumps(result) + "\n")
        return 0
    one = kqlora_steps(args.bin, model_dir, data, 2, args.steps, 1, work, "ddp1")
    two = kqlora_steps(args.bin, model_dir, data, 2, args.steps, 2, work, "ddp2")
    result["ddp_np2_over_np1_tokens_per_s"] = one / two
    print("DDP global_bs 2: np 1 %.3f s/step, np 2 %.3f s/step: %.2fx the tokens/s"
          % (one, two, one / two))
    line = json.dumps(result)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
