#!/usr/bin/env python3
"""tools/make_hf_model.py's directories are what kqlora and transformers read (ctest
make_hf_model_families):

    python3 tests/check_make_hf_model.py KQLORA_TRAIN WORKDIR [KQLORA_QUANTIZE]

For every family (gemma4: Gemma 4 as the hub ships it, its text decoder beside a vision
tower), the "tiny" preset in bfloat16 split over several shards (an index file):
transformers loads it with no missing or unexpected tensor (the tool's --check),
and kqlora-train imports it -- every tensor found and of the right shape -- and trains two
steps on random tokens in bfloat16 (both losses finite and positive: two steps show the
run works end to end). With KQLORA_QUANTIZE, --nf4-base too: a qwen3_moe directory of
config.json and base.h5 alone (each shard quantized and deleted as written) trains, with
init_file=base.h5, to the same losses, bit for bit, as the directory of safetensors. Exit 77 (ctest: skipped) with a message when torch,
transformers or h5py cannot be imported.
"""
import math
import os
import shutil
import subprocess
import sys

try:
    import h5py
    import numpy as np
    import torch  # noqa: F401  (the tool needs it)
    import transformers  # noqa: F401
except ImportError as e:
    print("SKIPPED: %s (pip install torch transformers h5py to run this test)" % e)
    sys.exit(77)
from tool_in_process import run_tool  # noqa: E402

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "qwen3_moe",
            "qwen2_moe", "mixtral", "olmoe", "smollm3", "olmo2", "olmo3", "granite",
            "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "gemma4_text", "gemma4"]


def main():
    train, work = sys.argv[1:3]
    quantize = sys.argv[3] if len(sys.argv) > 3 else None
    losses_of = {}
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ok = True
    for family in FAMILIES:
        model = os.path.join(work, family)
        # In this Python: torch and transformers imported once (tests/tool_in_process.py).
        status, log = run_tool("make_hf_model", [model, "--family", family, "--preset", "tiny",
                                                 "--dtype", "bf16", "--shard-mb", "0.1", "--check"])
        if status != 0:
            print("FAILED: make_hf_model.py %s\n%s" % (family, log))
            ok = False
            continue
        shards = [f for f in os.listdir(model) if f.endswith(".safetensors")]
        index = os.path.exists(os.path.join(model, "model.safetensors.index.json"))
        import json
        cfg = json.load(open(os.path.join(model, "config.json")))
        vocab = cfg.get("text_config", cfg)["vocab_size"]  # (a multimodal one's: its decoder's)
        data = os.path.join(work, family + "_data.h5")
        ids = np.random.default_rng(7).integers(1, vocab, size=(4, 40)).astype(np.int32)
        with h5py.File(data, "w", libver=("v110", "v110")) as f:
            f["input_ids"] = ids
            f["labels"] = ids
        deck = os.path.join(work, "deck.in")
        with open(deck, "w") as f:
            f.write("model = causal_lm\n")
        run, losses = train_two_steps(train, deck, model, data)
        losses_of[family] = (losses, data)
        passed = run.returncode == 0 and len(shards) > 1 and index and len(losses) == 2 \
            and all(math.isfinite(x) and x > 0 for x in losses)
        print("%s: %s (%d shards; losses %s)" % ("ok" if passed else "FAILED", family,
                                                len(shards), losses))
        if not passed:
            print(run.stdout[-3000:])
        ok &= passed
    if quantize and "qwen3_moe" in losses_of:
        ok &= check_nf4_base(train, quantize, work, *losses_of["qwen3_moe"])
    print("Passed!" if ok else "Failed!")
    return 0 if ok else 1


def train_two_steps(train, deck, model, data, *extra):
    run = subprocess.run([train, deck, "hf_model_dir=" + model, "data_file=" + data,
                          "dtype=bfloat16", "global_bs=2", "num_steps=2", "lora_rank=4",
                          "block_size=32", "scaler_block_size=32", "optimizer=adamw",
                          "lr=1e-3", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    return run, [float(l.split()[3]) for l in run.stdout.splitlines()
                 if l.startswith("step ") and " loss " in l]


def check_nf4_base(train, quantize, work, want, data):
    model = os.path.join(work, "qwen3_moe_nf4")
    status, log = run_tool("make_hf_model", [model, "--family", "qwen3_moe", "--preset", "tiny",
                                             "--dtype", "bf16", "--shard-mb", "0.1",
                                             "--nf4-base", quantize, "--block-size", "32",
                                             "--scaler-block-size", "32"])
    if status != 0:
        print("FAILED: make_hf_model.py --nf4-base\n%s" % log)
        return False
    files = sorted(os.listdir(model))
    run, losses = train_two_steps(train, os.path.join(work, "deck.in"), model, data,
                                  "init_file=" + os.path.join(model, "base.h5"))
    passed = run.returncode == 0 and files == ["base.h5", "config.json"] and losses == want
    print("%s: --nf4-base: %s, losses %s (the safetensors directory's %s)"
          % ("ok" if passed else "FAILED", files, losses, want))
    if not passed:
        print(run.stdout[-3000:])
    return passed


if __name__ == "__main__":
    sys.exit(main())
