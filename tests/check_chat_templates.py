#!/usr/bin/env python3
"""tools/tokenize_sft.py on the real chat templates of the 2026 families (ctest chat_templates):

    python3 tests/check_chat_templates.py WORKDIR

tests/data/chat_templates/ holds Qwen3's, Qwen3.5's and Gemma 4's templates verbatim (their
README says from where). Each is put in a model directory here with a small tokenizer made
for the test: the family's special tokens, a Qwen-style pre-tokenizer (words, punctuation
and newline runs each a piece) and a word-level vocabulary of the pieces the test's chats
render to, so nothing is unknown and decoding gives the text back. Through the tool, each
family's multi-turn chat (system, user, assistant with reasoning, user, assistant) must:
- render to the text written out below (what the template does, read off it by hand: Qwen3
  and Qwen3.5 drop an earlier turn's reasoning, keep the last one's, Qwen3 writes an empty
  <think> block into a last turn without reasoning, Gemma 4 shows no reasoning outside a
  tool-call turn);
- have as input_ids that text's pieces (split at the special tokens) encoded one by one;
- score exactly the spans written below as text: each turn as the whole chat's rendering
  shows it, from where the rendering leaves the turn's generation prompt through its end of
  turn (the module docstring of tools/tokenize_sft.py); decoding the scored runs gives the
  span texts, and the labels are the spans' pieces encoded one by one.
Also: a template with {% generation %} markers has exactly its marked text (and the end of
turn after it) scored, not what the common prefix rule would give; a chat whose rendering
drops a turn's content, and one whose template renders a turn's prompt otherwise in the
whole chat (a system message moved before the last user message, a span that would hold
a user's text), are refused, counted by their reasons. Exit 77 (ctest: skipped) when
transformers, tokenizers or h5py cannot be imported.
"""
import json
import os
import re
import shutil
import sys

try:
    import h5py
    import numpy as np
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
except ImportError as e:
    print("SKIPPED: %s (pip install transformers h5py to run this test)" % e)
    sys.exit(77)
from tool_in_process import run_tool  # noqa: E402

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "chat_templates")
# Qwen2's pre-tokenizer pattern: a word with the space before it, a digit, punctuation with
# the newlines after it, a run of newlines, spaces.
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
         r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN = {"special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "added": ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                  "</tool_response>"],
        "bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>"}
GEMMA4 = {"special": ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|channel>",
                      "<channel|>", "<|think|>", "<|tool_call>", "<tool_call|>",
                      "<|tool_response>", "<tool_response|>", "<|tool>", "<tool|>", '<|"|>'],
          "added": [], "bos": "<bos>", "eos": "<eos>", "pad": "<pad>"}

SYSTEM = {"role": "system", "content": "You are kind."}
HELLO = {"role": "user", "content": "Hello there."}
FINE = {"role": "assistant", "content": "Fine, thanks.", "reasoning_content": "The user greets me."}
ASK = {"role": "user", "content": "What is two plus three?"}
FIVE = {"role": "assistant", "content": "Five.", "reasoning_content": "Two plus three is five."}
CHAT = [SYSTEM, HELLO, FINE, ASK, FIVE]
# No reasoning fields: the first turn's reasoning inline in its content, none in the last.
INLINE = [SYSTEM, HELLO, {"role": "assistant", "content": "<think>\nThe user greets me.\n"
                                                          "</think>\n\nFine, thanks."},
          ASK, {"role": "assistant", "content": "Five."}]
CALL = {"role": "assistant", "content": "", "reasoning_content": "I should add.",
        "tool_calls": [{"type": "function",
                        "function": {"name": "plus", "arguments": {"a": 2, "b": 3}}}]}
TOOL_CHAT = [ASK, CALL, {"role": "tool", "name": "plus", "content": "5"},
             {"role": "assistant", "content": "Five."}]

