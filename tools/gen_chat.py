#!/usr/bin/env python3
"""A seeded multi-turn chat task whose learning can be measured, as JSON lines of
{"messages": [...]} for tools/tokenize_sft.py (docs/FINETUNING.md, the chat example).

    python3 tools/gen_chat.py OUT_DIR [--train 600] [--eval 100] [--seed 11]

Each chat is a short running calculation: the user gives a 3-digit addition, the
assistant answers with the number only, then the user asks one to three follow-ups
("Now subtract 17.", "Now double it.", "Now add 250.") and each answer is the new number.
About half the chats open with a system message ("You are a calculator. Reply with the
number only."), the rest rely on the template's default. Every assistant turn is scored,
so the eval loss falls as the model learns the format and the arithmetic. The splits
share no opening pair; the same seed gives the same files. OUT_DIR and its files as
tools/gen_arithmetic.py's: each file written to a temporary name and renamed.
"""
import argparse
import random

from gen_arithmetic import distinct_pairs, output_paths, write_jsonl

SYSTEM = "You are a calculator. Reply with the number only."


def chat(rng, a, b):
    value = a + b
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": SYSTEM})
    msgs += [{"role": "user", "content": "What is %d + %d?" % (a, b)},
             {"role": "assistant", "content": str(value)}]
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(("add", "subtract", "double"))
        if kind == "double":
            value, ask = 2 * value, "Now double it."
        else:
            n = rng.randint(10, 299)
            value = value + n if kind == "add" else value - n
            ask = "Now %s %d." % (kind, n)
        msgs += [{"role": "user", "content": ask},
                 {"role": "assistant", "content": str(value)}]
    return {"messages": msgs}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--train", type=int, default=600)
    ap.add_argument("--eval", type=int, default=100)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args(argv)
    if args.train < 1 or args.eval < 1:
        raise SystemExit("gen_chat: --train and --eval must be positive")
    paths = output_paths(args.out, ("train", "eval"))
    rng = random.Random(args.seed)
    pairs = distinct_pairs(rng, 100, 999, args.train + args.eval)
    for path, part in zip(paths, (pairs[:args.train], pairs[args.train:])):
        write_jsonl(path, [chat(rng, a, b) for a, b in part])
    print("gen_chat: %s: %d train, %d eval chats (seed %d)"
          % (args.out, args.train, args.eval, args.seed))


if __name__ == "__main__":
    main()
