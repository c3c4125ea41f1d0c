#!/usr/bin/env python3
"""A kqlora GGUF in llama.cpp (through llama-cpp-python), against transformers on the
Hugging Face directory of the same weights (docs/GGUF.md, "Checked by llama.cpp").

    python3 tools/llama_cpp_eval.py --gguf MODEL.gguf --hf-dir MERGED_DIR \\
        [--eval-jsonl eval.jsonl] [--show 3] [--max-new-tokens 8] [--json OUT]

MERGED_DIR is `kqlora-export CKPT --merged DIR` (or --base DIR for `--gguf-of base`): the
same weights as an HF directory, with the tokenizer. In float32, one thread:
  logits     a fixed chat-templated token sequence through both: the max abs difference
             of the logits at every position, and whether the argmax agrees wherever
             transformers' top-2 margin exceeds 1e-3 (float32 KV cache in llama.cpp);
  greedy     the first --check-prompts eval prompts (the chat template's generation
             prompt, tokenized with special tokens and at most one BOS: the tokenizer's
             own rule), greedy in both (top_k 1, temperature 0, no repeat penalty): the
             same new tokens, up to --max-new-tokens or the end of the turn;
  answers    with --eval-jsonl (tools/gen_arithmetic.py's items): llama.cpp's greedy
             reply to every item, exact match against "response" (as
             tools/eval_adapter.py scores transformers), the first --show printed.
Prints each and one line of JSON (--json writes it too); --require-match makes the logits
and greedy comparisons a check (exit 1 when they differ). A --json that is one of the
inputs or inside MERGED_DIR (links, hard links and ".." included), a directory, or in a
missing directory is refused before anything is loaded (exit 2); it is written to a
temporary name and renamed (tools/safe_output.py). Needs llama-cpp-python (bash
tools/install_llama_cpp.sh: .venv-tools, which this script re-runs itself under), torch
and transformers.
"""
import argparse
import json
import os
import subprocess
import sys

from safe_output import check_output_file, file_output

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-tools")


def need_llama_cpp():
    """llama_cpp, or this script run again under .venv-tools where that has it."""
    try:
        import llama_cpp
        return llama_cpp
    except ImportError:
        py = os.path.join(VENV, "bin", "python")
        if os.path.exists(py) and os.path.realpath(sys.prefix) != os.path.realpath(VENV) and \
                subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
            os.execv(py, [py] + sys.argv)
        sys.exit("llama_cpp_eval.py: needs llama-cpp-python (bash tools/install_llama_cpp.sh)")


def prompt_ids(tok, question, answer=None):
    """The chat template's tokens for a question (and its answer), at most one BOS."""
    messages = [{"role": "user", "content": question}]
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    text = tok.apply_chat_template(messages, tokenize=False,
                                   add_generation_prompt=answer is None)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    bos = tok.bos_token_id
    # The tokenizer's own rule for BOS (a template that writes it keeps its one).
    with_special = tok(text)["input_ids"]
    if bos is not None and with_special[:1] == [bos] and ids[:1] != [bos]:
        ids = [bos] + ids
    return ids


def llama_greedy(llm, ids, max_new, stops):
    out = []
    for t in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                          reset=True):
        if t in stops or len(out) == max_new:
            break
        out.append(int(t))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--hf-dir", required=True)
    ap.add_argument("--eval-jsonl", default=None)
    ap.add_argument("--show", type=int, default=3)
    ap.add_argument("--check-prompts", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--label", default=None, help="the name printed (default: the file's)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--require-match", action="store_true")
    args = ap.parse_args()
    if args.json:
        check_output_file("--json", args.json, [args.gguf, args.hf_dir, args.eval_jsonl])
    llama_cpp = need_llama_cpp()
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    label = args.label or os.path.basename(args.gguf)
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.hf_dir)
    hf = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32).eval()
    llm = llama_cpp.Llama(model_path=args.gguf, n_ctx=512, n_batch=512, n_threads=1,
                          logits_all=True, verbose=False, type_k=llama_cpp.GGML_TYPE_F32,
                          type_v=llama_cpp.GGML_TYPE_F32)
    items = [json.loads(l) for l in open(args.eval_jsonl)] if args.eval_jsonl else []
    questions = [it["instruction"] for it in items] or \
        ["What is 12 + 30? Answer with the number only.", "Name a colour.",
         "Write one sentence about the sea."]
    eot = {t for t in (tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>"),
                       tok.convert_tokens_to_ids("<|eot_id|>"),
                       tok.convert_tokens_to_ids("<end_of_turn>")) if isinstance(t, int) and
           t >= 0 and t != tok.unk_token_id}
    eot |= {int(llm.token_eos())}

    # Logits over a fixed sequence: the first question with its answer (or "42").
    seq = prompt_ids(tok, questions[0], items[0]["response"] if items else "42")
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([seq])).logits[0].double().numpy()
    llm.reset()
    llm.eval(seq)
    got = np.array(llm.scores[:len(seq)], dtype=np.float64)
    diff = float(np.abs(got - ref).max())
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1e-3
    argmax_bad = int(((got.argmax(1) != ref.argmax(1)) & clear).sum())
    print("%s: logits over %d tokens: max abs diff %.3g (logits span %.1f); argmax differs at "
          "%d of %d positions with a top-2 margin > 1e-3"
          % (label, len(seq), diff, float(ref.max() - ref.min()), argmax_bad, int(clear.sum())))

    # Greedy generation, token for token.
    same = 0
    checked = questions[:args.check_prompts]
    for q in checked:
        ids = prompt_ids(tok, q)
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens,
                              do_sample=False, eos_token_id=sorted(eot),
                              pad_token_id=tok.pad_token_id or tok.eos_token_id)
        want = [int(t) for t in out[0, len(ids):] if int(t) not in eot]
        got_ids = llama_greedy(llm, ids, args.max_new_tokens, eot)
        same += got_ids == want
        if got_ids != want:
            print("%s: greedy differs on %r: llama.cpp %s, transformers %s"
                  % (label, q, got_ids, want))
    print("%s: greedy generation: the same tokens on %d of %d chat prompts"
          % (label, same, len(checked)))

    result = {"gguf": args.gguf, "logits_max_abs_diff": diff, "argmax_differs": argmax_bad,
              "greedy_same": same, "greedy_prompts": len(checked)}
    if items:
        right = 0
        for i, it in enumerate(items):
            reply = tok.decode(llama_greedy(llm, prompt_ids(tok, it["instruction"]),
                                            args.max_new_tokens, eot),
                               skip_special_tokens=True).strip()
            right += reply == it["response"].strip()
            if i < args.show:
                print("%s:   Q: %s\n%s:   A (llama.cpp): %r   expected %r"
                      % (label, it["instruction"], label, reply, it["response"]))
        result["exact_match"] = 100.0 * right / len(items)
        print("%s: exact match through llama.cpp: %.1f%% of %d" % (label, result["exact_match"],
                                                                   len(items)))
    line = json.dumps(result)
    print("llama_cpp_eval: " + line)
    if args.json:
        with file_output(args.json, "w") as f:
            f.write(line + "\n")
    if args.require_match and (argmax_bad or same != len(checked)):
        sys.exit(1)


if __name__ == "__main__":
    main()
