#!/usr/bin/env python3
"""Instruction/response pairs (JSON lines) -> kqlora's token data file (docs/MODELS.md).

    python3 tools/tokenize_sft.py --model models/SmolLM2-135M-Instruct \\
        --input train.jsonl --output train.h5 --max-len 128 [--system TEXT]

Each input line is a JSON object with "instruction" and "response" (strings). With the
model directory's tokenizer and chat template:
  prompt  = the rendering of [system?, user: instruction] with add_generation_prompt
  full    = the rendering of [system?, user: instruction, assistant: response]
The prompt must be a token prefix of the full rendering (an example where it is not is
refused and counted). Labels: -100 for the prompt's tokens; the response's tokens and the
template's end-of-turn token after it (SmolLM2: <|im_end|>) are labelled; whatever the
template appends after that end-of-turn token (a newline) is dropped. Rows are padded on
the right to --max-len with the tokenizer's pad id (its EOS when it has none), labelled
-100; examples longer than --max-len are dropped and counted.

System prompt: without --system no system message is passed, and the template does what
it does then -- SmolLM2's inserts its default system prompt ("You are a helpful AI
assistant named SmolLM, trained by Hugging Face"); the script prints the rendering of the
first example so this is visible. --system TEXT passes TEXT as the system message.

Output (HDF5): input_ids and labels int32 [N, max_len]; attributes vocab_size (int64,
config.json's) and tokenizer_sha256 (of tokenizer.json). Needs transformers and h5py.
"""
import argparse
import hashlib
import json
import os
import sys

import h5py
import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model directory")
    ap.add_argument("--input", required=True, help="JSON lines with instruction, response")
    ap.add_argument("--output", required=True, help="the HDF5 token file to write")
    ap.add_argument("--max-len", type=int, required=True, help="tokens per row")
    ap.add_argument("--system", default=None, help="a system message (default: none)")
    args = ap.parse_args()
    if args.max_len < 2:
        sys.exit("tokenize_sft: --max-len must be at least 2")

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.model)
    with open(os.path.join(args.model, "config.json")) as f:
        vocab_size = int(json.load(f)["vocab_size"])
    tokenizer_json = os.path.join(args.model, "tokenizer.json")
    sha = hashlib.sha256(open(tokenizer_json, "rb").read()).hexdigest() \
        if os.path.exists(tokenizer_json) else ""
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    if pad is None:
        sys.exit("tokenize_sft: the tokenizer has neither a pad nor an EOS token")
    eot = tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tok.get_vocab() \
        else tok.eos_token_id

    def render(messages, generation_prompt):
        out = tok.apply_chat_template(messages, tokenize=True,
                                      add_generation_prompt=generation_prompt)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    ids, labels = [], []
    too_long = not_prefix = 0
    with open(args.input) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                ex = json.loads(line)
                instruction, response = ex["instruction"], ex["response"]
            except (ValueError, KeyError, TypeError) as e:
                sys.exit("tokenize_sft: %s:%d: expected a JSON object with \"instruction\" and "
                         "\"response\" (%s)" % (args.input, n, e))
            messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
                [{"role": "user", "content": instruction}]
            prompt = render(messages, True)
            full = render(messages + [{"role": "assistant", "content": response}], False)
            if full[:len(prompt)] != prompt:
                not_prefix += 1
                continue
            # Up to and including the end-of-turn token after the response.
            ends = [i for i in range(len(prompt), len(full)) if full[i] == eot]
            if ends:
                full = full[:ends[0] + 1]
            if len(full) > args.max_len:
                too_long += 1
                continue
            row_labels = [-100] * len(prompt) + full[len(prompt):]
            padding = args.max_len - len(full)
            ids.append(full + [pad] * padding)
            labels.append(row_labels + [-100] * padding)
            if len(ids) == 1:
                print("tokenize_sft: first example as the model sees it:\n%s"
                      % tok.decode(full), flush=True)
    if not ids:
        sys.exit("tokenize_sft: no example left (%d too long, %d whose prompt is not a prefix)"
                 % (too_long, not_prefix))
    ids_a = np.array(ids, dtype=np.int32)
    if ids_a.max() >= vocab_size:
        sys.exit("tokenize_sft: token id %d >= vocab_size %d of %s/config.json"
                 % (ids_a.max(), vocab_size, args.model))
    # HDF5's 1.10 format: checksummed metadata (kqlora notes files without it).
    with h5py.File(args.output, "w", libver=("v110", "v110")) as h:
        h.create_dataset("input_ids", data=ids_a)
        h.create_dataset("labels", data=np.array(labels, dtype=np.int32))
        h.attrs["vocab_size"] = np.int64(vocab_size)
        h.attrs["tokenizer_sha256"] = sha
    scored = int((np.array(labels)[:, 1:] != -100).sum())
    print("tokenize_sft: %s: %d rows of %d tokens (%d scored labels); dropped %d longer than "
          "--max-len, refused %d whose prompt is not a token prefix"
          % (args.output, len(ids), args.max_len, scored, too_long, not_prefix))


if __name__ == "__main__":
    main()
