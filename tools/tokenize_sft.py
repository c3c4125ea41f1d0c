#!/usr/bin/env python3
"""Training data as JSON lines -> kqlora's token data file (docs/FINETUNING.md, docs/MODELS.md).

    python3 tools/tokenize_sft.py --model MODEL_DIR --input train.jsonl --output train.h5 \\
        --max-len 512 [--pack] [--overlong drop|truncate|split] [--system TEXT]

Each line is one example, in any of these forms (the keys say which):
  {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
      a chat (OpenAI / TRL style), multi-turn, the system message optional;
  {"conversations": [{"from": "system"|"human"|"gpt", "value": "..."}, ...]}
      ShareGPT, mapped to messages (human/user -> user, gpt/assistant -> assistant);
  {"instruction": "...", "response": "..."}
      one user turn and the assistant's answer, rendered as a chat;
  {"prompt": ..., "completion": ...}
      strings: the prompt's tokens (BOS as the tokenizer adds it) then the completion's and
      an EOS, the completion and the EOS scored; lists of messages: a chat, prompt then
      completion, the completion's assistant turns scored;
  {"text": "..."}
      continued pre-training: the text's tokens (BOS as the tokenizer adds it) and an EOS,
      every token scored.

Chats go through the model directory's tokenizer and chat template. Assistant turn k's
span is the tokens of render(messages[:k+1]) after render(messages[:k],
add_generation_prompt=True), up to and including the first end-of-turn id; the template's
tokens inside the span are scored, everything else is -100. End-of-turn ids: those of
generation_config.json's eos_token_id, the tokenizer's EOS, and whichever of <|im_end|>,
<end_of_turn>, <|end|>, <|eot_id|> the vocabulary has. The prefix rendering must be a token
prefix of the longer one, and each turn's rendering a prefix of the whole chat's; an
example where it is not, or where the template raises (Gemma's refuse a system message),
is refused and counted by reason. The chat ends after the last assistant turn's end of
turn (what a template appends after it, a newline, is dropped).

--overlong: an example longer than --max-len is dropped (default), truncated to its first
--max-len tokens, or split into pieces of --max-len whose positions restart at 0. An
example or piece left with no scored label (a row's first label is never scored) is
dropped and counted, never written.

--pack: rows of --max-len filled with whole examples (pieces), first fit in input order,
with a position_ids dataset: each example's positions 0, 1, 2, ...; padding after the last
one has label -100 and position 0; the label at each example's first position is -100.
Without --pack, an example a row, padded on the right.

System prompt: without --system no system message is added to examples that have none,
and the template does what it does then (SmolLM2's inserts its default system prompt);
the first example is printed as the model sees it. --system TEXT adds TEXT as the system
message of every chat that has none.

Output (HDF5 1.10 format, checksummed metadata): input_ids and labels int32 [N, max_len],
position_ids with --pack; attributes vocab_size (int64, config.json's) and
tokenizer_sha256 (of tokenizer.json). The summary line counts examples, tokens and scored
labels written, and what was dropped or refused, by reason. Bad input (a line that is not
one of the forms above) exits 2 naming the file and line; so does an --output that is the
input file or a file of the model directory (it would destroy it). The token file is
written to a temporary name beside --output and renamed: a failed write (a full disk)
exits 1 and leaves an earlier file at that path as it was. Needs transformers and h5py.
"""
import argparse
import collections
import hashlib
import json
import os
import sys

END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|end|>", "<|eot_id|>")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant"}


class Refused(Exception):
    """An example the template cannot render as the spans need: counted by reason."""


def fail(msg):
    print("tokenize_sft: " + msg, file=sys.stderr)
    sys.exit(2)


def refuse_overwriting_an_input(output, data, model_dir):
    """Exit 2 when `output` is the data file or a file of the model directory (its tokenizer,
    config, weights): writing the token file there would destroy an input."""
    if not os.path.exists(output):
        return
    if os.path.isdir(output):
        fail("--output %s is a directory" % output)
    if os.path.samefile(output, data):
        fail("--output %s is the input file: the token file would replace the data" % output)
    if os.path.isdir(model_dir) and os.path.samefile(os.path.dirname(os.path.abspath(output)), model_dir):
        fail("--output %s is a file of the model directory %s: the token file would replace it"
             % (output, model_dir))


def end_of_turn_ids(tok, model_dir):
    ids = set()
    gen = os.path.join(model_dir, "generation_config.json")
    if os.path.exists(gen):
        with open(gen) as f:
            eos = json.load(f).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    vocab = tok.get_vocab()
    ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
    return ids


