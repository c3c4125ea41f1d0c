#!/usr/bin/env python3
"""The memory check's estimate against each rank's measured peak (docs/BENCHMARKS.md,
"The memory estimate"): kqlora-train on random models of realistic shapes, DDP and FSDP,
with and without activation checkpointing.

    python3 tools/bench_memory_estimate.py [--presets smollm2-135m,llama3.2-1b]
        [--np 1,2] [--parallel ddp,fsdp] [--ac off,on] [--global-bs 2] [--seq 256]
        [--steps 2] [--dtype float32] [--activation-dtype auto] [--set KEY=VALUE ...]
        [--bin build/bin] [--json FILE]

Each model is a directory tools/make_hf_model.py writes under run/bench_memory (bfloat16
shards, random weights, never committed; written once). Each run trains --steps steps of
--global-bs rows of --seq tokens (micro_bs = global_bs / np), all seven projections NF4
(block 64, scaler block 256), LoRA rank 8, AdamW, and reads the metrics file's last line:
the estimate per rank and every rank's peak (tracked allocations, RSS above start-up). A
rank's peak is the larger of the two. The check holds when every rank's estimate is at
least its peak and at most 1.5x it. Prints a table, exits 1 when any run misses. --dtype
and --activation-dtype are the runs' dtype and activation_dtype (docs/MODELS.md: bfloat16
keeps a bfloat16 run's activations in 16 bits). --set gives any other deck key (or one of
the above, replacing it): micro_bs=1 (gradient accumulation), lora_rank=64, eval_every=1
with eval_file=..., ... (docs/TRAINING.md).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from bench_llama_vs_pytorch import token_file  # noqa: E402  (random ids, labels = ids)


def model_dir(work, preset):
    path = os.path.join(work, preset)
    if not os.path.exists(os.path.join(path, "config.json")):
        from make_hf_model import PRESETS
        family = PRESETS[preset][0] if preset in PRESETS else "llama"
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_hf_model.py"), path,
                        "--family", family, "--preset", preset, "--dtype", "bf16"], check=True)
    return path


def run(args, model, data, np_, parallel, ac, work):
    metrics = os.path.join(work, "memory.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    deck = os.path.join(work, "memory.in")
    with open(deck, "w") as f:
        f.write("model = causal_lm\n")
    cmd = [os.path.join(args.bin, "kqlora-train"), deck, "hf_model_dir=" + model,
           "data_file=" + data, "global_bs=%d" % args.global_bs,
           "micro_bs=%d" % (args.global_bs // np_), "num_steps=%d" % args.steps,
           "optimizer=adamw", "lr=1e-4", "lora_rank=8", "lora_alpha=16", "block_size=64",
           "scaler_block_size=256", "checkpoint_every=0", "parallel=" + parallel,
           "activation_checkpointing=" + ac, "save_dir=" + os.path.join(work, "ck"),
           "metrics_file=" + metrics, "dtype=" + args.dtype,
           "activation_dtype=" + args.activation_dtype]
    given = {kv.split("=", 1)[0] for kv in args.set}
    cmd = [c for c in cmd if c.split("=", 1)[0] not in given] + args.set
    if np_ > 1:
        cmd = ["mpirun", "-np", str(np_), "--oversubscribe"] + cmd
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    last = [json.loads(l) for l in open(metrics) if "memory_estimate_bytes" in l][-1]
    return last


def main():
    ap = argparse.ArgumentParser(description=__doc__,  # --help shows the whole usage
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="smollm2-135m,llama3.2-1b")
    ap.add_argument("--np", default="1,2")
    ap.add_argument("--parallel", default="ddp,fsdp")
    ap.add_argument("--ac", default="off,on")
    ap.add_argument("--global-bs", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--activation-dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another deck key for every run (repeatable)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    # The keys this script sets itself and reads back: the token file is written for
    # --global-bs rows, the metrics file is where the peaks are read.
    owned = ("hf_model_dir", "data_file", "metrics_file", "save_dir", "global_bs")
    for kv in args.set:
        key = kv.split("=", 1)[0].strip()
        if "=" not in kv or not key:
            ap.error("--set %s: expected KEY=VALUE" % kv)
        if key in owned:
            ap.error("--set %s: %s is set by this script (use --global-bs for global_bs)"
                     % (kv, key))
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(v, "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    work = os.path.join(ROOT, "run", "bench_memory")
    os.makedirs(work, exist_ok=True)
    rows, ok = [], True
    print("%-14s %3s %5s %3s %10s %10s %10s %7s" % ("model", "np", "mode", "ac", "estimate",
                                                    "tracked", "RSS", "est/peak"))
    for preset in args.presets.split(","):
        model = model_dir(work, preset)
        vocab = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
        data = os.path.join(work, "tokens_%d.h5" % vocab)
        token_file(data, args.global_bs, args.seq, vocab)
        for np_ in [int(x) for x in args.np.split(",")]:
            for parallel in args.parallel.split(","):
                if parallel == "fsdp" and np_ == 1:
                    continue
                for ac in args.ac.split(","):
                    m = run(args, model, data, np_, parallel, ac, work)
                    est = m["memory_estimate_bytes"]
                    for r, (t, s) in enumerate(zip(m["peak_tracked_bytes"],
                                                   m["peak_rss_above_start_bytes"])):
                        peak = max(t, s)
                        ratio = est / peak if peak > 0 else float("inf")
                        good = peak <= est <= 1.5 * peak
                        ok &= good
                        rows.append(dict(model=preset, np=np_, parallel=parallel, ac=ac, rank=r,
                                         estimate=est, tracked=t, rss=s, ratio=ratio, ok=good))
                        print("%-14s %3d %5s %3s %9.2fG %9.2fG %9.2fG %6.2fx%s" % (
                            preset, np_, parallel, ac, est / 2**30, t / 2**30, s / 2**30, ratio,
                            "" if good else "  MISS"), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("every estimate within [peak, 1.5 x peak]" if ok else "some estimates missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
