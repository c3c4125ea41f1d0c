"""Preference data as TRL 1.16's DPOTrainer and KTOTrainer tokenize it, for tools/tokenize_sft.py
(which reads the lines, checks the messages and writes the file; its docstring and
docs/MODELS.md, "Data files", give the token file's form).

TRL 1.16's rules, written here from reading its trainers (trl/trainer/dpo_trainer.py and
kto_trainer.py, _prepare_dataset and the collators; trl/data_utils.py, extract_prompt):
- implicit prompt ({"chosen", "rejected"} only): the prompt is the longest common prefix of
  the two (messages, or characters of strings): the first index where they differ, one
  less when the character before it is a space (it goes to the completions); where one is
  a prefix of the other the loop ends on the shorter's last index, which then goes to the
  completions;
- strings: the tokenizer's EOS text appended to each completion that does not already end
  with it; the prompt and prompt + completion tokenized as text (the tokenizer's own
  special tokens, a BOS where it adds one);
- messages: the prompt rendered with the generation prompt, prompt + completion without,
  by the chat template (no EOS added: the template's end of turn, and what it writes after
  it, a newline, are the completion's);
- the prompt is the common token prefix of the prompt's ids and each prompt + completion's
  (for a pair the shorter of the two): a token that merges across the boundary, or a
  generation prompt the whole chat renders otherwise, goes to the completion;
- max_length: each row keeps its first max_length tokens (DPO's keep_start, its only
  supported mode; KTO truncates the same way), and an example whose prompt alone holds
  max_length tokens or more is dropped.
"""
import os

FORM_NAMES = {"pairs": "a prompt/chosen/rejected pair",
              "implicit": "a chosen/rejected pair (implicit prompt)",
              "unpaired": "an unpaired prompt/completion/label row",
              None: "an SFT example"}
FILE_NAMES = {"pairs": "prompt/chosen/rejected pairs",
              "implicit": "chosen/rejected pairs (implicit prompt)",
              "unpaired": "unpaired prompt/completion/label rows",
              None: "SFT examples"}
# The root attribute `form` of the token file, by input form.
FILE_FORM = {"pairs": "pairs", "implicit": "pairs", "unpaired": "unpaired"}


def form_of(ex):
    """The preference form of a parsed line (its keys say which), or None: an SFT line."""
    if not isinstance(ex, dict):
        return None
    if "chosen" in ex or "rejected" in ex:
        return "pairs" if "prompt" in ex else "implicit"
    if "label" in ex and ("prompt" in ex or "completion" in ex):
        return "unpaired"
    return None


def common_prefix_len(a, b):
    """The length of the longest common prefix of two sequences (os.path.commonprefix
    compares any sequences, lists of ids too)."""
    return len(os.path.commonprefix([a, b]))


def implicit_split(chosen, rejected):
    """Where TRL's extract_prompt ends the shared prompt of two conversations (lists of
    messages) or texts: the first index where they differ, less one where the character
    before it is a space; where none differs within the shorter one, its last index."""
    short = min(len(chosen), len(rejected))
    for i in range(short):
        if chosen[i] != rejected[i]:
            # (At 0 TRL looks at the last character: such a pair shares no prompt, and the
            # caller refuses it.)
            return i - 1 if i > 0 and chosen[i - 1] == " " else i
    return short - 1


def with_eos(text, eos):
    """A string completion as TRL tokenizes it: its EOS text appended unless it ends so."""
    return text if text.endswith(eos) else text + eos


def string_rows(tok, prompt, completions):
    """(prompt length, full rows) of a text prompt and its completions, TRL's way."""
    prompt_ids = list(tok(prompt)["input_ids"])
    fulls = [list(tok(prompt + with_eos(c, tok.eos_token))["input_ids"]) for c in completions]
    return min(common_prefix_len(prompt_ids, f) for f in fulls), fulls


