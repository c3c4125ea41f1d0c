#!/usr/bin/env python3
"""The GPU check's benchmark sections (tools/gpu_check.sh; docs/GPU.md), in markdown on
standard output, from the JSON files kqlora-bench and tools/gpu_bench_torch.py wrote in OUT:

    python3 tools/gpu_report_benchmarks.py OUT BACKEND     the step, NF4, the QLoRA linear
    python3 tools/gpu_report_benchmarks.py --launches OUT  launches a training step

The first exits 1 when BACKEND is cuda and a target is not met: NF4 dequantization at
>= 0.8 of a device copy's bandwidth, the QLoRA linear within 1.3x torch's bfloat16 linear.
The second reads launches_1.json and launches_2.json (the 135M shape with 1 and 2 layers):
one layer is their difference, the rest (embedding, LM head, loss, optimizer, less what the
first layer skips) the 1-layer run less a layer, and the 30-layer model the rest plus 30
layers."""
import json
import re
import sys

# H100/H200 dense peaks: float32 on the CUDA cores, bfloat16 on the tensor cores (TFLOP/s).
PEAK_F32, PEAK_BF16 = 67.0, 989.0
LAYERS_135M = 30


def load(path):
    try:
        return {r["name"]: r for r in json.load(open(path))}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def first(records, prefix, suffix=""):
    return next((r for n, r in records.items() if n.startswith(prefix) and n.endswith(suffix)), None)


def benchmarks(out, backend):
    lin = load(out + "/bench_linear.json")
    llama = load(out + "/bench_llama.json")
    llama.update(load(out + "/bench_llama_bf16.json"))
    print("## Benchmarks\n")
    bad = 0
    cp, dq = first(lin, "memcpy_"), first(lin, "nf4_dequant_", "_f32")
    if cp and dq:
        def bw(r):
            return r["bytes"] / r["median_s"] / 1e9
        share = bw(dq) / bw(cp)
        ok = share >= 0.8
        bad += backend == "cuda" and not ok
        print("- NF4 dequantization (%s, float32): %.0f GB/s against a device copy's %.0f GB/s: "
              "%.2f (target >= 0.8: %s)" % (dq["name"], bw(dq), bw(cp), share, "met" if ok else "NOT met"))
    ql = first(lin, "qlora_linear_fwd_bwd_t")
    try:
        tl = json.load(open(out + "/torch_linear.json"))
    except (OSError, ValueError):
        tl = None
    if ql and tl:
        r = ql["median_s"] / tl["median_s"]
        ok = r <= 1.3
        bad += backend == "cuda" and not ok
        print("- QLoRA linear (%d, rank 16, %d tokens, forward + backward) %.3f ms against torch's "
              "bfloat16 dense linear (forward + input gradient) %.3f ms on %s: %.2fx (target <= 1.3x: %s)"
              % (tl["dim"], tl["tokens"], 1e3 * ql["median_s"], 1e3 * tl["median_s"], tl["device"], r,
                 "met" if ok else "NOT met"))
    dl = first(lin, "dense_lora_linear_fwd_bwd_t")
    if ql and dl:
        print("- the same QLoRA linear against kqlora's dense float32 LoRA linear: %.2fx"
              % (ql["median_s"] / dl["median_s"]))
    for name in sorted(llama):
        m = re.match(r"llama_fwd_bwd_(\w+?)_b(\d+)_t(\d+)", name)
        if not m:
            continue
        r, tokens = llama[name], int(m.group(2)) * int(m.group(3))
        fl = r["flops"] / r["median_s"]
        print("- %s (%s, %s x %s tokens): %.1f ms, %.0f tokens/s, %.2f TFLOP/s of model FLOPs: MFU "
              "%.1f%% of float32 (%.0f TFLOP/s), %.2f%% of bfloat16 tensor cores (%.0f)"
              % (name, "bfloat16" if "bf16" in name else "float32", m.group(2), m.group(3),
                 1e3 * r["median_s"], tokens / r["median_s"], fl / 1e12, 100 * fl / (PEAK_F32 * 1e12),
                 PEAK_F32, 100 * fl / (PEAK_BF16 * 1e12), PEAK_BF16))
    if not (lin or llama):
        print("- no benchmark ran (logs/bench_*.log)")
    return 1 if bad else 0


# kqlora-bench's counts of one step (fences: Kokkos >= 3.6 reports them).
COUNTS = ("kernel_launches", "gemm_calls", "deep_copies", "fences")


def launches(out):
    runs = {}
    for n in (1, 2):
        r = first(load("%s/launches_%d.json" % (out, n)), "llama_fwd_bwd_")
        if r and all(k in r for k in COUNTS[:3]):
            runs[n] = r
    print("## Launches a training step (135M shape, 1 x 256 tokens, float32)\n")
    if len(runs) < 2:
        print("- not measured (logs/launches.log)")
        return 0
    # (the first layer needs no input gradient for the frozen embedding: what it skips counts
    # against the rest, which can then be negative)
    print("| per step | 1 layer | the rest (embedding, LM head, optimizer, less what layer 0 "
          "skips) | %d layers |" % LAYERS_135M)
    print("|---|---|---|---|")
    for k in (k for k in COUNTS if k in runs[1] and k in runs[2]):
        layer = runs[2][k] - runs[1][k]
        rest = runs[1][k] - layer
        print("| %s | %g | %g | %g |" % (k.replace("_", " "), layer, rest, rest + LAYERS_135M * layer))
    return 0


if __name__ == "__main__":
    a = sys.argv[1:]
    if not a or a[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if a else 2)
    sys.exit(launches(a[1]) if a[0] == "--launches" else benchmarks(a[0], a[1] if len(a) > 1 else "cuda"))
