#!/usr/bin/env python3
"""A SmolLM2 fine-tune's GGUF in llama.cpp against transformers (ctest gguf_smollm2):

    python3 tests/check_gguf_smollm2.py KQLORA_TRAIN KQLORA_EXPORT MODEL_DIR WORKDIR

MODEL_DIR is tools/get_smollm2.py's SmolLM2-135M-Instruct directory. kqlora-train runs 3
AdamW steps on rows of its chat template (LoRA on every projection), kqlora-export writes
--merged and --gguf (f32); tools/llama_cpp_eval.py --require-match then checks llama.cpp's
logits over a chat-templated sequence (argmax equal wherever transformers' top-2 margin
exceeds 1e-3; the max abs difference printed and bounded here by 1e-3 of the logits'
span) and its greedy tokens from chat prompts (top_k 1, temperature 0, no repeat penalty)
equal to transformers' on --merged. Exit 77 (ctest: skipped) without the model directory,
llama-cpp-python (tools/install_llama_cpp.sh), torch, transformers or h5py.
"""
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv-tools", "bin", "python")
NEED = "import llama_cpp, torch, transformers, h5py"


def main():
    train, export, model, work = sys.argv[1:5]
    if not os.path.exists(os.path.join(model, "config.json")):
        print("SKIPPED: no %s (python3 tools/get_smollm2.py %s)" % (model, model))
        return 77
    py = sys.executable
    if subprocess.run([py, "-c", NEED], capture_output=True).returncode != 0:
        py = VENV_PY
        if not os.path.exists(py) or \
                subprocess.run([py, "-c", NEED], capture_output=True).returncode != 0:
            print("SKIPPED: no llama_cpp with torch, transformers and h5py "
                  "(bash tools/install_llama_cpp.sh)")
            return 77
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data.h5")
    # Rows of the chat template (the tokenizer's own rendering), every token scored.
    subprocess.run([py, "-c", r'''
import sys, h5py, numpy as np
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
rows = []
for a, b in [(12, 30), (7, 88), (100, 23), (5, 5)]:
    m = [{"role": "user", "content": "What is %d + %d?" % (a, b)},
         {"role": "assistant", "content": str(a + b)}]
    ids = tok.apply_chat_template(m, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    rows.append((ids + [tok.pad_token_id] * 64)[:64])
x = np.array(rows, dtype="int32")
with h5py.File(sys.argv[2], "w", libver=("v110", "v110")) as f:
    f["input_ids"] = x
    f["labels"] = x
''', model, data], check=True)
    deck = os.path.join(work, "deck.in")
    with open(deck, "w") as f:
        f.write("model = causal_lm\n")
    run = lambda *cmd: subprocess.run(cmd, check=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True).stdout
    run(train, deck, "hf_model_dir=" + model, "data_file=" + data, "num_steps=3",
        "global_bs=2", "lora_rank=8", "lora_alpha=16", "optimizer=adamw", "lr=1e-3",
        "save_dir=" + os.path.join(work, "ckpt"))
    ckpt = os.path.join(work, "ckpt")
    print(run(export, ckpt, "--merged", os.path.join(work, "merged")).strip().splitlines()[-1])
    print(run(export, ckpt, "--gguf", os.path.join(work, "f32.gguf"), "--gguf-type",
              "f32").strip())
    out = os.path.join(work, "eval.json")
    p = subprocess.run([py, os.path.join(ROOT, "tools", "llama_cpp_eval.py"), "--gguf",
                        os.path.join(work, "f32.gguf"), "--hf-dir", os.path.join(work, "merged"),
                        "--check-prompts", "4", "--max-new-tokens", "12", "--json", out,
                        "--require-match"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    print("\n".join(l for l in p.stdout.splitlines() if "f32.gguf" in l or "llama_cpp_eval" in l))
    if p.returncode != 0 or not os.path.exists(out):
        print("FAILED: tools/llama_cpp_eval.py exit %d" % p.returncode)
        print(p.stdout[-3000:])
        return 1
    r = json.load(open(out))
    ok = r["argmax_differs"] == 0 and r["greedy_same"] == r["greedy_prompts"] and \
        r["logits_max_abs_diff"] <= 1e-3 * 60
    print("%s: logits max abs diff %.3g, argmax differs at %d, greedy %d of %d"
          % ("ok" if ok else "FAILED", r["logits_max_abs_diff"], r["argmax_differs"],
             r["greedy_same"], r["greedy_prompts"]))
    print("Passed!" if ok else "Failed!")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
