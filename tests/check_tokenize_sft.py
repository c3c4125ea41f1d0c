#!/usr/bin/env python3
"""tools/tokenize_sft.py on every input form, packing and --overlong (ctest tokenize_sft):

    python3 tests/check_tokenize_sft.py WORKDIR

A small word-level tokenizer with a ChatML template is built in WORKDIR (no download).
The expected rows are made here independently: each message's words encoded on their
own, in the template's order, the assistant turns' words and end-of-turn scored. Also: a
template that raises on a system message and one that renders an earlier turn without
its content are refused and counted; packed rows hold whole
examples with positions 0, 1, ... each and their first labels -100; a malformed line exits
2 naming the file and line; an --output that is the data file or a file of the model
directory is refused (exit 2) and leaves it as it was. Issue 49: every bad input (bytes that
are not UTF-8, a lone surrogate, JSON nested too deeply or of the wrong shape, a missing or
damaged model directory or config.json, --output a directory, in a missing or unwritable
directory, --input missing or a directory) exits 2 with its place and reason and no
traceback; an assistant turn's tool_calls are scored where the template renders them
(against a rendering made here) and the example is refused, never emptied, where it drops
them; refusals are counted under their reasons (role order, an empty turn); the file's
tokenizer_sha256 is tokenizer.json's; a write that fails (h5py failing as a full disk
would) exits 1 and leaves the earlier token file byte for byte. Exit 77 (ctest: skipped)
when transformers, tokenizers or h5py cannot be imported.
"""
import hashlib
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
from tool_in_process import _tool, run_tool  # noqa: E402

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "tokenize_sft.py")
SPECIALS = ["<pad>", "<s>", "<|im_start|>", "<|im_end|>", "[UNK]"]
WORDS = ("system user assistant you are kind hello there how is it going fine thanks and you "
         "good what is two plus three five the sky blue once upon a time story end ok "
         "call tool").split()
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NO_SYSTEM = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
             "supported') }}{% endif %}" + CHATML)
# Earlier assistant turns rendered without their content: not a prefix of the next turn's.
HISTORY = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' "
           "and not loop.last %}ok{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n"
           "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# ChatML that renders an assistant's tool calls after its content: " call NAME ARGUMENTS".