class Tokenizer:
    def __init__(self, model_dir):
        from transformers import AutoTokenizer
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.eot = end_of_turn_ids(self.tok, model_dir)
        if not self.eot:
            fail("%s: the tokenizer has no EOS and no end-of-turn token" % model_dir)
        self.eos = self.tok.eos_token_id
        pad = self.tok.pad_token_id
        self.pad = pad if pad is not None else self.eos
        if self.pad is None:
            fail("%s: the tokenizer has neither a pad nor an EOS token" % model_dir)

    def render(self, messages, generation_prompt):
        try:
            out = self.tok.apply_chat_template(messages, tokenize=True,
                                               add_generation_prompt=generation_prompt)
        except Exception as e:  # jinja2's TemplateError and the template's raise_exception
            raise Refused("the chat template raises (%s)" % str(e).split("\n")[0][:80])
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    def chat(self, messages):
        """(ids, labels) of a chat: the assistant turns' spans scored."""
        turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns:
            raise Refused("no assistant turn")
        full = self.render(messages[:turns[-1] + 1], False)
        labels = [-100] * len(full)
        end = 0
        for k in turns:
            prefix = self.render(messages[:k], True)
            upto = self.render(messages[:k + 1], False)
            if upto[:len(prefix)] != prefix:
                raise Refused("a turn's prompt rendering is not a token prefix of the turn's")
            if full[:len(upto)] != upto:
                raise Refused("a turn's rendering is not a token prefix of the chat's")
            stop = next((i for i in range(len(prefix), len(upto)) if upto[i] in self.eot), None)
            if stop is None:
                raise Refused("an assistant turn without an end-of-turn token")
            labels[len(prefix):stop + 1] = full[len(prefix):stop + 1]
            end = stop + 1
        return full[:end], labels[:end]

    def plain(self, text, scored_from_start):
        """(ids, labels) of text and an EOS (BOS as the tokenizer adds it)."""
        ids = list(self.tok(text)["input_ids"])
        if self.eos is None:
            fail("the tokenizer has no EOS to end a text with")
        ids.append(self.eos)
        return ids, list(ids) if scored_from_start else None


def messages_of(ex, where):
    """The example's chat messages, or None for the plain forms."""
    def checked(msgs, role_key, content_key, roles):
        if not isinstance(msgs, list) or not msgs:
            fail("%s: expected a non-empty list of messages" % where)
        out = []
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get(content_key), str) \
                    or m.get(role_key) not in roles:
                fail("%s: expected messages {\"%s\": %s, \"%s\": text}, got %s"
                     % (where, role_key, "|".join(sorted(roles)), content_key,
                        json.dumps(m)[:80]))
            out.append({"role": roles[m[role_key]], "content": m[content_key]})
        return out
    chat_roles = {r: r for r in ("system", "user", "assistant")}
    if "messages" in ex:
        return checked(ex["messages"], "role", "content", chat_roles)
    if "conversations" in ex:
        return checked(ex["conversations"], "from", "value", SHAREGPT_ROLES)
    if "instruction" in ex or "response" in ex:
        if not isinstance(ex.get("instruction"), str) or not isinstance(ex.get("response"), str):
            fail("%s: expected \"instruction\" and \"response\" strings" % where)
        return [{"role": "user", "content": ex["instruction"]},
                {"role": "assistant", "content": ex["response"]}]
    if "prompt" in ex and isinstance(ex["prompt"], list):
        if not isinstance(ex.get("completion"), list):
            fail("%s: a conversational \"prompt\" needs a list of messages as \"completion\""
                 % where)
        return checked(ex["prompt"] + ex["completion"], "role", "content", chat_roles)
    return None


def example_of(tz, ex, where, system):
    """(ids, labels) of one example."""
    if not isinstance(ex, dict):
        fail("%s: expected a JSON object" % where)
    msgs = messages_of(ex, where)
    if msgs is not None:
        if system is not None and msgs[0]["role"] != "system":
            msgs = [{"role": "system", "content": system}] + msgs
        return tz.chat(msgs)
    if "prompt" in ex or "completion" in ex:
        if not isinstance(ex.get("prompt"), str) or not isinstance(ex.get("completion"), str):
            fail("%s: expected \"prompt\" and \"completion\" strings (or lists of messages)"
                 % where)
        prompt = list(tz.tok(ex["prompt"])["input_ids"])
        completion = list(tz.tok(ex["completion"], add_special_tokens=False)["input_ids"])
        ids = prompt + completion + [tz.eos]
        return ids, [-100] * len(prompt) + completion + [tz.eos]
    if "text" in ex:
        if not isinstance(ex["text"], str):
            fail("%s: expected \"text\" to be a string" % where)
        return tz.plain(ex["text"], True)
    fail("%s: expected one of \"messages\", \"conversations\", \"instruction\"/\"response\", "
         "\"prompt\"/\"completion\", \"text\"; got keys %s" % (where, sorted(ex)))


def scored(labels):
    """Labels a row or document scores: its first is never (docs/MODELS.md)."""
    return sum(1 for y in labels[1:] if y != -100)


def pieces_of(ids, labels, max_len, overlong, counts):
    """The example, or its pieces, as (ids, labels) of at most max_len tokens."""
    if len(ids) > max_len:
        if overlong == "drop":
            counts["longer than --max-len"] += 1
            return []
        if overlong == "truncate":
            ids, labels = ids[:max_len], labels[:max_len]
    out = []
    for i in range(0, len(ids), max_len):
        piece = (ids[i:i + max_len], labels[i:i + max_len])
        if scored(piece[1]) == 0:
            counts["no scored label" + (" (a split piece)" if len(ids) > max_len else "")] += 1
            continue
        out.append(piece)
    return out


