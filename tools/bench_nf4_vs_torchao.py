#!/usr/bin/env python3
"""NF4 quantize/dequantize: kqlora-bench next to torchao, in one run, one thread each.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
        python3 tools/bench_nf4_vs_torchao.py --bench build/bin/kqlora-bench [--sizes 4096,8192]

Needs torch and torchao (pip install torch torchao). Runs torchao's to_nf4 and
get_original_weight on the same CPU with torch.set_num_threads(1), then kqlora-bench on the
same sizes, and prints medians and ratios (kqlora throughput / torchao throughput), plus
kqlora's dequantize bandwidth as a fraction of the same run's memcpy bandwidth.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

torch.set_num_threads(1)
from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4  # noqa: E402


def median_time(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default="build/bin/kqlora-bench")
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--repeats", type=int, default=3, help="torchao repetitions")
    ap.add_argument("--json", help="write the comparison here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    torchao = {}
    for n in sizes:
        for dtype, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            w = torch.randn(n, n).to(dtype)
            torchao[f"nf4_quant_{n}x{n}_{tag}"] = median_time(lambda: to_nf4(w), args.repeats)
            nf4 = to_nf4(w)
            torchao[f"nf4_dequant_{n}x{n}_{tag}"] = median_time(nf4.get_original_weight, args.repeats)
            print(f"torchao {n}x{n} {tag}: quant {torchao[f'nf4_quant_{n}x{n}_{tag}']:.3f} s, "
                  f"dequant {torchao[f'nf4_dequant_{n}x{n}_{tag}']:.3f} s", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "kqlora.json")
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        subprocess.run([args.bench, "--sizes", args.sizes, "--json", out], check=True, env=env)
        with open(out) as f:
            records = {r["name"]: r for r in json.load(f)}

    rows = []
    print(f"\n{'record':30} {'kqlora ms':>10} {'torchao ms':>11} {'speed-up':>9} {'% memcpy BW':>12}")
    for n in sizes:
        memcpy = records[f"memcpy_{n}x{n}_f32"]
        memcpy_bw = memcpy["bytes"] / memcpy["median_s"]
        for kind in ("quant", "dequant"):
            for tag in ("f32", "bf16"):
                name = f"nf4_{kind}_{n}x{n}_{tag}"
                r = records[name]
                bw = r["bytes"] / r["median_s"]
                row = {"name": name, "kqlora_s": r["median_s"], "torchao_s": torchao[name],
                       "speedup": torchao[name] / r["median_s"],
                       "fraction_of_memcpy_bw": bw / memcpy_bw}
                rows.append(row)
                print(f"{name:30} {1e3 * r['median_s']:10.2f} {1e3 * torchao[name]:11.1f} "
                      f"{row['speedup']:8.1f}x {100 * row['fraction_of_memcpy_bw']:11.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