# Each case: a chat and its rendering by hand, as (text, scored) pieces; the chat ends
# after its last assistant turn's end of turn.
CASES = [
    ("Qwen3, reasoning fields", "Qwen-Qwen3-0.6B.jinja", QWEN, CHAT, [
        ("<|im_start|>system\nYou are kind.<|im_end|>\n<|im_start|>user\nHello there.<|im_end|>\n"
         "<|im_start|>assistant\n", False),
        ("Fine, thanks.<|im_end|>", True),  # (its reasoning dropped: before the last query)
        ("\n<|im_start|>user\nWhat is two plus three?<|im_end|>\n<|im_start|>assistant\n", False),
        ("<think>\nTwo plus three is five.\n</think>\n\nFive.<|im_end|>", True)]),
    ("Qwen3, reasoning inline, none in the last turn", "Qwen-Qwen3-0.6B.jinja", QWEN, INLINE, [
        ("<|im_start|>system\nYou are kind.<|im_end|>\n<|im_start|>user\nHello there.<|im_end|>\n"
         "<|im_start|>assistant\n", False),
        ("Fine, thanks.<|im_end|>", True),
        ("\n<|im_start|>user\nWhat is two plus three?<|im_end|>\n<|im_start|>assistant\n", False),
        # The empty block Qwen3's template writes into the last turn: scored.
        ("<think>\n\n</think>\n\nFive.<|im_end|>", True)]),
    ("Qwen3, a tool call", "Qwen-Qwen3-0.6B.jinja", QWEN, TOOL_CHAT, [
        ("<|im_start|>user\nWhat is two plus three?<|im_end|>\n<|im_start|>assistant\n", False),
        ("<think>\nI should add.\n</think>\n\n<tool_call>\n{\"name\": \"plus\", \"arguments\": "
         "{\"a\": 2, \"b\": 3}}\n</tool_call><|im_end|>", True),
        ("\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
         "<|im_start|>assistant\n", False),
        ("<think>\n\n</think>\n\nFive.<|im_end|>", True)]),
    ("Qwen3.5, reasoning fields", "Qwen-Qwen3.5-4B.jinja", QWEN, CHAT, [
        ("<|im_start|>system\nYou are kind.<|im_end|>\n<|im_start|>user\nHello there.<|im_end|>\n"
         "<|im_start|>assistant\n", False),
        ("Fine, thanks.<|im_end|>", True),
        # The generation prompt ends in "<think>\n": the reasoning's text on is scored.
        ("\n<|im_start|>user\nWhat is two plus three?<|im_end|>\n<|im_start|>assistant\n<think>\n",
         False),
        ("Two plus three is five.\n</think>\n\nFive.<|im_end|>", True)]),
    ("Qwen3.5, reasoning inline, none in the last turn", "Qwen-Qwen3.5-4B.jinja", QWEN, INLINE, [
        ("<|im_start|>system\nYou are kind.<|im_end|>\n<|im_start|>user\nHello there.<|im_end|>\n"
         "<|im_start|>assistant\n", False),
        ("Fine, thanks.<|im_end|>", True),
        ("\n<|im_start|>user\nWhat is two plus three?<|im_end|>\n<|im_start|>assistant\n<think>",
         False),
        # "\n\n" is one piece: it leaves the prompt's "\n" at <think>.
        ("\n\n</think>\n\nFive.<|im_end|>", True)]),
    ("Gemma 4, reasoning fields", "google-gemma-4-31B-it.jinja", GEMMA4, CHAT, [
        ("<bos><|turn>system\nYou are kind.<turn|>\n<|turn>user\nHello there.<turn|>\n"
         "<|turn>model\n", False),
        ("Fine, thanks.<turn|>", True),  # (no reasoning shown: not a tool-call turn)
        ("\n<|turn>user\nWhat is two plus three?<turn|>\n<|turn>model\n", False),
        ("Five.<turn|>", True)]),
    ("Gemma 4, a tool call", "google-gemma-4-31B-it.jinja", GEMMA4, TOOL_CHAT, [
        ("<bos><|turn>user\nWhat is two plus three?<turn|>\n<|turn>model\n<|channel>thought\n",
         False),
        # A tool-call turn after the last user message shows its reasoning; the model stops
        # at <|tool_response>, the response is the tool's.
        ("I should add.\n<channel|><|tool_call>call:plus{a:2,b:3}<tool_call|><|tool_response>",
         True),
        ('response:plus{value:<|"|>5<|"|>}<tool_response|>', False),
        ("Five.<turn|>", True)]),
]
# ChatML with generation markers around the content only, after an "Answer:" the template
# writes: the markers, not the common prefix, say what is scored.
MARKED = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}"
          "Answer: {% generation %}{{ m['content'] }}{% endgeneration %}{% else %}"
          "{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# (" Fine" is one piece: the marked text's first token holds the space before it.)
