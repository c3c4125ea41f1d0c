#!/usr/bin/env python3
"""DDP step time at world size 2 against world size 1 on the same global batch, one thread
per rank, and what the bucket overlap hides:

    python3 tools/bench_ddp.py [--bin build/bin] [--deck input/bench_ddp.in] [--np 2]

Runs kqlora-train four times, side by side: np 1; np N with the default on one node
(gradients, weights and optimizer state in node shared memory, each rank summing and
updating its chunk); np N with bucket reductions as across nodes (KQLORA_DDP_SHARED_MEMORY=0),
summed blocking as soon as a bucket is ready (the default for host memory); and the same
with KQLORA_DDP_OVERLAP=1 (non-blocking, driven between panels, finished after the
backward). Step time: median of the per-step times after the first (metrics_file's
elapsed_s).
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


def run(np, shared=True, overlap=False):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["KQLORA_DDP_SHARED_MEMORY"] = "1" if shared else "0"
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
print(f"step time np=1: {t1:.3f} s")
for label, kw in [("node shared memory (default on one node)", {}),
                  ("buckets, blocking when ready", {"shared": False}),
                  ("buckets, non-blocking overlap", {"shared": False, "overlap": True})]:
    tn, ddp = run(args.np, **kw)
    print(f"step time np={args.np}, {label}: {tn:.3f} s  ({tn / t1:.2f}x of np=1)\n    {ddp}")
