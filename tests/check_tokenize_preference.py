#!/usr/bin/env python3
"""tools/tokenize_sft.py on preference data against TRL 1.16's own ids (ctest
tokenize_preference):

    python3 tests/check_tokenize_preference.py WORKDIR

tests/data/preference/ holds the inputs (prompt/chosen/rejected strings and messages, the
implicit-prompt form in both, KTO's unpaired rows in both, a Qwen3-template chat with
reasoning; multi-byte text, a token that merges across the prompt's end, a completion
that already ends with the EOS text, identical completions, an overlong completion and an
overlong prompt), a small tokenizer (model/) and, beside each input, the ids TRL 1.16's
DPOTrainer / KTOTrainer made of it (NAME.expected.json, written by
tools/gen_preference_reference.py; trl is not imported here). For each input, the tool's
token file must hold exactly TRL's rows, in order: input_ids, labels (TRL's completion
mask; -100 elsewhere and on the right padding), prompt_len, desirable (KTO), the
attributes form, pairs, vocab_size, tokenizer_sha256; the pairs TRL dropped (the prompt
fills max_length) are dropped, those it keeps with equal rows are skipped, and the summary
counts them. With --overlong drop the truncated pairs are dropped whole. The implicit
prompt's text is where TRL's extract_prompt puts it. Bad input exits 2 naming the file and
the line (mixed forms, an implicit prompt that differs, an empty completion, a KTO label
that is not a boolean, ...), and --pack / --overlong split with preference data exit 2; an
--output naming the input is refused and a failed write leaves the earlier file, as for SFT
files; a chat the SFT rules refuse is counted. Exit 77 (ctest: skipped) when transformers,
tokenizers or h5py cannot be imported.
"""
import hashlib
import json
import os
import shutil
import sys

try:
    import h5py
    import numpy as np
    import tokenizers  # noqa: F401
    import transformers  # noqa: F401
except ImportError as e:
    print("SKIPPED: %s (pip install transformers h5py to run this test)" % e)
    sys.exit(77)
from tool_in_process import run_tool  # noqa: E402
import preference_rows  # noqa: E402 (tools/, on the path tool_in_process sets)

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "preference")
MODEL = os.path.join(DATA, "model")
QWEN3_TEMPLATE = os.path.join(HERE, "data", "chat_templates", "Qwen-Qwen3-0.6B.jinja")
CASES = ["standard", "conversational", "implicit", "implicit_standard", "unpaired",
         "unpaired_conversational", "qwen3"]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED: " + what)
    return cond


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tool(model, src, out, *flags):
    return run_tool("tokenize_sft", ["--model", model, "--input", src, "--output", out] +
                    list(flags))


def read(out):
    with h5py.File(out) as h:
        data = {k: np.array(h[k]) for k in h}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in h.attrs.items()}
    return data, attrs


def expected_rows(ref, keep):
    """TRL's rows, in file order, of the entries `keep` accepts: (line, prompt_len, row,
    desirable) each."""
    out = []
    for e in ref["kept"]:
        if keep(e):
            for row in e.get("rows") or [e]:
                out.append((e["line"], e["prompt_len"], row, e.get("desirable")))
    return out