WITH_CALLS = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
              "{% if m['tool_calls'] is defined %}{% for c in m['tool_calls'] %} call "
              "{{ c['function']['name'] }} {{ c['function']['arguments'] }}{% endfor %}"
              "{% endif %}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


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
            calls = "".join(" call %s %s" % (c["function"]["name"], c["function"]["arguments"])
                            for c in m.get("tool_calls", ()))
            turn = [S] + ids(m["role"]) + ids(m["content"] + calls) + [E]
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
                             (HISTORY, "the chat's rendering does not show an assistant "
                                       "turn's text in its span")):
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
    with h5py.File(out) as h:
        sha = h.attrs["tokenizer_sha256"]
    sha = sha.decode() if isinstance(sha, bytes) else sha
    want_sha = hashlib.sha256(open(os.path.join(model, "tokenizer.json"), "rb").read()).hexdigest()
    check(sha == want_sha, "tokenizer_sha256 %r, tokenizer.json's is %s" % (sha, want_sha))
    # The definition (the trainer's is the same): tokenizer.json, else tokenizer.model, else "".
    hashed = _tool("tokenize_sft").tokenizer_sha256
    both = os.path.join(work, "hashed")
    os.makedirs(both)
    for name, data in (("tokenizer.model", b"sentencepiece"), ("vocab.json", b"{}")):
        with open(os.path.join(both, name), "wb") as f:
            f.write(data)
    check(hashed(both) == hashlib.sha256(b"sentencepiece").hexdigest(),
          "tokenizer_sha256 without tokenizer.json: %s" % hashed(both))
    with open(os.path.join(both, "tokenizer.json"), "wb") as f:
        f.write(b"{}")
    check(hashed(both) == hashlib.sha256(b"{}").hexdigest(),
          "tokenizer_sha256 with both: %s" % hashed(both))
    os.remove(os.path.join(both, "tokenizer.json"))
    os.remove(os.path.join(both, "tokenizer.model"))
    check(hashed(both) == "", "tokenizer_sha256 of neither: %r" % hashed(both))
    # A write that fails as a full disk would (h5py raising ENOSPC halfway through) exits 1
    # naming the file, leaves the earlier token file byte for byte and no temporary file.
    before = open(out, "rb").read()
    real_file = h5py.File

    def full_disk(path, *a, **k):
        with open(path, "wb") as f:
            f.write(b"\x89HDF\r\n\x1a\n partial")
        raise OSError(28, "No space left on device")
    h5py.File = full_disk
    try:
        status, log = run_tool("tokenize_sft", ["--model", model, "--input", src, "--output", out,
                                                "--max-len", str(T)])
    finally:
        h5py.File = real_file
    check(status == 1 and "writing %s failed" % out in log and "No space left" in log,
          "failed write: %d %s" % (status, log))
    check(open(out, "rb").read() == before, "the earlier token file was changed by a failed write")
    check(sorted(os.listdir(os.path.dirname(out))) == ["tokens.h5", "tokens.h5.jsonl"],
          "left beside the output after a failed write: %s" % os.listdir(os.path.dirname(out)))
    print("an output naming an input refused, inputs untouched, no temporary file left, "
          "tokenizer_sha256 tokenizer.json's (else tokenizer.model's, else \"\"), a failed "
          "write exit 1 with the earlier file whole: ok")

    # Tool calls: scored where the template renders them, refused where it drops them.
    call = {"type": "function", "function": {"name": "plus", "arguments": "two three"}}
    tool_chat = [{"role": "user", "content": "what is two plus three"},
                 {"role": "assistant", "content": "", "tool_calls": [call]},
                 {"role": "tool", "content": "five"},
                 {"role": "assistant", "content": "five"}]
    null_content = [dict(m, content=None) if "tool_calls" in m else m for m in tool_chat]
    with_text = [dict(m, content="ok") if "tool_calls" in m else m for m in tool_chat]
    tool_lines = [json.dumps({"messages": tool_chat}),
                  json.dumps({"messages": null_content, "tools": [{"type": "function",
                                                                   "function": {"name": "plus"}}]}),
                  json.dumps({"messages": with_text})]
    m_calls = os.path.join(work, "model_calls")
    make_model(m_calls, WITH_CALLS)
    out = os.path.join(work, "calls.h5")
    log = run(m_calls, tool_lines, out, "--max-len", str(T))
    d = read(out)
    check("3 examples read, 3 written" in log and "none dropped" in log, "tool calls: " + log)
    for r, msgs in enumerate((tool_chat, tool_chat, with_text)):
        toks, labels = expected_chat(msgs)
        n = len(toks)
        labels = [-100] + labels[1:]
        check(list(d["input_ids"][r, :n]) == toks and list(d["labels"][r, :n]) == labels,
              "tool call row %d: ids %s labels %s, expected %s %s" % (
                  r, list(d["input_ids"][r, :n]), list(d["labels"][r, :n]), toks, labels))
        check(ids("call plus two three")[0] in [y for y in labels if y != -100],
              "the call is not scored in row %d" % r)
    log = run(model, tool_lines + lines[:1], os.path.join(work, "dropped.h5"), "--max-len", str(T))
    check("refused: the chat template drops tool_calls: 3" in log and "none dropped" not in log
          and "4 examples read, 1 written" in log, "a template without tool calls: " + log)
    print("tool_calls: scored as the template renders them; refused (3 counted) where it drops "
          "them: ok")

    # Refusals under their reasons; an empty assistant turn is refused, not trained.
    user = {"role": "user", "content": "hello"}
    said = {"role": "assistant", "content": "fine"}
    system = {"role": "system", "content": "you are kind"}
    odd = [json.dumps({"messages": [said, user, said]}),
           json.dumps({"messages": [system, said, user, said]}),
           json.dumps({"messages": [user, system, said]}),
           json.dumps({"messages": [user, {"role": "tool", "content": "five"}, said]}),
           json.dumps({"messages": [user, {"role": "assistant", "content": ""}]}),
           json.dumps({"messages": [user]}),
           lines[0]]
    log = run(model, odd, os.path.join(work, "odd.h5"), "--max-len", str(T))
    for reason, count in (("role order: the chat does not open with a user turn", 2),
                          ("role order: a system message after the first turn", 1),
                          ("role order: a tool message without an assistant tool call before it",
                           1),
                          ("an empty assistant turn (no content, no tool call)", 1),
                          ("no assistant turn", 1)):
        check("refused: %s: %d" % (reason, count) in log,
              "reason %r x%d: %s" % (reason, count, log))
    check("7 examples read, 1 written" in log, "odd chats: " + log)
    check("template raises" not in log, "a refusal counted as the template's: " + log)
    print("refusals counted under their reasons (role order, an empty turn): ok")

    # Bad input: exit 2, the place and the reason, never a traceback.
    bad = os.path.join(work, "bad")
    os.makedirs(bad)
    good_line = json.dumps({"text": "hello"})

    cases = []

    def refused(what, argv, words, data=None, process=False):
        cases.append(what)
        if data is not None:
            with open(argv[argv.index("--input") + 1], "wb") as f:
                f.write(data)
        if process:
            p = subprocess.run([sys.executable, TOOL] + argv, capture_output=True, text=True)
            status, log = p.returncode, p.stdout + p.stderr
        else:
            status, log = run_tool("tokenize_sft", argv)
        check(status == 2 and all(w in log for w in words) and "Traceback" not in log
              and "tokenize_sft: error: " in log,
              "%s: exit %d (expected 2 with %s): %s" % (what, status, words, log))

    jl = os.path.join(bad, "data.jsonl")
    o = os.path.join(bad, "t.h5")
    args = lambda m=model, i=jl, out=o: ["--model", m, "--input", i, "--output", out,  # noqa: E731
                                         "--max-len", str(T)]
    line2 = lambda text: (good_line + "\n").encode() + text  # noqa: E731
    refused("not UTF-8", args(), ["data.jsonl:2:", "not UTF-8", "0xff"],
            line2(b'{"text": "caf\xff"}\n'), process=True)
    refused("a lone surrogate", args(), ["data.jsonl:2:", "lone surrogate", "\\ud800"],
            line2(b'{"text": "hello \\ud800 there"}\n'))
    refused("a lone surrogate in a chat", args(), ["data.jsonl:2:", "lone surrogate"],
            line2(json.dumps({"messages": [user, dict(said, content="\udc00")]}).encode() + b"\n"))
    refused("nested too deeply", args(), ["data.jsonl:2:", "nested too deeply"],
            line2(b"[" * 100000 + b"\n"))
    refused("not JSON", args(), ["data.jsonl:2:", "not JSON"], line2(b'{"text": \n'))
    refused("JSON but not an object", args(), ["data.jsonl:2:", "expected a JSON object"],
            line2(b"[1, 2]\n"))
    refused("content not a string", args(), ["data.jsonl:2:", "expected messages"],
            line2(json.dumps({"messages": [user, dict(said, content=["fine"])]}).encode() + b"\n"))
    refused("nested messages", args(), ["data.jsonl:2:", "expected messages"],
            line2(json.dumps({"messages": [[user, said]]}).encode() + b"\n"))
    refused("tool_calls not a list", args(), ["data.jsonl:2:", "tool_calls"],
            line2(json.dumps({"messages": [user, dict(said, tool_calls="plus")]}).encode() + b"\n"))
    refused("a call without a name", args(), ["data.jsonl:2:", "without a function name"],
            line2(json.dumps({"messages": [user, dict(said, tool_calls=[{"function": {}}])]})
                  .encode() + b"\n"))
    refused("tools not a list", args(), ["data.jsonl:2:", "\"tools\""],
            line2(json.dumps({"messages": [user, said], "tools": "plus"}).encode() + b"\n"))
    with open(jl, "w") as f:
        f.write(good_line + "\n")
    refused("--input missing", args(i=os.path.join(bad, "none.jsonl")),
            ["--input", "none.jsonl", "no such file"])
    refused("--input a directory", args(i=bad), ["--input", "is a directory"])
    refused("--model missing", args(m=os.path.join(bad, "no_model")),
            ["--model", "no_model", "no such directory"], process=True)
    empty_model = os.path.join(bad, "empty_model")
    os.makedirs(empty_model)
    with open(os.path.join(empty_model, "config.json"), "w") as f:
        json.dump({"vocab_size": 10}, f)
    refused("no tokenizer files", args(m=empty_model), ["empty_model", "no tokenizer files"])
    broken = os.path.join(bad, "broken_model")
    for name, config, words in (("no config", None, ["config.json", "no such file"]),
                                ("config not JSON", b"{vocab_size: 3", ["config.json", "not JSON"]),
                                ("config a list", b"[1]", ["config.json", "no vocab_size"]),
                                ("no vocab_size", b'{"model_type": "llama"}',
                                 ["config.json", "no vocab_size"]),
                                ("vocab_size a string", b'{"vocab_size": "40"}',
                                 ["config.json", "vocab_size is \"40\""])):
        shutil.rmtree(broken, ignore_errors=True)
        shutil.copytree(model, broken)
        os.remove(os.path.join(broken, "config.json"))
        if config is not None:
            with open(os.path.join(broken, "config.json"), "wb") as f:
                f.write(config)
        refused(name, args(m=broken), words)
    shutil.rmtree(broken)
    shutil.copytree(model, broken)
    with open(os.path.join(broken, "tokenizer.json"), "w") as f:
        f.write('{"model": ')
    refused("tokenizer.json damaged", args(m=broken), ["broken_model", "tokenizer does not load"])
    shutil.rmtree(broken)
    shutil.copytree(model, broken)
    with open(os.path.join(broken, "generation_config.json"), "w") as f:
        f.write("{eos")
    refused("generation_config.json not JSON", args(m=broken), ["generation_config.json",
                                                                "not JSON"])
    os.makedirs(os.path.join(bad, "a_dir"))
    refused("--output a directory", args(out=os.path.join(bad, "a_dir")),
            ["--output", "a_dir is an existing directory"])
    refused("--output in a missing directory", args(out=os.path.join(bad, "missing", "t.h5")),
            ["--output", "missing", "does not exist"])
    refused("--output under a file", args(out=os.path.join(jl, "t.h5")),
            ["--output", "is not a directory"])
    refused("--output where nothing can be written", args(out="/proc/kqlora_tokens.h5"),
            ["--output", "cannot write in /proc"])
    check(not os.path.exists(o), "a refused run wrote %s" % o)
    print("bad input: exit 2 with its place and reason, no traceback (%d cases): ok" % len(cases))


if __name__ == "__main__":
    main()
