#!/usr/bin/env python3
"""A seeded synthetic instruction task whose success can be measured: multi-digit addition
with a fixed answer format, as JSON lines for tools/tokenize_sft.py.

    python3 tools/gen_arithmetic.py OUT_DIR [--train 2000] [--eval 200] [--digits 3] [--seed 7]

Writes OUT_DIR/train.jsonl and OUT_DIR/eval.jsonl: {"instruction": "What is 347 + 589?
Answer with the number only.", "response": "936"}. The splits share no (a, b) pair; the
same seed gives the same files. The answer is right when the model's reply, stripped, is
the response exactly.

OUT_DIR is created when missing and may hold other files (the run's token files beside
them); each JSON lines file is written to a temporary name beside it and renamed, so a
failed write (exit 1) or a kill leaves an earlier file whole (tools/safe_output.py). An
OUT_DIR that is a file, or a train.jsonl or eval.jsonl in it that is a directory, is
refused up front (exit 2).
"""
import argparse
import json
import os
import random

from safe_output import check_output_file, fail, file_output


def distinct_pairs(rng, lo, hi, n):
    """n distinct (a, b) pairs of integers in [lo, hi], in the order drawn."""
    seen, pairs = set(), []
    while len(pairs) < n:
        p = (rng.randint(lo, hi), rng.randint(lo, hi))
        if p not in seen:
            seen.add(p)
            pairs.append(p)
    return pairs


def output_paths(out, names):
    """OUT_DIR/NAME.jsonl for each name, checked before any work: OUT_DIR a directory
    (created when missing), each file's place writable and not a directory."""
    if os.path.lexists(out) and not os.path.isdir(out):
        fail("OUT_DIR %s is not a directory" % out)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        fail("OUT_DIR %s: cannot create it (%s)" % (out, e.strerror or e))
    paths = [os.path.join(out, name + ".jsonl") for name in names]
    for path in paths:
        check_output_file("OUT_DIR", path)
    return paths


def write_jsonl(path, items):
    """One JSON object a line, written to a temporary name and renamed over `path`."""
    with file_output(path, "w") as f:
        for item in items:
            f.write(json.dumps(item) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--eval", type=int, default=200)
    ap.add_argument("--digits", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    if args.eval < 1 or args.train < 1 or args.digits < 1:
        raise SystemExit("gen_arithmetic: --train, --eval and --digits must be positive")
    lo, hi = 10 ** (args.digits - 1), 10 ** args.digits - 1
    if (hi - lo + 1) ** 2 < args.train + args.eval:
        raise SystemExit("gen_arithmetic: not enough distinct pairs at %d digits" % args.digits)
    paths = output_paths(args.out, ("train", "eval"))
    pairs = distinct_pairs(random.Random(args.seed), lo, hi, args.train + args.eval)
    for path, part in zip(paths, (pairs[:args.train], pairs[args.train:])):
        write_jsonl(path,
                    [{"instruction": "What is %d + %d? Answer with the number only." % (a, b),
                      "response": str(a + b)} for a, b in part])
    print("gen_arithmetic: %s: %d train, %d eval items (%d digits, seed %d)"
          % (args.out, args.train, args.eval, args.digits, args.seed))


if __name__ == "__main__":
    main()
