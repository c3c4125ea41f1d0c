#!/usr/bin/env python3
"""tools/tokenize_sft.py on every input form, packing and --overlong (ctest tokenize_sft):

    python3 tests/check_tokenize_sft.py WORKDIR

A small word-level tokenizer with a ChatML template is built in WORKDIR (no download).
The expected rows are made here independently: each message's words encoded on their
own, in the template's order, the assistant turns' words and end-of-turn scored. Also: a
template that raises on a system message and one that renders earlier turns differently
(as Qwen3's drops their reasoning) are refused and counted; packed rows hold whole
examples with positions 0, 1, ... each and their first labels -100; a malformed line exits
2 naming the file and line; an --output that is the data file or a file of the model
directory is refused (exit 2) and leaves it as it was. Exit 77 (ctest: skipped) when transformers, tokenizers or h5py
cannot be imported.
"""
import json
import os
import shutil
import subprocess
import sys

try:
    import h5py
    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
except ImportError as e:
    print("SKIPPED: %s (pip install transformers h5py to run this test)" % e)
    sys.exit(77)
from tool_in_process import run_tool  # noqa: E402

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "tokenize_sft.py")
SPECIALS = ["<pad>", "<s>", "<|im_start|>", "<|im_end|>", "[UNK]"]
WORDS = ("system user assistant you are kind hello there how is it going fine thanks and you "
         "good what is two plus three five the sky blue once upon a time story end ok").split()
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NO_SYSTEM = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
             "supported') }}{% endif %}" + CHATML)
# Earlier assistant turns rendered without their content: not a prefix of the next turn's.
HISTORY = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' "
           "and not loop.last %}ok{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n"
           "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_model(d, template):
    os.makedirs(d, exist_ok=True)
    vocab = {w: i for i, w in enumerate(dict.fromkeys(SPECIALS + WORDS))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<|im_end|>",
                                   unk_token="[UNK]",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = template
    fast.save_pretrained(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "vocab_size": len(vocab)}, f)
    return vocab