def chat_rows(render, prompt, completions, tools):
    """(prompt length, full rows) of a chat prompt and its completions (lists of messages),
    TRL's way: render(messages, generation_prompt, tools) is the template's ids."""
    prompt_ids = render(prompt, True, tools)
    fulls = [render(prompt + c, False, tools) for c in completions]
    return min(common_prefix_len(prompt_ids, f) for f in fulls), fulls


def fit(fulls, n, max_len, overlong):
    """The rows within max_len and what was done: ("kept" | "truncated", rows), or
    (reason, None) for an example dropped whole."""
    if n >= max_len:  # TRL drops it: truncation would leave nothing scored
        return "the prompt fills --max-len", None
    if all(len(f) <= max_len for f in fulls):
        return "kept", fulls
    if overlong == "drop":
        return "longer than --max-len", None
    return "truncated", [f[:max_len] for f in fulls]


class PreferenceFile:
    """The rows of a pairs or unpaired token file as they are added, and the counts."""

    def __init__(self, form, max_len):
        self.form, self.max_len = FILE_FORM[form], max_len
        self.unit = "pair" if self.form == "pairs" else "unpaired row"
        self.rows, self.prompt_len, self.desirable = [], [], []
        self.read = self.truncated = self.identical = 0
        self.dropped, self.refused = {}, {}  # reason -> count

    def refuse(self, reason):
        """An example the chat checks refused (tools/tokenize_sft.py's Refused)."""
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def add(self, n, fulls, overlong, label=None):
        """An example's rows (a pair's chosen and rejected, or one unpaired row) with n
        prompt tokens: fitted to --max-len, a pair skipped where its rows are equal."""
        what, rows = fit(fulls, n, self.max_len, overlong)
        if rows is None:
            self.dropped[what] = self.dropped.get(what, 0) + 1
            return False
        if len(rows) == 2 and rows[0] == rows[1]:  # no preference to learn from
            self.identical += 1
            return False
        self.truncated += what == "truncated"
        self.rows += rows
        self.prompt_len += [n] * len(rows)
        if label is not None:
            self.desirable.append(label)
        return True

    def examples(self):
        return len(self.rows) // (2 if self.form == "pairs" else 1)

    def arrays(self, np, pad):
        """The datasets and attributes of the token file."""
        T = self.max_len
        ids = np.full((len(self.rows), T), pad, dtype=np.int32)
        labels = np.full((len(self.rows), T), -100, dtype=np.int32)
        for r, (row, n) in enumerate(zip(self.rows, self.prompt_len)):
            ids[r, :len(row)] = row
            labels[r, n:len(row)] = row[n:]
        data = {"input_ids": ids, "labels": labels,
                "prompt_len": np.array(self.prompt_len, dtype=np.int32)}
        attrs = {"form": self.form}
        if self.form == "pairs":
            attrs["pairs"] = np.int64(self.examples())
        else:
            data["desirable"] = np.array(self.desirable, dtype=np.int8)
        return data, attrs

    def summary(self, out, labels_scored):
        """The summary line: examples read, kept (truncated), dropped, skipped, refused."""
        def reasons(counts):
            return " (%s)" % "; ".join("%s: %d" % kv for kv in sorted(counts.items())) \
                if counts else ""
        extra = ""
        if self.form == "unpaired":
            good = sum(self.desirable)
            extra = "%d desirable, %d undesirable; " % (good, len(self.desirable) - good)
        identical = ", %d skipped as identical (chosen and rejected rows equal)" \
            % self.identical if self.form == "pairs" else ""
        return ("%s: %d %ss read: %d kept as %d rows of %d (%s%d truncated to --max-len; %d "
                "tokens, %d scored labels), %d dropped%s%s, %d refused%s"
                % (out, self.read, self.unit, self.examples(), len(self.rows), self.max_len,
                   extra, self.truncated, sum(len(r) for r in self.rows), labels_scored,
                   sum(self.dropped.values()), reasons(self.dropped), identical,
                   sum(self.refused.values()), reasons(self.refused)))
