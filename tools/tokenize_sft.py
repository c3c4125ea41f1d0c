#!/usr/bin/env python3
"""Training data as JSON lines -> kqlora's token data file (docs/FINETUNING.md, docs/MODELS.md).

    python3 tools/tokenize_sft.py --model MODEL_DIR --input train.jsonl --output train.h5 \\
        --max-len 512 [--pack] [--overlong drop|truncate|split] [--system TEXT]

SFT data: each line is one example, in any of these forms (the keys say which; preference
data, below, is told apart the same way):
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

Chats go through the model directory's tokenizer and chat template, rendered once up to
the last assistant turn; the scored spans are positions in that rendering, each assistant
turn as the whole chat shows it (templates render a turn otherwise when it is the last
message), its tokens scored and everything else -100:
- a template with generation markers ({% generation %} ... {% endgeneration %}, as
  transformers' return_assistant_tokens_mask reads them): the tokens overlapping the marked
  text, each run with the end-of-turn id right after it when it does not end with one;
  each assistant turn's text must be in a run holding an end-of-turn id, in order;
- else (the common prefix, as TRL's trainers): assistant turn k's span starts where the
  chat's rendering and render(messages[:k], add_generation_prompt=True) part (the length
  of their longest common token prefix) and ends with the first end-of-turn id from there,
  included. render(messages[:k]) without the generation prompt must be the start of the
  chat's rendering (but for its last token, which may merge with what follows), the spans
  in order without overlap, and each must show its turn's text (its content less inline
  reasoning, whitespace aside).
Where each turn's prompt rendering is a token prefix of its rendering and that of the
chat's (ChatML, SmolLM2's, Llama's), the span is what render(messages[:k+1]) adds after
render(messages[:k], add_generation_prompt=True), through its end of turn. An example that
breaks the checks, or where the template raises (Gemma 2's refuses a system message), is
refused and counted by reason. End-of-turn ids: those of generation_config.json's
eos_token_id, the tokenizer's EOS, and whichever of <|im_end|>, <end_of_turn>, <|end|>,
<|eot_id|>, <turn|> and <|tool_response> (Gemma 4's model stops there after a tool call)
the vocabulary has. The chat ends after the last span (what a template appends after it,
a newline, is dropped).

Reasoning: an assistant message's "reasoning_content" (or "reasoning") string goes to the
template, as does reasoning inline in its content ("<think>...</think>" before the answer);
what is scored of it is what the chat's rendering shows (tests/check_chat_templates.py, on
the real templates):
- Qwen3: the last turn after the last user message shows "<think>\\nREASONING\\n</think>\\n\\n"
  before its answer, and an empty "<think>\\n\\n</think>\\n\\n" without reasoning; the
  generation prompt ends "assistant\\n", so the block is scored with the answer, the empty
  one too (it is what the model writes when it answers without thinking; with
  enable_thinking=False its prompt holds the same tokens). Turns before the last user
  message are shown without their reasoning: it is not trained. A tool-call turn after the
  last user message keeps its reasoning, scored.
- Qwen3.5: rendered as Qwen3, but the generation prompt ends "<think>\\n": the last turn is
  scored from its reasoning's text on (without reasoning from the "\\n\\n" before </think>,
  a token that covers the prompt's "\\n"); earlier turns' reasoning is not trained.
- Gemma 4: a turn shows its answer only (scored with <turn|>); its reasoning is shown, and
  scored from after "<|channel>thought\\n", only in a tool-call turn after the last user
  message, which ends at <|tool_response> (the tool's response after it is not scored).
  The empty thought channel "<|channel>thought\\n<channel|>" that the generation prompt
  adds is not in a chat's rendering: neither in the row nor scored.

Preference data (TRL 1.16's forms; one form a file, the first line's, and no line of
another, SFT lines included: exit 2 naming the line), each tokenized exactly as TRL 1.16's
DPOTrainer / KTOTrainer does (tools/preference_rows.py says its rules, the
tokenize_preference test compares every id with TRL's own):
  {"prompt": ..., "chosen": ..., "rejected": ...}
      a pair: strings, or lists of messages (the prompt any chat, chosen and rejected the
      assistant's messages only);
  {"chosen": ..., "rejected": ...}
      a pair with an implicit prompt: the longest common prefix of the two (messages, or
      text as TRL's extract_prompt cuts it); past it, only assistant messages (else the
      prompt differs between them: exit 2);
  {"prompt": ..., "completion": ..., "label": true|false}
      KTO's unpaired row (label: whether the completion is desirable).
Strings: the completion with the EOS text appended (unless it ends with it), prompt and
prompt + completion tokenized as text; messages: the prompt rendered with the generation
prompt, prompt + completion without, through the chat template, checked and refused as
SFT chats are (role order, a template that raises or drops tool calls; --system and
"tools" apply). The prompt is the common token prefix of the prompt's ids and each
prompt + completion's (a pair's shorter one), every token after it scored (the end of
turn and what the template writes after it included, as TRL trains them), the prompt -100.
An empty completion (a side with nothing to score), a label that is not a boolean or a
pair of strings and messages mixed exits 2. A pair whose rows are equal is skipped and
counted (TRL trains it; it teaches nothing). --max-len: TRL's rule by default (each row
keeps its first --max-len tokens; an example whose prompt alone holds --max-len tokens is
dropped), --overlong drop drops every example longer than --max-len whole; --pack and
--overlong split exit 2.

--overlong (SFT data): an example longer than --max-len is dropped (default), truncated
to its first --max-len tokens, or split into pieces of --max-len whose positions restart
at 0. An example or piece left with no scored label (a row's first label is never scored)
is dropped and counted, never written.

--pack (SFT data): rows of --max-len filled with whole examples (pieces), first fit in
input order, with a position_ids dataset: each example's positions 0, 1, 2, ...; padding
after the last one has label -100 and position 0; the label at each example's first
position is -100. Without --pack, an example a row, padded on the right.

System prompt: without --system no system message is added to examples that have none,
and the template does what it does then (SmolLM2's inserts its default system prompt);
the first example is printed as the model sees it. --system TEXT adds TEXT as the system
message of every chat that has none.

Tool calls: in the "messages" form an assistant message may carry "tool_calls" (OpenAI's
[{"type": "function", "function": {"name": ..., "arguments": ...}}], its "content" then
empty or null) and "tool" messages may answer them; a line's "tools" (a list of function
definitions) goes to the template. Such a turn is rendered with and without its calls:
it is used only if the calls are in its rendering (the renderings differ and each call's
function name is in the turn's span); a template that drops them gets the example refused
("the chat template drops tool_calls"), never trained as an empty turn. An assistant turn
with neither content (less inline reasoning) nor calls is refused too ("an empty
assistant turn").

Role order: a system message only first, then a user turn; a tool message only after an
assistant turn with calls (or another tool message). A chat that breaks it (one that opens
with the assistant's turn) is refused and counted as "role order: ...".

Output (HDF5 1.10 format, checksummed metadata): input_ids and labels int32 [N, max_len],
position_ids with --pack; preference data: the root string attribute form, "pairs" (rows
2i and 2i+1 pair i's chosen and rejected, both starting with its prompt; int64 attribute
pairs) or "unpaired" (desirable int8 [N]: 1 where the label is true), and prompt_len int32
[N] (each row's prompt tokens: its first scored position); attributes vocab_size (int64,
config.json's) and
tokenizer_sha256: the SHA-256 hex digest of the bytes of the model directory's file that
maps text to ids, tokenizer.json where it has one, else tokenizer.model, else "" (the
trainer computes the same of its hf_model_dir and compares: exactly this definition). The
summary line counts examples, tokens and scored labels written, and what was dropped or
refused, by reason (preference data: pairs or unpaired rows read, kept, truncated,
dropped, skipped as identical, refused).

Bad input exits 2 with "tokenize_sft: error: " and the reason, naming the file and line
where there is one, never a traceback: a line that is not UTF-8, not JSON (or nested too
deeply), not one of the forms above, or holds a lone surrogate (a "\\ud800" escape); an
--input that is missing or a directory; a --model that is not a directory, lacks tokenizer
files (tokenizer.json, tokenizer.model, vocab.json, vocab.txt) or a config.json with a
positive integer vocab_size, or whose tokenizer does not load; an --output that is a
directory, in a missing directory or one that cannot be written. No output destroys an
input (tools/safe_output.py, docs/RELIABILITY.md): an --output that is the input file, a
file of the model directory or inside it (links, hard links and ".." included) is refused,
exit 2. The token file is written to a temporary name beside --output and renamed: a
failed write (a full disk) exits 1 and leaves an earlier file at that path as it was.
Needs transformers and h5py.
"""
import argparse
import collections
import hashlib
import json
import os
import itertools
import re