def compare(name, out, ref, rows, pad):
    """The token file against TRL's rows: every id, label, prompt_len, desirable."""
    data, attrs = read(out)
    T = ref["max_len"]
    pairs = ref["trainer"] == "DPOTrainer"
    ok = check(data["input_ids"].shape == (len(rows), T) and data["labels"].shape ==
               (len(rows), T) and data["input_ids"].dtype == np.int32 and
               data["labels"].dtype == np.int32 and data["prompt_len"].dtype == np.int32 and
               data["prompt_len"].shape == (len(rows),),
               "%s: shapes %s, expected %d rows of %d" % (
                   name, {k: (v.shape, str(v.dtype)) for k, v in data.items()}, len(rows), T))
    check(attrs.get("form") == ("pairs" if pairs else "unpaired"), "%s: form %r" % (
        name, attrs.get("form")))
    if pairs:
        check(attrs.get("pairs") == len(rows) // 2 and "desirable" not in data,
              "%s: pairs attribute %r, expected %d" % (name, attrs.get("pairs"), len(rows) // 2))
    else:
        check("pairs" not in attrs and data["desirable"].dtype == np.int8 and
              list(data["desirable"]) == [int(r[3]) for r in rows],
              "%s: desirable %s, expected %s" % (name, data.get("desirable"),
                                                 [int(r[3]) for r in rows]))
    check(attrs.get("tokenizer_sha256") == ref["tokenizer_sha256"] and
          attrs.get("vocab_size") == json.load(open(os.path.join(MODEL, "config.json")))
          ["vocab_size"], "%s: attributes %s" % (name, attrs))
    if not ok:
        return
    for r, (line, n, row, _) in enumerate(rows):
        want_ids, want_labels = row["input_ids"], row["labels"]
        L = len(want_ids)
        where = "%s: row %d (line %d%s)" % (name, r, line, ", rejected" if pairs and r % 2 else
                                            ", chosen" if pairs else "")
        got_ids, got_labels = data["input_ids"][r, :L].tolist(), data["labels"][r, :L].tolist()
        check(got_ids == want_ids, "%s: input_ids %s, TRL's %s" % (where, got_ids, want_ids))
        check(got_labels == want_labels, "%s: labels %s, TRL's %s"
              % (where, got_labels, want_labels))
        check((data["input_ids"][r, L:] == pad).all() and (data["labels"][r, L:] == -100).all(),
              "%s: padding after %d tokens" % (where, L))
        check(data["prompt_len"][r] == n, "%s: prompt_len %d, TRL's %d"
              % (where, data["prompt_len"][r], n))


def main():
    work = sys.argv[1]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    qwen3 = os.path.join(work, "qwen3")
    shutil.copytree(MODEL, qwen3)
    shutil.copy(QWEN3_TEMPLATE, os.path.join(qwen3, "chat_template.jinja"))
    models = {"chatml": MODEL, "qwen3": qwen3}
    pad = transformers.AutoTokenizer.from_pretrained(MODEL).pad_token_id

    # Every input against TRL's ids: the default (TRL's truncation), then --overlong drop.
    for case in CASES:
        ref = json.load(open(os.path.join(DATA, case + ".expected.json"), encoding="utf-8"))
        model = models[ref["model"]]
        check(ref["trl"] == "1.16.0" and ref["tokenizer_sha256"] ==
              sha256(os.path.join(model, "tokenizer.json")) and ref["chat_template_sha256"] ==
              sha256(os.path.join(model, "chat_template.jinja")),
              "%s: the reference was made with another tokenizer or template (rerun "
              "tools/gen_preference_reference.py)" % case)
        src = os.path.join(DATA, case + ".jsonl")
        T = str(ref["max_len"])
        pairs = ref["trainer"] == "DPOTrainer"
        unit = "pairs" if pairs else "unpaired rows"
        read_n = sum(1 for line in open(src, encoding="utf-8") if line.strip())
        for overlong in ("", "drop"):
            out = os.path.join(work, "%s%s.h5" % (case, "_" + overlong if overlong else ""))
            status, log = tool(model, src, out, "--max-len", T,
                               *(["--overlong", overlong] if overlong else []))
            name = case + (" --overlong drop" if overlong else "")
            if not check(status == 0, "%s: exit %d: %s" % (name, status, log)):
                continue
            keep = (lambda e: not e.get("identical")) if not overlong else \
                (lambda e: not e.get("identical") and not e["truncated"])
            rows = expected_rows(ref, keep)
            compare(name, out, ref, rows, pad)
            kept = len(rows) // (2 if pairs else 1)
            truncated = 0 if overlong else sum(e["truncated"] and keep(e) for e in ref["kept"])
            longer = sum(e["truncated"] for e in ref["kept"]) if overlong else 0
            identical = sum(bool(e.get("identical")) and not (overlong and e["truncated"])
                            for e in ref["kept"])
            dropped = len(ref["dropped"]) + longer
            want = ["%d %s read: %d kept as %d rows of %s (" % (read_n, unit, kept, len(rows), T),
                    "%d truncated to --max-len;" % truncated,
                    "%d dropped" % dropped, "0 refused"]
            if ref["dropped"]:
                want.append("the prompt fills --max-len: %d" % len(ref["dropped"]))
            if longer:
                want.append("longer than --max-len: %d" % longer)
            if pairs:
                want.append("%d skipped as identical" % identical)
            check(all(w in log for w in want), "%s: summary lacks %s: %s" % (
                name, [w for w in want if w not in log], log.strip().split("\n")[-1]))
        check_extract_prompt(case, src, ref)
        print("%s: TRL's ids, labels and prompt lengths, and with --overlong drop: %s"
              % (case, "ok" if not failures else "see above"))

    bad_input(work)
    if failures:
        sys.exit("FAILED: %d checks" % len(failures))
    print("all ok")


def check_extract_prompt(case, src, ref):
    """The implicit prompt where TRL's extract_prompt finds it, as text (the ids hide a
    space that moves to the completions: the common token prefix drops it either way)."""
    lines = [json.loads(line) for line in open(src, encoding="utf-8") if line.strip()]
    for want in ref.get("extract_prompt", []):
        ex = lines[want["line"] - 1]
        i = preference_rows.implicit_split(ex["chosen"], ex["rejected"])
        got = ex["chosen"][:i] if isinstance(ex["chosen"], str) else {"messages": i}
        check(got == want["prompt"], "%s: line %d: implicit prompt %r, TRL's extract_prompt %r"
              % (case, want["line"], got, want["prompt"]))


def bad_input(work):
    """Exit 2 naming the file and the line, never a traceback, no output written."""
    user = {"role": "user", "content": "What color is the sky?"}
    blue = {"role": "assistant", "content": "It is blue."}
    green = {"role": "assistant", "content": "It is green."}
    pair = {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}
    chat_pair = {"prompt": [user], "chosen": [blue], "rejected": [green]}
    kto = {"prompt": "The sky is", "completion": " blue.", "label": True}
    cases = [
        ("an unpaired row in a file of pairs", [pair, kto], [],
         [":2:", "an unpaired prompt/completion/label row in a file of prompt/chosen/rejected "
          "pairs", "one form a file"]),
        ("a pair in a file of SFT examples", [{"text": "hello"}, pair], [],
         [":2:", "a prompt/chosen/rejected pair in a file of SFT examples"]),
        ("an SFT example in a file of pairs", [pair, pair, {"messages": [user, blue]}], [],
         [":3:", "an SFT example in a file of prompt/chosen/rejected pairs"]),
        ("an implicit pair in a file of pairs", [pair, {"chosen": "a b", "rejected": "a c"}], [],
         [":2:", "a chosen/rejected pair (implicit prompt) in a file of prompt/chosen/rejected "
          "pairs"]),
        ("messages in a file of strings", [pair, chat_pair], [],
         [":2:", "lists of messages in a file of strings"]),
        ("a JSON array in a file of pairs", [pair, [1, 2]], [],
         [":2:", "expected a JSON object"]),
        ("strings and messages in one pair", [dict(pair, chosen=[blue])], [],
         [":1:", "all strings or all lists of messages"]),
        ("an implicit prompt that differs", [
            {"chosen": [user, blue], "rejected": [user, green]},
            {"chosen": [user, blue], "rejected": [dict(user, content="Sky?"), blue]}], [],
         [":2:", "the prompt differs between \"chosen\" and \"rejected\"", "message 0"]),
        ("implicit texts sharing nothing", [{"chosen": "yes", "rejected": "no"}], [],
         [":1:", "share no prompt"]),
        ("an empty chosen string", [pair, dict(pair, chosen="")], [],
         [":2:", "an empty \"chosen\" completion"]),
        ("an empty rejected list", [chat_pair, dict(chat_pair, rejected=[])], [],
         [":2:", "an empty \"rejected\" completion"]),
        ("an empty assistant message",
         [chat_pair, dict(chat_pair, chosen=[dict(blue, content="")])], [],
         [":2:", "an empty \"chosen\" completion"]),
        ("an empty implicit completion",
         [{"chosen": [user, blue], "rejected": [user, dict(blue, content="")]}], [],
         [":1:", "an empty \"rejected\" completion"]),
        ("an empty KTO completion", [kto, dict(kto, completion="")], [],
         [":2:", "an empty \"completion\" completion"]),
        ("a user message as a completion", [dict(chat_pair, rejected=[user])], [],
         [":1:", "\"rejected\" message 0 is a user message"]),
        ("a KTO label that is a string", [kto, dict(kto, label="yes")], [],
         [":2:", "\"label\" is \"yes\"", "true or false"]),
        ("a KTO label that is a number", [kto, dict(kto, label=1)], [],
         [":2:", "\"label\" is 1"]),
        ("--pack with pairs", [pair], ["--pack"], ["--pack", "not packed"]),
        ("--overlong split with pairs", [pair], ["--overlong", "split"],
         ["--overlong split", "never split"]),
    ]
    src = os.path.join(work, "bad.jsonl")
    out = os.path.join(work, "bad.h5")
    for what, lines, flags, words in cases:
        with open(src, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
        status, log = tool(MODEL, src, out, "--max-len", "32", *flags)
        words = ["bad.jsonl" + w if w.startswith(":") else w for w in words]
        check(status == 2 and "tokenize_sft: error: " in log and "Traceback" not in log and
              all(w in log for w in words) and not os.path.exists(out),
              "%s: exit %d (expected 2 with %s): %s" % (what, status, words, log.strip()))
    # The output rules of SFT files: an --output naming the input refused (exit 2), the
    # input untouched; a failed write (a full disk) exit 1, the earlier file whole.
    with open(src, "w", encoding="utf-8") as f:
        f.write(json.dumps(pair) + "\n")
    before = open(src, "rb").read()
    status, log = tool(MODEL, src, src, "--max-len", "32")
    check(status == 2 and "--output" in log and open(src, "rb").read() == before,
          "--output the input: exit %d: %s" % (status, log))
    check(tool(MODEL, src, out, "--max-len", "32")[0] == 0, "a good pair file")
    before = open(out, "rb").read()
    real_file = h5py.File

    def full_disk(path, *a, **k):
        with open(path, "wb") as f:
            f.write(b"\x89HDF\r\n\x1a\n partial")
        raise OSError(28, "No space left on device")
    h5py.File = full_disk
    try:
        status, log = tool(MODEL, src, out, "--max-len", "32")
    finally:
        h5py.File = real_file
    check(status == 1 and "No space left" in log and open(out, "rb").read() == before and
          not [n for n in os.listdir(work) if ".tmp-" in n],
          "a failed write: exit %d, %s" % (status, log))
    os.remove(out)
    # A chat the SFT rules refuse is counted by its reason, the rest written.
    with open(src, "w", encoding="utf-8") as f:
        f.write(json.dumps(chat_pair) + "\n" + json.dumps(dict(chat_pair, prompt=[blue, user]))
                + "\n")
    status, log = tool(MODEL, src, out, "--max-len", "32")
    check(status == 0 and "1 kept" in log and
          "1 refused (role order: the chat does not open with a user turn: 1)" in log,
          "a refused chat: exit %d: %s" % (status, log))
    print("bad input: exit 2 with the file and line (%d cases); the output rules (the input "
          "never overwritten, a failed write leaves the earlier file); a refused chat counted: "
          "%s" % (len(cases), "ok" if not failures else "see above"))


if __name__ == "__main__":
    main()
