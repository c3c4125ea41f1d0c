#!/usr/bin/env python3
"""kqlora-train's DPO against TRL 1.16's DPOTrainer + PEFT + torchao NF4 on a
SmolLM2-135M-shaped Llama (random weights, tools/make_hf_model.py), one thread each, side by
side:

    python3 tools/bench_dpo_vs_trl.py [--model DIR] [--steps 4] [--pairs 5]
                                      [--pairs-per-step 4] [--seq 256] [--prompt-len 64]
                                      [--precompute] [--trl-weights nf4|dequantized]
                                      [--block-size 64] [--scaler-block-size 64]
                                      [--bin build/bin] [--json FILE]

The full benchmark (defaults: run/smol135, 4 pairs of 256 tokens a step, 4 steps a run, 5
interleaved pairs of whole runs):

    python3 tools/bench_dpo_vs_trl.py --json run/bench_dpo/result.json

Data: P preference pairs (--pairs-per-step, a comma list for several batch sizes) of
random ids in 1..vocab-1, each a --prompt-len (64) prompt shared by the chosen and the
rejected row and two different completions filling the row to --seq (256): 192 scored
tokens each. Written as kqlora's pair file (input_ids, labels int32 [2P, T], labels -100
on the prompt, prompt_len; attributes form = "pairs", pairs = P, vocab_size), and fed to
TRL as prompt_ids / chosen_ids / rejected_ids through DPOTrainer's own data collator (so
both sides train on exactly the same 2P rows; nothing padded).

Both sides: DPO, loss_type sigmoid, beta 0.1, a fresh adapter (the reference is the NF4
base with the adapters off), LoRA rank 8, alpha 16, dropout 0 on q,k,v,o,gate,up,down of
every block (kqlora: lora_targets = all-linear), the same seven projections NF4 (block 64,
scaler block 64), float32, AdamW lr 1e-4 (weight decay 0.01, PyTorch's and kqlora's
default), constant learning rate, gradients clipped at global norm 1.0 (TRL's default
max_grad_norm; kqlora grad_clip = 1.0), the same P pairs every step as one batch
(kqlora: global_bs = micro_bs = P, tokenizer_check = off), one thread
(OMP/OPENBLAS/MKL_NUM_THREADS=1, torch.set_num_threads(1)).

kqlora's step time: the differences of its metrics file's elapsed_s, median after the
first step. --precompute adds precompute_ref_log_probs = true (the reference's
log-probabilities computed once before the first step); TRL then reads them from the batch
too (DPOTrainer.compute_ref_log_probs run once before the timed steps, the batch carrying
ref_chosen_logps / ref_rejected_logps, trainer.precompute_ref_logps set: what
DPOTrainer's precompute_ref_log_probs does), so neither side's steps run the reference.

TRL's side: the model loaded from the same directory in float32, every base nn.Linear of
the seven projections given torchao's NF4 weight (to_nf4: torchao dequantizes it in every
forward and backward, as QLoRA on CPU runs; --trl-weights dequantized instead copies the
NF4 dequantization in as a plain float32 weight, as tools/gen_dpo_reference.py's
references do: no dequantization per step, in TRL's favour). DPOTrainer is built offline as
tools/gen_dpo_reference.py builds it (a word-level tokenizer over the vocabulary, a dummy
dataset, the base model and a LoraConfig handed to DPOTrainer, which wraps it), with
gradient_checkpointing off (kqlora's default), optim adamw_torch, lr_scheduler constant.
A TRL step is timed as transformers' Trainer loop runs one optimizer step with no gradient
accumulation (Trainer._inner_training_loop): trainer.training_step(model, batch) (model.train(),
_prepare_inputs, DPOTrainer.compute_loss: the policy's forward, the reference's forward
under no_grad with the adapters off, the DPO loss; then accelerator.backward), then
trainer._clip_grad_norm(model) (max_grad_norm 1.0), trainer.optimizer.step(),
trainer.lr_scheduler.step(), model.zero_grad(); the collation is done once outside it (the
same batch every step). Median after the first step.

Each measurement is --pairs interleaved pairs of whole runs (kqlora, then TRL); printed:
per pair both medians and the ratio TRL / kqlora, then per batch size the median of each
side's times and the median of the per-pair ratios (this VM's speed drifts over minutes,
so only ratios measured side by side are compared), and one JSON line (--json FILE writes
it too). Each side's first-step loss is printed too: ln 2 = 0.693147 on both (a fresh
adapter: the policy is its reference).
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCK, SCALER_BLOCK = 64, 64
LR, WEIGHT_DECAY, MAX_GRAD_NORM, BETA, RANK, ALPHA = 1e-4, 0.01, 1.0, 0.1, 8, 16


def random_model_dir(path):
    """run/smol135: a random SmolLM2-135M-shaped Llama (tools/make_hf_model.py, float32)."""
    if not os.path.exists(os.path.join(path, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_hf_model.py"), path,
                        "--family", "llama", "--preset", "smollm2-135m", "--dtype", "f32"],
                       check=True)
    return path


def make_pairs(path, n_pairs, seq, prompt_len, vocab, seed=0):
    """kqlora's pair file of n_pairs random pairs; returns TRL's per-pair fields."""
    import h5py
    import numpy as np
    assert 0 < prompt_len < seq - 1
    rng = np.random.default_rng(seed)
    ids = np.zeros((2 * n_pairs, seq), np.int32)
    labels = np.full((2 * n_pairs, seq), -100, np.int32)
    examples = []
    for i in range(n_pairs):
        prompt = rng.integers(1, vocab, prompt_len).tolist()
        chosen = rng.integers(1, vocab, seq - prompt_len).tolist()
        rejected = rng.integers(1, vocab, seq - prompt_len).tolist()
        for row, comp in ((2 * i, chosen), (2 * i + 1, rejected)):
            ids[row] = prompt + comp
            labels[row, prompt_len:] = comp
        examples.append(dict(prompt_ids=prompt, chosen_ids=chosen, rejected_ids=rejected))
    with h5py.File(path, "w", libver=("v110", "v110")) as f:
        f.create_dataset("input_ids", data=ids)
        f.create_dataset("labels", data=labels)
        f.create_dataset("prompt_len", data=np.full(2 * n_pairs, prompt_len, np.int32))
        f.attrs["form"] = "pairs"
        f.attrs["pairs"] = np.int64(n_pairs)
        f.attrs["vocab_size"] = np.int64(vocab)
    return examples, ids


def kqlora_steps(bin_dir, model_dir, data, n_pairs, steps, work, tag, precompute):
    """Median seconds of a kqlora-train DPO step after the first (its metrics file's
    elapsed_s), and the first step's loss."""
    deck = os.path.join(work, "bench.in")
    with open(deck, "w") as f:
        f.write("model = causal_lm\n")
    metrics = os.path.join(work, tag + ".jsonl")
    save_dir = os.path.join(work, tag)
    if os.path.exists(metrics):
        os.remove(metrics)
    shutil.rmtree(save_dir, ignore_errors=True)  # (no reference side file from a previous run)
    cmd = [os.path.join(bin_dir, "kqlora-train"), deck, "hf_model_dir=" + model_dir,
           "data_file=" + data, "objective=dpo", "loss_type=sigmoid", "beta=%g" % BETA,
           "global_bs=%d" % n_pairs, "micro_bs=%d" % n_pairs, "num_steps=%d" % steps,
           "optimizer=adamw", "lr=%g" % LR, "weight_decay=%g" % WEIGHT_DECAY,
           "grad_clip=%g" % MAX_GRAD_NORM, "lora_rank=%d" % RANK, "lora_alpha=%d" % ALPHA,
           "lora_targets=all-linear", "block_size=%d" % BLOCK,
           "scaler_block_size=%d" % SCALER_BLOCK, "tokenizer_check=off", "checkpoint_every=0",
           "save_dir=" + save_dir, "metrics_file=" + metrics, "dtype=float32"]
    if precompute:
        cmd.append("precompute_ref_log_probs=true")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(l) for l in open(metrics)]
    rows = [r for r in rows if "step" in r and "loss" in r and "elapsed_s" in r]
    elapsed = [r["elapsed_s"] for r in rows]
    assert len(elapsed) == steps, (metrics, len(elapsed))
    return statistics.median([b - a for a, b in zip(elapsed, elapsed[1:])]), rows[0]["loss"]


