#!/usr/bin/env python3
"""Compares two kqlora-train metrics files (JSON lines) step by step, e.g. a bfloat16 run
against a float32 one:
    python3 tools/compare_loss_curves.py float32.jsonl bfloat16.jsonl
Prints each step's losses and relative difference, and RMS(difference) / RMS(loss), the
measure that stays meaningful when a sum loss crosses zero."""
import json
import math
import sys


def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if '"loss"' in l]


a, b = losses(sys.argv[1]), losses(sys.argv[2])
n = min(len(a), len(b))
for s in range(n):
    print(f"step {s + 1:4d}  {a[s]:14.6g}  {b[s]:14.6g}  {abs(b[s] - a[s]) / max(abs(a[s]), 1e-300) * 100:8.2f}%")
rms = lambda v: math.sqrt(sum(t * t for t in v) / len(v))
print(f"RMS(difference) / RMS(loss) over {n} steps: {100 * rms([b[s] - a[s] for s in range(n)]) / rms(a[:n]):.2f}%")
