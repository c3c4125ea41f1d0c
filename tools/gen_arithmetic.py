#!/usr/bin/env python3
"""A seeded synthetic instruction task whose success can be measured: multi-digit addition
with a fixed answer format, as JSON lines for tools/tokenize_sft.py.

    python3 tools/gen_arithmetic.py OUT_DIR [--train 2000] [--eval 200] [--digits 3] [--seed 7]

Writes OUT_DIR/train.jsonl and OUT_DIR/eval.jsonl: {"instruction": "What is 347 + 589?
Answer with the number only.", "response": "936"}. The splits share no (a, b) pair; the
same seed gives the same files. The answer is right when the model's reply, stripped, is
the response exactly.
"""
import argparse
import json
import os
import random


def distinct_pairs(rng, lo, hi, n):
    """n distinct (a, b) pairs of integers in [lo, hi], in the order drawn."""
    seen, pairs = set(), []
    while len(pairs) < n:
        p = (rng.randint(lo, hi), rng.randint(lo, hi))
        if p not in seen:
            seen.add(p)
            pairs.append(p)
    return pairs


def write_jsonl(path, items):
    with open(path, "w") as f:
        for item in items:
            f.write(json.dumps(item) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--eval", type=int, default=200)
    ap.add_argument("--digits", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    if args.eval < 1 or args.train < 1 or args.digits < 1:
        raise SystemExit("gen_arithmetic: --train, --eval and --digits must be positive")
    lo, hi = 10 ** (args.digits - 1), 10 ** args.digits - 1
    if (hi - lo + 1) ** 2 < args.train + args.eval:
        raise SystemExit("gen_arithmetic: not enough distinct pairs at %d digits" % args.digits)
    pairs = distinct_pairs(random.Random(args.seed), lo, hi, args.train + args.eval)
    os.makedirs(args.out, exist_ok=True)
    for name, part in (("train", pairs[:args.train]), ("eval", pairs[args.train:])):
        write_jsonl(os.path.join(args.out, name + ".jsonl"),
                    [{"instruction": "What is %d + %d? Answer with the number only." % (a, b),
                      "response": str(a + b)} for a, b in part])
    print("gen_arithmetic: %s: %d train, %d eval items (%d digits, seed %d)"
          % (args.out, args.train, args.eval, args.digits, args.seed))


if __name__ == "__main__":
    main()