def pack(pieces, max_len, window=64):
    """First fit in input order: each piece into the first of the open rows it fits in (the
    last `window` rows stay open). Returns rows as lists of pieces."""
    rows, room = [], []
    for p in pieces:
        n = len(p[0])
        start = max(0, len(rows) - window)
        for r in range(start, len(rows)):
            if room[r] >= n:
                rows[r].append(p)
                room[r] -= n
                break
        else:
            rows.append([p])
            room.append(max_len - n)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[4:]))
    ap.add_argument("--model", required=True, help="Hugging Face model directory (tokenizer)")
    ap.add_argument("--input", required=True, help="JSON lines, one example a line")
    ap.add_argument("--output", required=True, help="the HDF5 token file to write")
    ap.add_argument("--max-len", type=int, required=True, help="tokens per row")
    ap.add_argument("--pack", action="store_true", help="several examples a row")
    ap.add_argument("--overlong", choices=("drop", "truncate", "split"), default="drop",
                    help="an example longer than --max-len (default: drop)")
    ap.add_argument("--system", default=None, help="a system message for chats without one")
    args = ap.parse_args(argv)
    if args.max_len < 2:
        fail("--max-len must be at least 2")
    if not os.path.isfile(args.input):
        fail("%s: no such file" % args.input)
    refuse_overwriting_an_input(args.output, args.input, args.model)

    import h5py
    import numpy as np
    tz = Tokenizer(args.model)
    with open(os.path.join(args.model, "config.json")) as f:
        vocab_size = int(json.load(f)["vocab_size"])
    tokenizer_json = os.path.join(args.model, "tokenizer.json")
    sha = hashlib.sha256(open(tokenizer_json, "rb").read()).hexdigest() \
        if os.path.exists(tokenizer_json) else ""

    counts = collections.Counter()  # dropped or refused, by reason
    pieces, examples, written = [], 0, 0
    with open(args.input) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = "%s:%d" % (args.input, n)
            try:
                ex = json.loads(line)
            except ValueError as e:
                fail("%s: not JSON (%s)" % (where, e))
            examples += 1
            try:
                ids, labels = example_of(tz, ex, where, args.system)
            except Refused as e:
                counts["refused: " + str(e)] += 1
                continue
            if examples == 1:
                print("tokenize_sft: first example as the model sees it:\n%s"
                      % tz.tok.decode(ids), flush=True)
            mine = pieces_of(ids, labels, args.max_len, args.overlong, counts)
            written += bool(mine)
            pieces += mine
    if not pieces:
        fail("%s: no example left (%d read; %s)" % (args.input, examples, dict(counts)))

    T = args.max_len
    rows = pack(pieces, T) if args.pack else [[p] for p in pieces]
    ids_a = np.full((len(rows), T), tz.pad, dtype=np.int32)
    labels_a = np.full((len(rows), T), -100, dtype=np.int32)
    pos_a = np.zeros((len(rows), T), dtype=np.int32)
    for r, row in enumerate(rows):
        at = 0
        for ids, labels in row:
            n = len(ids)
            ids_a[r, at:at + n] = ids
            labels_a[r, at:at + n] = labels
            labels_a[r, at] = -100  # a document's first label is never scored
            pos_a[r, at:at + n] = np.arange(n)
            at += n
    if ids_a.max() >= vocab_size:
        fail("token id %d >= vocab_size %d of %s/config.json"
             % (ids_a.max(), vocab_size, args.model))
    # Written to a temporary name beside the output, then renamed: an earlier file at that
    # path survives a failed write (a full disk), which exits 1.
    tmp = "%s.tmp-%d" % (args.output, os.getpid())
    try:
        with h5py.File(tmp, "w", libver=("v110", "v110")) as h:
            h.create_dataset("input_ids", data=ids_a)
            h.create_dataset("labels", data=labels_a)
            if args.pack:
                h.create_dataset("position_ids", data=pos_a)
            h.attrs["vocab_size"] = np.int64(vocab_size)
            h.attrs["tokenizer_sha256"] = sha
        os.replace(tmp, args.output)
    except (OSError, RuntimeError, ValueError) as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        print("tokenize_sft: writing %s failed: %s" % (args.output, e), file=sys.stderr)
        sys.exit(1)
    tokens = sum(len(p[0]) for p in pieces)
    labels_scored = int((labels_a[:, 1:] != -100).sum())
    print("tokenize_sft: %s: %d examples read, %d written as %d %s of %d (%d pieces, %d tokens, "
          "%d scored labels, %.0f%% of the rows' positions real); %s"
          % (args.output, examples, written, len(rows), "packed rows" if args.pack else "rows", T, len(pieces), tokens,
             labels_scored, 100.0 * tokens / (len(rows) * T),
             "; ".join("%s: %d" % kv for kv in sorted(counts.items())) or "none dropped"))


if __name__ == "__main__":
    main()
