#!/usr/bin/env python3
"""A base model and kqlora's adapters, evaluated with transformers and PEFT: before and after.

    python3 tools/eval_adapter.py --base BASE_DIR --adapter PEFT_DIR \\
        [--eval-jsonl eval.jsonl] --eval-h5 eval.h5 [--system TEXT] [--batch 50]

BASE_DIR is a Hugging Face model directory (`kqlora-export CKPT --base BASE_DIR`: the
dequantized NF4 base the adapters were trained on, with the tokenizer); PEFT_DIR is
`kqlora-export CKPT --peft PEFT_DIR`. For the base alone ("before") and the base with the
adapters ("after", PeftModel.from_pretrained), in float32:
  eval loss     the cross-entropy over every scored label of eval.h5 (tools/tokenize_sft.py's
                file) divided by their count -- kqlora's eval_loss
  exact match   the greedy reply (the chat template's generation prompt, as tokenize_sft.py
                renders it; up to --max-new-tokens, stopping at the end-of-turn token),
                stripped, equal to the item's "response", over every item of eval.jsonl
                (only with --eval-jsonl: chats have no single reply to match)
Prints both, their changes, and one line of JSON (--json FILE writes it too);
--require-loss-drop and --require-gain make it a check (exit 1 when not met). A --json that
is one of the inputs or inside BASE_DIR or PEFT_DIR (links, hard links and ".." included),
a directory, or in a missing directory is refused before anything is loaded (exit 2); it
is written to a temporary name and renamed (tools/safe_output.py).
"""
import argparse
import json
import sys
import time

from safe_output import check_output_file, file_output


def eval_loss(model, path, batch):
    import h5py
    import torch
    with h5py.File(path) as f:
        ids = torch.tensor(f["input_ids"][...], dtype=torch.long)
        labels = torch.tensor(f["labels"][...], dtype=torch.long)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(ids), batch):
            x, y = ids[i:i + batch], labels[i:i + batch]
            # The positions whose logits score a label (t scores y[t + 1]): the LM head runs
            # there only, and the rows stop after the last (as kqlora trims them).
            keep = (y[:, 1:] != -100).any(0).nonzero().flatten()
            if len(keep) == 0:
                continue
            width = int(keep.max()) + 2
            logits = model(input_ids=x[:, :width], logits_to_keep=keep).logits.float()
            target = y[:, keep + 1]
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100,
                reduction="sum").item()
            count += int((target != -100).sum())
    return total / count


def exact_match(model, tok, items, system, batch, max_new, eot):
    import torch
    right = 0
    tok.padding_side = "left"  # (generation continues each prompt at its end)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with torch.no_grad():
        for i in range(0, len(items), batch):
            prompts = []
            for ex in items[i:i + batch]:
                messages = ([{"role": "system", "content": system}] if system else []) + \
                    [{"role": "user", "content": ex["instruction"]}]
                prompts.append(tok.apply_chat_template(messages, tokenize=False,
                                                       add_generation_prompt=True))
            enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            out = model.generate(**enc, max_new_tokens=max_new, do_sample=False,
                                 eos_token_id=eot, pad_token_id=pad)
            for ex, row in zip(items[i:i + batch], out[:, enc["input_ids"].shape[1]:]):
                reply = tok.decode(row, skip_special_tokens=True).strip()
                right += reply == ex["response"].strip()
    return 100.0 * right / len(items)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="Hugging Face model directory")
    ap.add_argument("--adapter", required=True, help="PEFT adapter directory")
    ap.add_argument("--eval-jsonl", default=None,
                    help="instruction/response JSON lines (without: the eval loss only)")
    ap.add_argument("--eval-h5", required=True, help="the same items as a token file")
    ap.add_argument("--system", default=None, help="the system message tokenize_sft.py used")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--json", default=None, help="also write the result line here")
    ap.add_argument("--require-loss-drop", type=float, default=None, metavar="PERCENT",
                    help="exit 1 unless the eval loss falls by at least this much")
    ap.add_argument("--require-gain", type=float, default=None, metavar="POINTS",
                    help="exit 1 unless the exact match rises by at least this much")
    args = ap.parse_args()
    if args.json:
        check_output_file("--json", args.json,
                          [args.base, args.adapter, args.eval_jsonl, args.eval_h5])
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    items = [json.loads(l) for l in open(args.eval_jsonl) if l.strip()] if args.eval_jsonl \
        else None
    if items == []:
        sys.exit("eval_adapter: %s has no items" % args.eval_jsonl)
    if items is None and args.require_gain is not None:
        sys.exit("eval_adapter: --require-gain needs --eval-jsonl")
    tok = AutoTokenizer.from_pretrained(args.base)
    eot = tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tok.get_vocab() \
        else tok.eos_token_id
    base = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, args.adapter)
    model.eval()
    result = {}
    for when in ("before", "after"):
        t0 = time.time()
        def measure():
            loss = eval_loss(model, args.eval_h5, args.batch)
            em = exact_match(model, tok, items, args.system, args.batch, args.max_new_tokens,
                             eot) if items else None
            return loss, em
        if when == "before":
            with model.disable_adapter():
                loss, em = measure()
        else:
            loss, em = measure()
        result[when] = {"eval_loss": loss, "exact_match": em}
        print("eval_adapter: %-6s eval loss %.4f%s (%.0f s)"
              % (when, loss, ", exact match %5.1f%% of %d" % (em, len(items)) if items else "",
                 time.time() - t0), flush=True)
    b, a = result["before"], result["after"]
    result["loss_drop_percent"] = 100.0 * (b["eval_loss"] - a["eval_loss"]) / b["eval_loss"]
    if items:
        result["exact_match_gain_points"] = a["exact_match"] - b["exact_match"]
        print("eval_adapter: eval loss down %.1f%%, exact match up %.1f points"
              % (result["loss_drop_percent"], result["exact_match_gain_points"]))
    else:
        print("eval_adapter: eval loss down %.1f%%" % result["loss_drop_percent"])
    line = json.dumps(result)
    print(line)
    if args.json:
        with file_output(args.json, "w") as f:
            f.write(line + "\n")
    met = True
    if args.require_loss_drop is not None:
        ok = result["loss_drop_percent"] >= args.require_loss_drop
        print("eval_adapter: eval loss down >= %g%%: %s" % (args.require_loss_drop,
                                                            "met" if ok else "NOT met"))
        met &= ok
    if args.require_gain is not None:
        ok = result["exact_match_gain_points"] >= args.require_gain
        print("eval_adapter: exact match up >= %g points: %s" % (args.require_gain,
                                                                 "met" if ok else "NOT met"))
        met &= ok
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