import preference_rows
from preference_rows import FILE_NAMES, FORM_NAMES
from safe_output import check_output_file, fail, file_output

# <turn|> ends Gemma 4's turns; <|tool_response> is where its model stops after a tool call.
END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|end|>", "<|eot_id|>", "<turn|>",
                      "<|tool_response>")
# transformers' test for a template's {% generation %} markers
GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant"}
CHAT_ROLES = {r: r for r in ("system", "user", "assistant", "tool")}
# An assistant message's reasoning, passed to the template (Qwen3 and Qwen3.5 read
# reasoning_content, Gemma 4 reasoning or reasoning_content).
REASONING_KEYS = ("reasoning_content", "reasoning")
# The files that map text to ids, the first the model directory has hashed into
# tokenizer_sha256 (the trainer hashes its hf_model_dir's the same way).
TOKENIZER_HASHED = ("tokenizer.json", "tokenizer.model")
TOKENIZER_FILES = TOKENIZER_HASHED + ("vocab.json", "vocab.txt")


class Refused(Exception):
    """An example the template cannot render as the spans need: counted by reason."""


def tokenizer_sha256(model_dir):
    """SHA-256 hex of tokenizer.json's bytes, else tokenizer.model's, else ""."""
    for name in TOKENIZER_HASHED:
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            return h.hexdigest()
    return ""