MARKED_CASE = ("ChatML with generation markers", MARKED, QWEN, CHAT[1:], [
    ("<|im_start|>user\nHello there.<|im_end|>\n<|im_start|>assistant\nAnswer:", False),
    (" Fine, thanks.<|im_end|>", True),
    ("\n<|im_start|>user\nWhat is two plus three?<|im_end|>\n<|im_start|>assistant\nAnswer:",
     False),
    (" Five.<|im_end|>", True)])
# Earlier assistant turns rendered as "ok": the chat's rendering does not show them.
HISTORY = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' "
           "and not loop.last %}ok{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n"
           "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Mistral-like: no generation prompt, no end of turn after a user's, the system message
# before the last user message. The messages before the first turn render otherwise in the
# whole chat: its span would run from the first user message through the answer.
MOVED = ("{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
         "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}{% for m in messages %}"
         "{% if m['role'] == 'user' %}[INST] {% if loop.index0 == ns.last and "
         "messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
         "{{ m['content'] }}[/INST]{% elif m['role'] == 'assistant' %}{{ m['content'] }}</s>"
         "{% endif %}{% endfor %}")
MISTRAL = {"special": ["</s>", "[INST]", "[/INST]"], "added": [], "bos": None, "eos": "</s>",
           "pad": "</s>"}


def check(cond, what):
    if not cond:
        sys.exit("FAILED: " + what)


def make_tokenizer(spec, vocab=None):
    """The test's tokenizer: spec's special and added tokens, the Qwen pre-tokenizer, a
    word-level model over vocab (the pieces) and a decoder that joins pieces as they are."""
    tokens = spec["special"] + spec["added"]
    words = dict.fromkeys(tokens + ["<unk>"] + sorted(vocab or ()))
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(SPLIT), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t in spec["special"]])
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec["added"]])
    return tk


def make_model(d, template, spec, chats):
    """A model directory with the template and a tokenizer whose vocabulary holds every
    piece of the chats' renderings (and of each turn's prompt rendering). Returns the
    tokenizers.Tokenizer."""
    def fast(tk):
        f = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=spec["bos"],
                                    eos_token=spec["eos"], pad_token=spec["pad"],
                                    unk_token="<unk>", clean_up_tokenization_spaces=False)
        f.chat_template = template
        return f
    draft = fast(make_tokenizer(spec))
    texts = []
    for msgs in chats:
        for k in range(1, len(msgs) + 1):
            for gen in (False, True):
                try:
                    texts.append(draft.apply_chat_template(msgs[:k], tokenize=False,
                                                           add_generation_prompt=gen))
                except Exception:  # (Qwen3.5's wants a user message)
                    pass
    specials = "|".join(re.escape(t) for t in spec["special"] + spec["added"])
    pre = pre_tokenizers.Split(Regex(SPLIT), behavior="isolated")
    vocab = {p for text in texts for part in re.split(specials, text)
             for p, _ in pre.pre_tokenize_str(part)}
    tk = make_tokenizer(spec, vocab)
    os.makedirs(d, exist_ok=True)
    fast(tk).save_pretrained(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "vocab_size": tk.get_vocab_size()}, f)
    return tk


def encode(tk, spec, text):
    """The text's ids, its pieces between the special tokens encoded one by one."""
    specials = "(%s)" % "|".join(re.escape(t) for t in spec["special"] + spec["added"])
    ids = []
    for part in re.split(specials, text):
        if part:
            ids += tk.encode(part, add_special_tokens=False).ids
    return ids


def runs(labels):
    """(start, stop) of each run of scored labels."""
    out, i = [], 0
    while i < len(labels):
        if labels[i] == -100:
            i += 1
            continue
        j = i
        while j < len(labels) and labels[j] != -100:
            j += 1
        out.append((i, j))
        i = j
    return out