def run(model, lines, out, *flags, expect=0, process=False):
    """The tool's exit status checked, its output returned. In this Python (the imports paid
    once: tests/tool_in_process.py), or as a process when `process`."""
    src = out + ".jsonl"
    with open(src, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    argv = ["--model", model, "--input", src, "--output", out] + list(flags)
    if process:
        p = subprocess.run([sys.executable, TOOL] + argv, capture_output=True, text=True)
        status, log = p.returncode, p.stdout + p.stderr
    else:
        status, log = run_tool("tokenize_sft", argv)
    if status != expect:
        sys.exit("FAILED: %s exit %d (expected %d):\n%s" % (" ".join(flags), status, expect, log))
    return log


def read(out):
    with h5py.File(out) as h:
        return {k: np.array(h[k]) for k in h}


def check(cond, what):
    if not cond:
        sys.exit("FAILED: " + what)


def main():
    work = sys.argv[1]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model = os.path.join(work, "model")
    vocab = make_model(model, CHATML)
    ids = lambda text: [vocab[w] for w in text.split()]  # noqa: E731
    S, E, EOS = vocab["<|im_start|>"], vocab["<|im_end|>"], vocab["<|im_end|>"]

    def expected_chat(messages):
        """Independent rendering: ChatML by hand, the assistant turns scored."""
        toks, labels = [], []
        last = max(k for k, m in enumerate(messages) if m["role"] == "assistant")
        for m in messages[:last + 1]:
            turn = [S] + ids(m["role"]) + ids(m["content"]) + [E]
            scored = m["role"] == "assistant"
            toks += turn
            # The assistant turn's span: its content and end of turn (the header is prompt).
            labels += [-100] * 2 + (turn[2:] if scored else [-100] * (len(turn) - 2))
        return toks, labels

    chat = [{"role": "system", "content": "you are kind"},
            {"role": "user", "content": "hello there how is it going"},
            {"role": "assistant", "content": "fine thanks and you"},
            {"role": "user", "content": "what is two plus three"},
            {"role": "assistant", "content": "five"}]
    share = [{"from": {"system": "system", "user": "human", "assistant": "gpt"}[m["role"]],
              "value": m["content"]} for m in chat]
    lines = [json.dumps({"messages": chat}),
             json.dumps({"conversations": share}),
             json.dumps({"instruction": "what is two plus three", "response": "five"}),
             json.dumps({"prompt": "the sky is", "completion": "blue"}),
             json.dumps({"text": "once upon a time the end"}),
             json.dumps({"messages": chat + [{"role": "user", "content": "ok"}]})]
    T = 40
    out = os.path.join(work, "forms.h5")
    log = run(model, lines, out, "--max-len", str(T))
    d = read(out)
    check(set(d) == {"input_ids", "labels"}, "unpacked file has %s" % sorted(d))
    want = [expected_chat(chat), expected_chat(chat),
            expected_chat([{"role": "user", "content": "what is two plus three"},
                           {"role": "assistant", "content": "five"}]),
            (ids("the sky is blue") + [EOS], [-100] * 3 + ids("blue") + [EOS]),
            (ids("once upon a time the end") + [EOS], ids("once upon a time the end") + [EOS]),
            expected_chat(chat)]  # (a trailing user turn is not trained on)
    for r, (toks, labels) in enumerate(want):
        n = len(toks)
        check(list(d["input_ids"][r, :n]) == toks, "row %d ids %s != %s"
              % (r, list(d["input_ids"][r, :n]), toks))
        labels = [-100] + labels[1:]  # (a row's first label is never scored)
        check(list(d["labels"][r, :n]) == labels, "row %d labels %s != %s"
              % (r, list(d["labels"][r, :n]), labels))
        check((d["input_ids"][r, n:] == vocab["<pad>"]).all() and (d["labels"][r, n:] == -100).all(),
              "row %d padding" % r)
    check("6 examples read, 6 written" in log, "summary: " + log)
    print("forms: messages, conversations, instruction/response, prompt/completion, text: ok")

    # Packing: whole examples, positions 0, 1, ... each, first labels -100, padding 0/-100.
    out = os.path.join(work, "packed.h5")
    log = run(model, lines, out, "--max-len", str(T), "--pack")
    p = read(out)
    check(p["input_ids"].shape[0] < len(lines), "packing made %d rows" % p["input_ids"].shape[0])
    found = []
    for r in range(p["input_ids"].shape[0]):
        pos, at = p["position_ids"][r], 0
        while at < T:
            n = 1
            while at + n < T and pos[at + n] == n:
                n += 1
            check(pos[at] == 0 and p["labels"][r, at] == -100, "row %d document at %d" % (r, at))
            found.append((list(p["input_ids"][r, at:at + n]), list(p["labels"][r, at + 1:at + n])))
            at += n
    for toks, labels in want:
        doc = (toks, labels[1:])
        check(doc in found, "packed rows lack %s" % (toks,))
    print("packing: %d rows for %d examples, each whole with its positions: ok"
          % (p["input_ids"].shape[0], len(lines)))

    # --overlong: drop, truncate, split (pieces restart at 0; an unscored piece dropped).
    long_text = json.dumps({"text": " ".join(["hello"] * 25)})  # 26 tokens with the EOS
    prompt_only = json.dumps({"prompt": " ".join(["hello"] * 12), "completion": "ok"})  # 14
    short = json.dumps({"text": "hello there"})  # 3
    three = [long_text, prompt_only, short]
    out = os.path.join(work, "long.h5")
    log = run(model, three, out, "--max-len", "10")
    check(read(out)["input_ids"].shape[0] == 1 and "longer than --max-len: 2" in log, "drop: " + log)
    log = run(model, three, out, "--max-len", "10", "--overlong", "truncate")
    # The text's first 10 tokens kept; the prompt's first 10 score nothing: dropped.
    check(read(out)["input_ids"].shape[0] == 2 and "no scored label: 1" in log, "truncate: " + log)
    log = run(model, three, out, "--max-len", "10", "--overlong", "split", "--pack")
    d = read(out)
    # The text's pieces of 10, 10 and 6 (9, 9 and 5 scored), the prompt's last piece (two
    # prompt tokens, "ok" and the EOS: 2 scored) kept and its first dropped, the short text
    # (2 scored): 27 scored labels.
    check("no scored label (a split piece): 1" in log, "split: " + log)
    check(int((d["labels"][:, 1:] != -100).sum()) == 27, "split labels: " + log)
    check(d["input_ids"].shape[0] == 4, "split rows %d: %s" % (d["input_ids"].shape[0], log))
    print("--overlong drop, truncate, split: ok")

    # Refusals, by reason; a malformed line exits 2 naming the file and line.
    for template, reason in ((NO_SYSTEM, "the chat template raises (System role not supported)"),
                             (HISTORY, "a turn's rendering is not a token prefix of the chat's")):
        m = os.path.join(work, "model_refusing")
        shutil.rmtree(m, ignore_errors=True)
        make_model(m, template)
        log = run(m, lines[:3], os.path.join(work, "refused.h5"), "--max-len", str(T))
        check("refused: %s: 2" % reason in log, "refusal '%s': %s" % (reason, log))
    log = run(model, lines[:1] + ['{"messages": [{"role": "bot", "content": "hi"}]}'],
              os.path.join(work, "bad.h5"), "--max-len", str(T), expect=2, process=True)
    check("bad.h5.jsonl:2:" in log and "role" in log, "bad line: " + log)
    print("refusals counted by reason, a bad line refused with its place: ok")

    # No output destroys an input: --output as the data file or a file of the model directory
    # is refused (exit 2), both left byte for byte; a good write leaves no temporary file.
    src = os.path.join(work, "inputs.jsonl")
    with open(src, "w") as f:
        f.write("".join(line + "\n" for line in lines[:2]))
    for victim in (src, os.path.join(model, "tokenizer.json"), os.path.join(model, "config.json")):
        before = open(victim, "rb").read()
        status, log = run_tool("tokenize_sft", ["--model", model, "--input", src, "--output",
                                                victim, "--max-len", str(T)])
        check(status == 2 and "--output" in log, "output %s: exit %d: %s" % (victim, status, log))
        check(open(victim, "rb").read() == before, "%s was changed" % victim)
    out = os.path.join(work, "fresh", "tokens.h5")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    run(model, lines[:2], out, "--max-len", str(T))
    run(model, lines[:2], out, "--max-len", str(T))  # (over an earlier token file: allowed)
    check(sorted(os.listdir(os.path.dirname(out))) == ["tokens.h5", "tokens.h5.jsonl"],
          "left beside the output: %s" % os.listdir(os.path.dirname(out)))
    # A write that fails (here: into a folder that does not exist) exits 1 naming the file.
    status, log = run_tool("tokenize_sft", ["--model", model, "--input", src, "--output",
                                            os.path.join(work, "missing", "t.h5"), "--max-len", str(T)])
    check(status == 1 and "writing" in log and "missing/t.h5" in log, "failed write: %d %s" % (status, log))
    print("an output naming an input refused, inputs untouched, no temporary file left, a failed "
          "write exit 1: ok")


if __name__ == "__main__":
    main()