def read_json_file(path):
    """A model directory's JSON file; exit 2 naming it when it cannot be read or parsed."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except OSError as e:
        fail("%s: cannot read (%s)" % (path, e.strerror or e))
    except (ValueError, RecursionError) as e:  # (UnicodeDecodeError is a ValueError)
        fail("%s: not JSON (%s)" % (path, str(e).split("\n")[0][:120]))


def check_model_dir(model_dir):
    """--model: a directory with tokenizer files and a config.json with a positive integer
    vocab_size (exit 2 otherwise). Returns vocab_size."""
    if not os.path.exists(model_dir):
        fail("--model %s: no such directory" % model_dir)
    if not os.path.isdir(model_dir):
        fail("--model %s: not a directory (a Hugging Face model directory is expected)"
             % model_dir)
    if not any(os.path.isfile(os.path.join(model_dir, n)) for n in TOKENIZER_FILES):
        fail("--model %s: no tokenizer files (%s)" % (model_dir, ", ".join(TOKENIZER_FILES)))
    config = os.path.join(model_dir, "config.json")
    if not os.path.isfile(config):
        fail("%s: no such file (the model's config.json gives vocab_size)" % config)
    cfg = read_json_file(config)
    vocab_size = cfg.get("vocab_size") if isinstance(cfg, dict) else None
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
        fail("%s: %s, expected a positive integer vocab_size" % (
            config, "no vocab_size" if not isinstance(cfg, dict) or "vocab_size" not in cfg
            else "vocab_size is %s" % json.dumps(vocab_size)))
    return vocab_size


def end_of_turn_ids(tok, model_dir):
    ids = set()
    gen = os.path.join(model_dir, "generation_config.json")
    if os.path.exists(gen):
        cfg = read_json_file(gen)
        eos = cfg.get("eos_token_id") if isinstance(cfg, dict) else None
        eos = eos if isinstance(eos, list) else [] if eos is None else [eos]
        if not all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in eos):
            fail("%s: eos_token_id %s, expected a token id or a list of them"
                 % (gen, json.dumps(cfg.get("eos_token_id"))))
        ids.update(eos)
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    vocab = tok.get_vocab()
    ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
    return ids


class Tokenizer:
    def __init__(self, model_dir):
        from transformers import AutoTokenizer
        try:
            self.tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        except Exception as e:  # a damaged tokenizer.json, an unknown class, ...
            fail("--model %s: its tokenizer does not load (%s: %s)"
                 % (model_dir, type(e).__name__, str(e).split("\n")[0][:160]))
        self.model_dir = model_dir
        self.eot = end_of_turn_ids(self.tok, model_dir)
        if not self.eot:
            fail("%s: the tokenizer has no EOS and no end-of-turn token" % model_dir)
        self.eos = self.tok.eos_token_id
        pad = self.tok.pad_token_id
        self.pad = pad if pad is not None else self.eos
        if self.pad is None:
            fail("%s: the tokenizer has neither a pad nor an EOS token" % model_dir)

    def render(self, messages, generation_prompt, tools=None, mask=False):
        """The template's token ids, with `mask` also its assistant mask ({% generation %}
        ... {% endgeneration %}); a template that raises gets the example refused."""
        try:
            out = self.tok.apply_chat_template(messages, tools=tools, tokenize=True,
                                               add_generation_prompt=generation_prompt,
                                               return_dict=True,
                                               return_assistant_tokens_mask=mask)
        except Exception as e:  # jinja2's TemplateError and the template's raise_exception
            raise Refused("the chat template raises (%s)" % str(e).split("\n")[0][:80])
        ids = list(out["input_ids"])
        return (ids, list(out["assistant_masks"])) if mask else ids

    def marked(self, tools):
        """Whether the chat template has generation markers (transformers' test)."""
        try:
            return bool(GENERATION_MARKER.search(self.tok.get_chat_template(None, tools)))
        except Exception:  # no template: render() refuses the example, saying why
            return False

    def shows(self, ids, texts):
        """Whether the decoded ids hold each text, whitespace aside (or the text as the
        tokenizer gives it back: a word-level one's unknown words)."""
        got = squeezed(self.tok.decode(ids))
        return all(squeezed(t) in got or squeezed(self.tok.decode(
            self.tok.encode(t, add_special_tokens=False))) in got for t in texts)

    def turn_span(self, head, full, tools):
        """[start, stop) of the assistant turn that follows the messages `head`, in the
        chat's rendering `full`: from the longest common token prefix of `full` and head's
        rendering with the generation prompt, through the first end-of-turn id. head's
        rendering without it must be the start of `full` (but for its last token, which
        may merge with what follows): else the span could hold a prompt's text."""
        before = self.render(head, False, tools)
        if common_prefix(before, full) < len(before) - 1:
            raise Refused("the messages before an assistant turn do not render as the start "
                          "of the chat's rendering")
        start = common_prefix(self.render(head, True, tools), full)
        stop = next((i for i in range(start, len(full)) if full[i] in self.eot), None)
        if stop is None:
            raise Refused("an assistant turn without an end-of-turn token")
        return start, stop + 1

    def marked_spans(self, full, mask):
        """[start, stop) of each run of the template's assistant mask, with the end-of-turn
        id right after it when the run does not end with one."""
        spans, i = [], 0
        while i < len(full):
            if not mask[i]:
                i += 1
                continue
            j = i
            while j < len(full) and mask[j]:
                j += 1
            if full[j - 1] not in self.eot and j < len(full) and full[j] in self.eot:
                j += 1
            spans.append((i, j))
            i = j
        return spans

    def chat(self, messages, tools=None):
        """(ids, labels) of a chat: the assistant turns' spans in the whole chat's
        rendering scored (the module docstring says which span)."""
        role_order(messages)
        turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns:
            raise Refused("no assistant turn")
        if any(not shown_text(messages[k]) for k in turns):
            raise Refused("an empty assistant turn (no content, no tool call)")
        chat = messages[:turns[-1] + 1]
        if self.marked(tools):
            full, mask = self.render(chat, False, tools, mask=True)
            scored = self.marked_spans(full, mask)
            spans, at = [], 0
            for k in turns:
                # The first marked run from `at` on that shows the turn's text is its own.
                want = shown_text(messages[k])
                while at < len(scored) and not self.shows(full[slice(*scored[at])], want):
                    at += 1
                if at == len(scored):
                    raise Refused("the template's generation markers miss an assistant "
                                  "turn's text")
                if not any(t in self.eot for t in full[slice(*scored[at])]):
                    raise Refused("an assistant turn without an end-of-turn token")
                spans.append(scored[at])
                at += 1
        else:
            full = self.render(chat, False, tools)
            spans = [self.turn_span(messages[:k], full, tools) for k in turns]
            scored = spans
            for n, k in enumerate(turns):
                if n and spans[n][0] < spans[n - 1][1]:
                    raise Refused("assistant turns' spans overlap in the chat's rendering")
                if not messages[k].get("tool_calls") and \
                        not self.shows(full[slice(*spans[n])], shown_text(messages[k])):
                    raise Refused("the chat's rendering does not show an assistant turn's "
                                  "text in its span")
        for (start, stop), k in zip(spans, turns):
            calls = messages[k].get("tool_calls")
            if calls:
                # Rendered with and without its calls: they must be in the turn's span.
                bare = dict(messages[k])
                del bare["tool_calls"]
                if self.render(messages[:k] + [bare], False, tools) == \
                        self.render(messages[:k + 1], False, tools) or \
                        not self.shows(full[start:stop], [call_name(c) for c in calls]):
                    raise Refused("the chat template drops tool_calls")
                if not self.shows(full[start:stop], shown_text(messages[k], calls=False)):
                    raise Refused("the chat's rendering does not show an assistant turn's "
                                  "text in its span")
        labels = [-100] * len(full)
        for start, stop in scored:
            labels[start:stop] = full[start:stop]
        end = scored[-1][1]
        return full[:end], labels[:end]

    def plain(self, text, scored_from_start):
        """(ids, labels) of text and an EOS (BOS as the tokenizer adds it)."""
        ids = list(self.tok(text)["input_ids"])
        ids.append(self.need_eos())
        return ids, list(ids) if scored_from_start else None

    def need_eos(self):
        if self.eos is None:
            fail("--model %s: the tokenizer has no EOS to end a text with" % self.model_dir)
        return self.eos


def role_order(messages):
    """A system message only first, then a user turn; a tool message only after an
    assistant turn with calls or another tool message (else refused: role order)."""
    first = 1 if messages[0]["role"] == "system" else 0
    if any(m["role"] == "system" for m in messages[first:]):
        raise Refused("role order: a system message after the first turn")
    if first < len(messages) and messages[first]["role"] != "user":
        raise Refused("role order: the chat does not open with a user turn")
    for prev, m in zip(messages, messages[1:]):
        if m["role"] == "tool" and not (prev["role"] == "tool" or prev.get("tool_calls")):
            raise Refused("role order: a tool message without an assistant tool call before it")


def call_name(call):
    return (call.get("function") or call)["name"]


def common_prefix(a, b):
    """The length of the longest common prefix of two id lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def squeezed(text):
    return "".join(text.split())


def shown_text(message, calls=True):
    """What a chat's rendering must show of an assistant turn: its content without the
    reasoning it may carry inline (before "</think>"; Gemma 4's "<|channel>...<channel|>"),
    which templates move or drop; for a turn of tool calls only (with `calls`), each
    call's function name."""
    content = message["content"] or ""
    if "</think>" in content:
        content = content.split("</think>")[-1]
    content = re.sub(r"<\|channel>.*?<channel\|>", "", content, flags=re.S).strip()
    if content or not calls:
        return [content] if content else []
    return [call_name(c) for c in message.get("tool_calls") or ()]


def checked_tool_calls(calls, where, i):
    """An assistant message's tool_calls, OpenAI's [{"type": "function", "function":
    {"name": text, "arguments": object or text}}] (or the function objects themselves)."""
    def bad(what):
        fail("%s: message %d: tool_calls: %s, expected [{\"type\": \"function\", \"function\": "
             "{\"name\": text, \"arguments\": object or text}}]" % (where, i, what))
    if not isinstance(calls, list):
        bad("not a list")
    for c in calls:
        if not isinstance(c, dict):
            bad("got %s" % json.dumps(c)[:60])
        fn = c.get("function", c)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            bad("a call without a function name")
        if not isinstance(fn.get("arguments", {}), (dict, str)):
            bad("arguments %s" % json.dumps(fn["arguments"])[:60])
    return calls


def checked_messages(msgs, where, role_key="role", content_key="content", roles=CHAT_ROLES):
    """A list of messages in the chat form ({"role", "content"}, or ShareGPT's keys),
    normalized: {"role", "content"} with an assistant's tool_calls and reasoning, a tool
    message's name and tool_call_id; exit 2 naming the line where a message is malformed."""
    if not isinstance(msgs, list) or not msgs:
        fail("%s: expected a non-empty list of messages" % where)
    out = []
    for i, m in enumerate(msgs):
        role = roles.get(m.get(role_key)) if isinstance(m, dict) and \
            isinstance(m.get(role_key), str) else None
        calls = m.get("tool_calls") if role is not None and role_key == "role" else None
        if calls is not None and role != "assistant":
            fail("%s: message %d: tool_calls in a %s message (only an assistant's)"
                 % (where, i, role))
        content = m.get(content_key) if role is not None else None
        if calls and content is None:
            content = ""  # (an assistant turn of calls only)
        if role is None or not isinstance(content, str):
            fail("%s: expected messages {\"%s\": %s, \"%s\": text}, got %s"
                 % (where, role_key, "|".join(sorted(roles)), content_key,
                    json.dumps(m)[:80]))
        msg = {"role": role, "content": content}
        if calls:
            msg["tool_calls"] = checked_tool_calls(calls, where, i)
        if role == "tool":
            msg.update({k: m[k] for k in ("name", "tool_call_id")
                        if isinstance(m.get(k), str)})
        if role == "assistant" and role_key == "role":
            msg.update({k: m[k] for k in REASONING_KEYS if isinstance(m.get(k), str)})
        out.append(msg)
    return out


def checked_tools(ex, where):
    """A line's "tools" (function definitions for the template), or None."""
    tools = ex.get("tools")
    if tools is not None and (not isinstance(tools, list) or
                              not all(isinstance(t, dict) for t in tools)):
        fail("%s: expected \"tools\" to be a list of objects (function definitions)" % where)
    return tools


def messages_of(ex, where):
    """The example's chat messages, or None for the plain forms."""
    if "messages" in ex:
        return checked_messages(ex["messages"], where)
    if "conversations" in ex:
        return checked_messages(ex["conversations"], where, "from", "value", SHAREGPT_ROLES)
    if "instruction" in ex or "response" in ex:
        if not isinstance(ex.get("instruction"), str) or not isinstance(ex.get("response"), str):
            fail("%s: expected \"instruction\" and \"response\" strings" % where)
        return [{"role": "user", "content": ex["instruction"]},
                {"role": "assistant", "content": ex["response"]}]
    if "prompt" in ex and isinstance(ex["prompt"], list):
        if not isinstance(ex.get("completion"), list):
            fail("%s: a conversational \"prompt\" needs a list of messages as \"completion\""
                 % where)
        return checked_messages(ex["prompt"] + ex["completion"], where)
    return None


def with_system(msgs, system):
    """--system: the messages with a system message first where they have none."""
    if system is not None and (not msgs or msgs[0]["role"] != "system"):
        return [{"role": "system", "content": system}] + msgs
    return msgs


def example_of(tz, ex, where, system):
    """(ids, labels) of one example."""
    if not isinstance(ex, dict):
        fail("%s: expected a JSON object, got %s" % (where, type(ex).__name__))
    msgs = messages_of(ex, where)
    if msgs is not None:
        tools = checked_tools(ex, where)
        return tz.chat(with_system(msgs, system), tools)
    if "prompt" in ex or "completion" in ex:
        if not isinstance(ex.get("prompt"), str) or not isinstance(ex.get("completion"), str):
            fail("%s: expected \"prompt\" and \"completion\" strings (or lists of messages)"
                 % where)
        prompt = list(tz.tok(ex["prompt"])["input_ids"])
        completion = list(tz.tok(ex["completion"], add_special_tokens=False)["input_ids"])
        ids = prompt + completion + [tz.need_eos()]
        return ids, [-100] * len(prompt) + completion + [tz.eos]
    if "text" in ex:
        if not isinstance(ex["text"], str):
            fail("%s: expected \"text\" to be a string" % where)
        return tz.plain(ex["text"], True)
    fail("%s: expected one of \"messages\", \"conversations\", \"instruction\"/\"response\", "
         "\"prompt\"/\"completion\", \"text\"; got keys %s" % (where, sorted(ex)))


def lone_surrogate(value):
    """The first string in a parsed JSON value (keys included) with a lone surrogate (a
    "\\ud800" escape: not Unicode text, no tokenizer takes it), or None."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return v
    return None


def lines_of(f):
    """(line number, bytes) of a file opened in binary: lines end at LF, CR LF or CR (as
    Python's text files read them)."""
    n = 0
    for raw in f:
        body = raw.rstrip(b"\r\n")
        for part in body.split(b"\r") if b"\r" in body else [body]:
            n += 1
            yield n, part


def read_examples(path):
    """Each non-empty line's parsed JSON, with its place; bad input exits 2 naming it."""
    try:
        f = open(path, "rb")
    except OSError as e:
        fail("--input %s: cannot read (%s)" % (path, e.strerror or e))
    with f:
        for n, raw in lines_of(f):
            where = "%s:%d" % (path, n)
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                fail("%s: not UTF-8 text (byte 0x%02x at column %d)"
                     % (where, raw[e.start], e.start + 1))
            if not line.strip():
                continue
            try:
                ex = json.loads(line)
            except RecursionError:
                fail("%s: JSON nested too deeply" % where)
            except ValueError as e:
                fail("%s: not JSON (%s)" % (where, e))
            bad = lone_surrogate(ex)
            if bad is not None:
                fail("%s: a lone surrogate (a \\u%04x escape not in a pair) in the string %s: "
                     "not Unicode text" % (where, next(ord(c) for c in bad if 0xd800 <= ord(c)
                                                       <= 0xdfff),
                                           json.dumps(bad)[:60]))
            yield where, ex


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


def preference_parts(ex, where, form):
    """(prompt, completions, conversational, label) of a preference line, checked: all
    strings or all lists of messages (a completion holds the assistant's messages only), a
    KTO label true or false; exit 2 naming the line otherwise."""
    keys = {"pairs": ("prompt", "chosen", "rejected"), "implicit": ("chosen", "rejected"),
            "unpaired": ("prompt", "completion")}[form]
    values = [ex.get(k) for k in keys]
    conv = all(isinstance(v, list) for v in values)
    if not conv and not all(isinstance(v, str) for v in values):
        fail("%s: expected %s, all strings or all lists of messages"
             % (where, ", ".join('"%s"' % k for k in keys)))
    label = ex.get("label")
    if form == "unpaired" and not isinstance(label, bool):
        fail("%s: \"label\" is %s, expected true or false (whether the completion is "
             "desirable)" % (where, json.dumps(label)[:40]))
    names = keys[1:] if form != "implicit" else keys
    for name, v in zip(keys, values):
        if v == [] and name != "prompt":
            empty(where, name)
    if form == "implicit":
        prompt, completions = implicit_parts(values, where, conv)
    elif conv:
        prompt = checked_messages(values[0], where)
        completions = [assistant_messages(c, where, n) for c, n in zip(values[1:], names)]
    else:
        prompt, completions = values[0], values[1:]
    for name, c in zip(names, completions):
        if c == "" or conv and not any(shown_text(m) for m in c):
            empty(where, name)
    return prompt, completions, conv, label


def empty(where, name):
    fail("%s: an empty \"%s\" completion: nothing to score on that side" % (where, name))


def assistant_messages(msgs, where, name):
    """A completion's messages: the assistant's only (exit 2 otherwise)."""
    msgs = checked_messages(msgs, where)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            fail("%s: \"%s\" message %d is a %s message: a completion holds the assistant's "
                 "messages only" % (where, name, i, m["role"]))
    return msgs


def implicit_parts(values, where, conv):
    """(prompt, [chosen, rejected]) of an implicit-prompt pair, split where TRL's
    extract_prompt splits it: the prompt is what the two share, and past it only the
    assistant's messages may follow (exit 2 otherwise: the prompt differs)."""
    chosen, rejected = values
    i = preference_rows.implicit_split(chosen, rejected)  # (on the lines' own values, as TRL)
    if not conv:
        if i <= 0:
            fail("%s: \"chosen\" and \"rejected\" share no prompt (they differ from their "
                 "first character)" % where)
        return chosen[:i], [chosen[i:], rejected[i:]]
    sides = [checked_messages(chosen, where), checked_messages(rejected, where)]
    for name, msgs in zip(("chosen", "rejected"), sides):
        other = next((k for k in range(i, len(msgs)) if msgs[k]["role"] != "assistant"), None)
        if other is not None:
            fail("%s: the prompt differs between \"chosen\" and \"rejected\": they part at "
                 "message %d, and %s's message %d is a %s message (an implicit prompt is all "
                 "they share; after it only the assistant's messages)"
                 % (where, i, name, other, msgs[other]["role"]))
    return sides[0][:i], [sides[0][i:], sides[1][i:]]


def preference_ids(tz, ex, where, parts, system):
    """(prompt tokens, full rows) of a preference line's parts, as TRL 1.16 tokenizes them
    (tools/preference_rows.py); a chat is refused as an SFT chat would be."""
    prompt, completions, conv, _ = parts
    if conv:
        tools = checked_tools(ex, where)
        prompt = with_system(prompt, system)
        for c in completions:
            tz.chat(prompt + c, tools)  # SFT's checks (role order, template, tool calls)
        n, fulls = preference_rows.chat_rows(tz.render, prompt, completions, tools)
    else:
        tz.need_eos()
        n, fulls = preference_rows.string_rows(tz.tok, prompt, completions)
    if n == 0:  # (a row's first label is never scored: it needs a prompt token)
        raise Refused("no prompt token before the completion")
    for f, name in zip(fulls, ("chosen", "rejected") if len(fulls) == 2 else ("completion",)):
        if len(f) == n:  # (a completion that adds no token to its prompt's)
            empty(where, name)
    return n, fulls


def preference_file(args, tz, examples, form):
    """The PreferenceFile of a preference input, one form throughout."""
    if args.pack:
        fail("--pack: preference data (%s) is not packed (one pair is two rows, one "
             "unpaired example a row); leave --pack out" % FORM_NAMES[form])
    if args.overlong == "split":
        fail("--overlong split: preference data is truncated as TRL does (the default) or "
             "dropped whole (--overlong drop), never split")
    pf = preference_rows.PreferenceFile(form, args.max_len)
    first_conv = None  # (the first line's place, whether it holds messages)
    for where, ex in examples:
        pf.read += 1
        if not isinstance(ex, dict):
            fail("%s: expected a JSON object, got %s" % (where, type(ex).__name__))
        this = preference_rows.form_of(ex)
        if this != form:
            mixed(where, this, form)
        parts = preference_parts(ex, where, form)
        conv = parts[2]
        if first_conv is None:
            first_conv = (where, conv)
        elif conv != first_conv[1]:
            fail("%s: %s in a file of %s (%s's form; one form a file)"
                 % (where, "lists of messages" if conv else "strings",
                    "strings" if conv else "lists of messages", first_conv[0]))
        try:
            n, fulls = preference_ids(tz, ex, where, parts, args.system)
        except Refused as e:
            pf.refuse(str(e))
            continue
        if pf.add(n, fulls, args.overlong or "truncate", parts[3]) and pf.examples() == 1:
            print("tokenize_sft: first %s as the model sees it, its prompt then each "
                  "completion:\n%s" % (pf.unit, "\n---\n".join(
                      [tz.tok.decode(fulls[0][:n])] + [tz.tok.decode(f[n:]) for f in fulls])),
                  flush=True)
    if not pf.rows:
        fail("%s: nothing left: %s" % (args.input, pf.summary(args.output, 0)))
    return pf


def mixed(where, this, form):
    """Exit 2: a line of another form than the file's (its first line's)."""
    fail("%s: %s in a file of %s (the first line's form; one form a file)"
         % (where, FORM_NAMES[this], FILE_NAMES[form]))


def write_token_file(path, data, attrs, vocab_size, model):
    """The HDF5 token file (checksummed 1.10 format), written to a temporary name beside
    `path` and renamed (tools/safe_output.py): an earlier file at that path survives a
    failed write (a full disk), which exits 1."""
    import h5py
    import numpy as np
    if data["input_ids"].max() >= vocab_size:
        fail("token id %d >= vocab_size %d of %s/config.json"
             % (data["input_ids"].max(), vocab_size, model))
    with file_output(path) as tmp:
        with h5py.File(tmp, "w", libver=("v110", "v110")) as h:
            for name, values in data.items():
                h.create_dataset(name, data=values)
            h.attrs["vocab_size"] = np.int64(vocab_size)
            for name, value in attrs.items():
                h.attrs[name] = value


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[4:]))
    ap.add_argument("--model", required=True, help="Hugging Face model directory (tokenizer)")
    ap.add_argument("--input", required=True, help="JSON lines, one example a line")
    ap.add_argument("--output", required=True, help="the HDF5 token file to write")
    ap.add_argument("--max-len", type=int, required=True, help="tokens per row")
    ap.add_argument("--pack", action="store_true", help="several examples a row (SFT data)")
    ap.add_argument("--overlong", choices=("drop", "truncate", "split"), default=None,
                    help="an example longer than --max-len (default: drop; preference data: "
                         "truncate, as TRL)")
    ap.add_argument("--system", default=None, help="a system message for chats without one")
    args = ap.parse_args(argv)
    if not 2 <= args.max_len <= 2 ** 31 - 1:
        fail("--max-len must be at least 2 and at most 2^31 - 1")
    if not os.path.exists(args.input):
        fail("--input %s: no such file" % args.input)
    if os.path.isdir(args.input):
        fail("--input %s is a directory; a JSON lines file is expected" % args.input)
    vocab_size = check_model_dir(args.model)
    # Every input: the data, the model directory and each of its files (a file of a hub
    # cache's snapshot is a link into its blobs: compared resolved too).
    inputs = [args.input, args.model] + [os.path.join(args.model, n)
                                         for n in sorted(os.listdir(args.model))]
    check_output_file("--output", args.output, inputs)

    try:
        import h5py  # noqa: F401 (write_token_file's)
        import numpy as np
    except ImportError as e:
        fail("needs h5py and numpy (pip install h5py): %s" % e)
    tz = Tokenizer(args.model)
    attrs = {"tokenizer_sha256": tokenizer_sha256(args.model)}

    # The first line says the file's form: SFT examples, or one of the preference forms.
    examples = read_examples(args.input)
    first = next(examples, None)
    form = preference_rows.form_of(first[1]) if first else None
    examples = itertools.chain([first] if first else [], examples)
    if form is not None:
        pf = preference_file(args, tz, examples, form)
        try:
            data, more = pf.arrays(np, tz.pad)
        except MemoryError:
            fail("--max-len %d: %d rows of it do not fit in memory" % (args.max_len, len(pf.rows)))
        write_token_file(args.output, data, dict(attrs, **more), vocab_size, args.model)
        print("tokenize_sft: " + pf.summary(args.output,
                                            int((data["labels"][:, 1:] != -100).sum())))
        return

    counts = collections.Counter()  # dropped or refused, by reason
    pieces, examples_read, written = [], 0, 0
    for where, ex in examples:
        examples_read += 1
        if preference_rows.form_of(ex) is not None:
            mixed(where, preference_rows.form_of(ex), None)
        try:
            ids, labels = example_of(tz, ex, where, args.system)
        except Refused as e:
            counts["refused: " + str(e)] += 1
            continue
        if examples_read == 1:
            print("tokenize_sft: first example as the model sees it:\n%s"
                  % tz.tok.decode(ids), flush=True)
        mine = pieces_of(ids, labels, args.max_len, args.overlong or "drop", counts)
        written += bool(mine)
        pieces += mine
    if not pieces:
        fail("%s: no example left (%d read; %s)" % (args.input, examples_read, dict(counts)))

    T = args.max_len
    rows = pack(pieces, T) if args.pack else [[p] for p in pieces]
    try:
        ids_a = np.full((len(rows), T), tz.pad, dtype=np.int32)
        labels_a = np.full((len(rows), T), -100, dtype=np.int32)
        pos_a = np.zeros((len(rows), T), dtype=np.int32)
    except MemoryError:
        fail("--max-len %d: %d rows of it do not fit in memory" % (T, len(rows)))
    for r, row in enumerate(rows):
        at = 0
        for ids, labels in row:
            n = len(ids)
            ids_a[r, at:at + n] = ids
            labels_a[r, at:at + n] = labels
            labels_a[r, at] = -100  # a document's first label is never scored
            pos_a[r, at:at + n] = np.arange(n)
            at += n
    data = {"input_ids": ids_a, "labels": labels_a}
    if args.pack:
        data["position_ids"] = pos_a
    write_token_file(args.output, data, attrs, vocab_size, args.model)
    tokens = sum(len(p[0]) for p in pieces)
    labels_scored = int((labels_a[:, 1:] != -100).sum())
    print("tokenize_sft: %s: %d examples read, %d written as %d %s of %d (%d pieces, %d tokens, "
          "%d scored labels, %.0f%% of the rows' positions real); %s"
          % (args.output, examples_read, written, len(rows),
             "packed rows" if args.pack else "rows", T, len(pieces), tokens, labels_scored,
             100.0 * tokens / (len(rows) * T),
             "; ".join("%s: %d" % kv for kv in sorted(counts.items())) or "none dropped"))


if __name__ == "__main__":
    main()