def run_case(work, name, template, spec, chat, pieces):
    model = os.path.join(work, re.sub(r"\W+", "_", name))
    tk = make_model(model, template, spec, [chat])
    unk = tk.token_to_id("<unk>")
    # The rendering is the one written by hand (the template read right).
    rendered = PreTrainedTokenizerFast.from_pretrained(model).apply_chat_template(
        chat, tokenize=False)
    text = "".join(t for t, _ in pieces)
    check(rendered.startswith(text) and rendered[len(text):] in ("", "\n"),
          "%s: the template renders\n%r\nnot\n%r" % (name, rendered, text))
    src = os.path.join(work, "chat.jsonl")
    out = os.path.join(work, "chat.h5")
    with open(src, "w") as f:
        f.write(json.dumps({"messages": chat}) + "\n")
    status, log = run_tool("tokenize_sft", ["--model", model, "--input", src, "--output", out,
                                            "--max-len", "256"])
    check(status == 0 and "1 examples read, 1 written" in log, "%s: %s" % (name, log))
    with h5py.File(out) as h:
        ids, labels = np.array(h["input_ids"][0]), np.array(h["labels"][0])
    want_ids, want_labels = [], []
    for part, scored in pieces:
        got = encode(tk, spec, part)
        check(unk not in got, "%s: %r has an unknown piece" % (name, part))
        want_ids += got
        want_labels += got if scored else [-100] * len(got)
    n = len(want_ids)
    check(list(ids[:n]) == want_ids and (ids[n:] == tk.token_to_id(spec["pad"])).all(),
          "%s: input_ids %s, expected %s" % (name, list(ids[:n + 2]), want_ids))
    check(list(labels) == want_labels + [-100] * (len(labels) - n),
          "%s: labels %s, expected %s" % (name, list(labels[:n + 2]), want_labels))
    # The scored spans as text: what a reader checks against the rendering.
    spans = [tk.decode([int(i) for i in ids[a:b]], skip_special_tokens=False)
             for a, b in runs(list(labels))]
    want = [t for t, scored in pieces if scored]
    check(spans == want, "%s: scored %r, expected %r" % (name, spans, want))
    print("%s: scored %s: ok" % (name, " | ".join(repr(s) for s in spans)))


def main():
    work = sys.argv[1]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    for name, fixture, spec, chat, pieces in CASES:
        with open(os.path.join(TEMPLATES, fixture)) as f:
            template = f.read()
        run_case(work, name, template, spec, chat, pieces)
    run_case(work, *MARKED_CASE)

    # A template that renders an earlier turn without its content: refused, counted.
    model = os.path.join(work, "history")
    make_model(model, HISTORY, QWEN, [CHAT])
    src = os.path.join(work, "history.jsonl")
    with open(src, "w") as f:
        f.write(json.dumps({"messages": CHAT}) + "\n" + json.dumps({"messages": CHAT[:3]}) + "\n")
    status, log = run_tool("tokenize_sft", ["--model", model, "--input", src, "--output",
                                            os.path.join(work, "history.h5"), "--max-len", "256"])
    check(status == 0 and "2 examples read, 1 written" in log and "refused: the chat's rendering "
          "does not show an assistant turn's text in its span: 1" in log, "history: " + log)
    print("a rendering without a turn's content: refused and counted: ok")

    # A system message moved before the last user message: the first turn's prompt is not
    # the start of the chat's rendering; refused, counted (the one-turn chat is kept).
    model = os.path.join(work, "moved")
    make_model(model, MOVED, MISTRAL, [CHAT])
    status, log = run_tool("tokenize_sft", ["--model", model, "--input", src, "--output",
                                            os.path.join(work, "moved.h5"), "--max-len", "256"])
    check(status == 0 and "2 examples read, 1 written" in log and "refused: the messages before "
          "an assistant turn do not render as the start of the chat's rendering: 1" in log,
          "moved system message: " + log)
    print("a prompt rendered otherwise in the whole chat: refused and counted: ok")


if __name__ == "__main__":
    main()
