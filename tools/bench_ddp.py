#!/usr/bin/env python3
"""DDP step time at world size 2 against world size 1 on the same global batch, one thread
per rank, and what the bucket overlap hides:

    python3 tools/bench_ddp.py [--bin build/bin] [--deck input/bench_ddp.in] [--np 2]

Runs kqlora-train three times: np 1, np N (buckets summed blocking as soon as they are
ready, the default on CPUs), and np N with KQLORA_DDP_OVERLAP=1 (non-blocking, driven between
panels, finished after the backward). Step time: median of the per-step times after the first
(from metrics_file's elapsed_s).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default="build/bin")
ap.add_argument("--deck", default="input/bench_ddp.in")
ap.add_argument("--np", type=int, default=2)
args = ap.parse_args()


def run(np, overlap=True):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["KQLORA_DDP_OVERLAP"] = "1" if overlap else "0"
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        out = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "core", "-np", str(np),
                              os.path.join(args.bin, "kqlora-train"), args.deck,
                              f"metrics_file={metrics}", f"save_dir={tmp}/ck"],
                             env=env, check=True, capture_output=True, text=True).stdout
        t = [json.loads(l)["elapsed_s"] for l in open(metrics)]
    steps = [b - a for a, b in zip(t, t[1:])]
    ddp = re.search(r"^DDP: .*$", out, re.M)
    return statistics.median(steps), (ddp.group(0) if ddp else "")


t1, _ = run(1)
tn, ddp = run(args.np, overlap=False)
tn_ov, ddp_ov = run(args.np, overlap=True)
print(f"step time np=1: {t1:.3f} s")
print(f"step time np={args.np} (default: blocking when ready): {tn:.3f} s  ({tn / t1:.2f}x of np=1)   {ddp}")
print(f"step time np={args.np}, non-blocking overlap: {tn_ov:.3f} s  ({tn_ov / t1:.2f}x)   {ddp_ov}")