def trl_model(model_dir, weights):
    """The model in float32, the seven projections' weights NF4 (torchao), as a base for
    PEFT's QLoRA."""
    import torch
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    n = 0
    with torch.no_grad():
        for name, lin in model.named_modules():
            if name.rsplit(".", 1)[-1] in PROJ and isinstance(lin, torch.nn.Linear):
                t = to_nf4(lin.weight.detach(), block_size=BLOCK, scaler_block_size=SCALER_BLOCK)
                if weights == "nf4":
                    lin.weight = torch.nn.Parameter(t, requires_grad=False)
                else:
                    lin.weight.copy_(t.get_original_weight().to(torch.float32))
                n += 1
    assert n > 0, "no projection found among " + ", ".join(PROJ)
    return model


def trl_steps(model_dir, examples, steps, precompute, weights):
    """Median seconds of a TRL DPOTrainer step after the first (the Trainer loop's sequence,
    see the module's docstring), and the first step's loss."""
    import torch
    torch.set_num_threads(1)
    import gen_dpo_reference as gdr  # (its tokenizer, dummy dataset and quiet(); one thread)
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer
    vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    tmp = tempfile.mkdtemp(prefix="kqlora_bench_dpo_")
    try:
        torch.manual_seed(0)
        with gdr.quiet():
            base = trl_model(model_dir, weights)
            base.train()
            args = DPOConfig(
                output_dir=tmp, report_to="none", use_cpu=True, bf16=False, fp16=False,
                gradient_checkpointing=False, per_device_train_batch_size=len(examples),
                seed=42, save_strategy="no", disable_dropout=True, dataset_num_proc=None,
                beta=BETA, loss_type="sigmoid", max_length=None, padding_free=False,
                precompute_ref_log_probs=False, learning_rate=LR, weight_decay=WEIGHT_DECAY,
                lr_scheduler_type="constant", max_grad_norm=MAX_GRAD_NORM, optim="adamw_torch",
                max_steps=steps, logging_steps=10 ** 9)
            lora = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                              target_modules=list(PROJ))
            trainer = DPOTrainer(model=base, args=args, processing_class=gdr.make_tokenizer(vocab),
                                 train_dataset=gdr.dummy_dataset(), peft_config=lora)
        model = trainer.model
        assert trainer.ref_model is None and "ref" not in model.peft_config
        assert trainer.loss_types == ["sigmoid"] and not trainer.precompute_ref_logps
        if weights == "nf4":  # (PEFT's base layers hold torchao's NF4 tensors)
            from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor
            nf4 = [n for n, p in model.named_parameters() if isinstance(p, NF4Tensor)]
            assert nf4 and all(".base_layer." in n for n in nf4), nf4[:3]
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        assert trainable and all(".lora_" in n for n in trainable), trainable[:3]
        batch = trainer.data_collator(examples)
        assert batch["input_ids"].shape[0] == 2 * len(examples)
        assert int(batch["attention_mask"].sum()) == batch["input_ids"].numel()  # no padding
        if precompute:
            model.eval()
            ref_c, ref_r = trainer.compute_ref_log_probs(model, batch)
            batch["ref_chosen_logps"], batch["ref_rejected_logps"] = ref_c, ref_r
            trainer.precompute_ref_logps = True
        trainer.create_optimizer_and_scheduler(num_training_steps=steps)
        trainer.current_gradient_accumulation_steps = 1
        model.zero_grad()
        times, losses = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = trainer.training_step(model, dict(batch))
            trainer._clip_grad_norm(model)
            trainer.optimizer.step()
            trainer.lr_scheduler.step()
            model.zero_grad()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        assert all(l == l for l in losses), losses
        return statistics.median(times[1:]), losses[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions(bin_dir):
    import peft
    import torch
    import torchao
    import transformers
    import trl
    out = subprocess.run([os.path.join(bin_dir, "kqlora-train"), "--version"],
                         stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()
    return {"kqlora": out[0] if out else "unknown", "trl": trl.__version__,
            "peft": peft.__version__, "torchao": torchao.__version__,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None,
                    help="a Hugging Face model directory (default: run/smol135, made by "
                         "make_hf_model.py --family llama --preset smollm2-135m --dtype f32 "
                         "when absent)")
    ap.add_argument("--steps", type=int, default=4, help="steps a run (median after the first)")
    ap.add_argument("--pairs", type=int, default=5,
                    help="interleaved pairs of whole runs (kqlora, then TRL)")
    ap.add_argument("--pairs-per-step", default="4",
                    help="preference pairs a step (the batch), a comma list for several")
    ap.add_argument("--seq", type=int, default=256, help="tokens a row (prompt + completion)")
    ap.add_argument("--prompt-len", type=int, default=64, help="the shared prompt's tokens")
    ap.add_argument("--precompute", action="store_true",
                    help="reference log-probabilities computed once before the steps "
                         "(kqlora's precompute_ref_log_probs=true; TRL's batch carries them)")
    ap.add_argument("--trl-weights", default="nf4", choices=["nf4", "dequantized"],
                    help="TRL's base projections: torchao NF4 tensors (default) or their "
                         "dequantization as plain float32 weights")
    ap.add_argument("--block-size", type=int, default=64, help="NF4 block (both sides)")
    ap.add_argument("--scaler-block-size", type=int, default=64,
                    help="NF4 scaler block (both sides; a tiny model needs smaller ones)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--json", default=None, help="also write the JSON line to FILE")
    args = ap.parse_args()
    global BLOCK, SCALER_BLOCK
    BLOCK, SCALER_BLOCK = args.block_size, args.scaler_block_size
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first step is not timed)")
    import trl
    if trl.__version__ != "1.16.0":
        print("note: TRL %s (the benchmark is written for 1.16.0)" % trl.__version__)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    import warnings
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
    work = os.path.join(ROOT, "run", "bench_dpo")
    os.makedirs(work, exist_ok=True)
    model_dir = os.path.abspath(args.model or random_model_dir(os.path.join(ROOT, "run", "smol135")))
    vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    batches = [int(b) for b in args.pairs_per_step.split(",")]
    ver = versions(args.bin)
    cpu = cpu_name()
    print(ver["kqlora"])
    print("CPU: %s; one thread a side" % cpu)
    print("TRL %s, PEFT %s, torchao %s, torch %s, transformers %s, Python %s" % (
        ver["trl"], ver["peft"], ver["torchao"], ver["torch"], ver["transformers"],
        ver["python"]))
    print("model: %s; DPO sigmoid beta %g, pairs of %d tokens (prompt %d + completion %d), "
          "reference %s, TRL weights %s, NF4 blocks %d/%d; %d steps a run, medians after the first"
          % (model_dir, BETA, args.seq, args.prompt_len, args.seq - args.prompt_len,
             "precomputed" if args.precompute else "on the fly", args.trl_weights, BLOCK, SCALER_BLOCK, args.steps),
          flush=True)
    result = {"model": model_dir, "cpu": cpu, "versions": ver, "steps": args.steps,
              "seq": args.seq, "prompt_len": args.prompt_len, "precompute": args.precompute,
              "trl_weights": args.trl_weights, "block_size": BLOCK,
              "scaler_block_size": SCALER_BLOCK,
              "trl_step": "training_step + _clip_grad_norm + optimizer.step + "
                          "lr_scheduler.step + zero_grad"}
    data = {}
    for b in batches:
        path = os.path.join(work, "pairs_%d.h5" % b)
        data[b] = (path, make_pairs(path, b, args.seq, args.prompt_len, vocab)[0])
    runs = {b: [] for b in batches}
    first_loss = {}
    for pair in range(args.pairs):
        for b in batches:
            k, kl = kqlora_steps(args.bin, model_dir, data[b][0], b, args.steps, work,
                                 "k%d" % b, args.precompute)
            t, tl = trl_steps(model_dir, data[b][1], args.steps, args.precompute,
                              args.trl_weights)
            runs[b].append((k, t))
            first_loss.setdefault(b, (kl, tl))
            print("pair %d, %d pairs x %d: kqlora-train %.3f s/step, TRL+PEFT+torchao %.3f "
                  "s/step: %.2fx (first-step loss %.6f, %.6f)"
                  % (pair + 1, b, args.seq, k, t, t / k, kl, tl), flush=True)
    print()
    print("%-22s %12s %12s %8s  %s" % ("batch", "kqlora s", "TRL s", "ratio", "per pair"))
    for b in batches:
        k = statistics.median(r[0] for r in runs[b])
        t = statistics.median(r[1] for r in runs[b])
        ratios = [r[1] / r[0] for r in runs[b]]
        ratio = statistics.median(ratios)
        result["%dx%d" % (b, args.seq)] = {
            "kqlora_s": k, "trl_s": t, "speedup": ratio, "ratios": ratios,
            "pairs": [list(r) for r in runs[b]], "first_loss": list(first_loss[b]),
            "tokens_per_step": 2 * b * args.seq}
        print("%-22s %12.3f %12.3f %7.2fx  %s" % (
            "%d pairs x %d (%d rows)" % (b, args.seq, 2 * b), k, t, ratio,
            " ".join("%.2f" % r for r in ratios)), flush=True)
    line = json.dumps(result)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
