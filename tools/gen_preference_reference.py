#!/usr/bin/env python3
"""TRL 1.16's own token ids for tests/data/preference/*.jsonl (ctest tokenize_preference's
reference; run by hand, never by the test):

    python3 tools/gen_preference_reference.py [--remake-model]

Needs trl==1.16.0 (pip install trl==1.16.0), torch, transformers, datasets. Nothing is
downloaded. tests/data/preference/model/ is a small tokenizer made here once (a byte-level
BPE trained with the `tokenizers` package on the inputs' text, a BOS the post-processor
adds, <|im_end|> as EOS, a ChatML template that starts with the BOS) and committed, so the
ids do not depend on how a later `tokenizers` trains; --remake-model trains it again (then
rerun this script: every reference changes). A Qwen3 variant is the same tokenizer with
tests/data/chat_templates/Qwen-Qwen3-0.6B.jinja as its template, made in a scratch
directory here and by the test alike.

Each case is one input file, a model and a --max-len. TRL's DPOTrainer (pairs) or
KTOTrainer (unpaired rows) is built on a tiny random Llama with that max_length, and its
prepared train_dataset (prompt_ids and completion ids, after its prompt extraction, EOS
appending, tokenization, common-prefix split and the filter that drops an example whose
prompt fills max_length) goes through its own collator (DataCollatorForPreference /
DataCollatorForUnpairedPreference, which truncate each row to max_length). Each row's
real tokens (attention mask 1) are the expected input_ids; its labels are the ids where
the collator's completion_mask is 1, else -100, as TRL's loss builds them. Written to
tests/data/preference/NAME.expected.json: for each input line TRL kept, its rows,
prompt_len (TRL's len(prompt_ids)), whether a row was cut to max_length, and (pairs)
whether the chosen and rejected rows are equal (TRL trains such a pair; kqlora's tool
skips it); the lines TRL dropped.
"""
import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "preference")
MODEL = os.path.join(DATA, "model")
QWEN3_TEMPLATE = os.path.join(ROOT, "tests", "data", "chat_templates", "Qwen-Qwen3-0.6B.jinja")
TRL_VERSION = "1.16.0"

CHATML = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
          "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
          "{% endif %}")
SPECIALS = ["<pad>", "<s>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
ADDED = ["<think>", "</think>"]  # (Qwen3's, not special: as its tokenizer has them)

# (input file, model, trainer, --max-len)
CASES = [
    ("standard.jsonl", "chatml", "dpo", 24),
    ("conversational.jsonl", "chatml", "dpo", 48),
    ("implicit.jsonl", "chatml", "dpo", 48),
    ("implicit_standard.jsonl", "chatml", "dpo", 32),
    ("unpaired.jsonl", "chatml", "kto", 24),
    ("unpaired_conversational.jsonl", "chatml", "kto", 48),
    ("qwen3.jsonl", "qwen3", "dpo", 64),
]


def texts_of(value):
    """Every string in a parsed JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from texts_of(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from texts_of(v)


def read_lines(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def make_model(path):
    """The committed tokenizer: a byte-level BPE trained on the inputs' text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    corpus = [t for name, _, _, _ in CASES for ex in read_lines(name) for t in texts_of(ex)]
    corpus += ["hello hello hello world", "system user assistant\n\n"] * 3
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=600, min_frequency=2, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tk.add_tokens(ADDED)
    tk.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", tk.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="<|im_end|>",
                                   pad_token="<pad>", additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHATML
    shutil.rmtree(path, ignore_errors=True)
    fast.save_pretrained(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "vocab_size": len(fast)}, f, indent=1)
        f.write("\n")


def model_dir(kind, scratch):
    """The model directory of a case: the committed one, or its Qwen3 variant."""
    if kind == "chatml":
        return MODEL
    path = os.path.join(scratch, "qwen3")
    if not os.path.isdir(path):
        shutil.copytree(MODEL, path)
        shutil.copy(QWEN3_TEMPLATE, os.path.join(path, "chat_template.jinja"))
    return path


def tiny_model(vocab_size):
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=2))


def rows_of(batch):
    """(input_ids, labels) of each row of a collated batch: its real tokens, labels where the
    completion mask is 1 (TRL's loss: input_ids.masked_fill(completion_mask == 0, -100))."""
    out = []
    for ids, att, mask in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist(),
                              batch["completion_mask"].tolist()):
        n = sum(att)
        out.append({"input_ids": ids[:n],
                    "labels": [t if m else -100 for t, m in zip(ids[:n], mask[:n])]})
    return out


def trl_reference(name, kind, trainer, max_len, scratch):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference
    from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference
    path = model_dir(kind, scratch)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    lines = read_lines(name)
    data = Dataset.from_list([dict(ex, line=n) for n, ex in enumerate(lines, 1)])
    common = dict(output_dir=os.path.join(scratch, "out"), max_length=max_len, report_to="none",
                  per_device_train_batch_size=2, use_cpu=True)
    if trainer == "dpo":
        t = DPOTrainer(model=tiny_model(len(tok)), ref_model=tiny_model(len(tok)),
                       args=DPOConfig(**common), train_dataset=data, processing_class=tok)
        collate = DataCollatorForPreference(pad_token_id=tok.pad_token_id, max_length=max_len)
        keys = ("prompt_ids", "chosen_ids", "rejected_ids")
    else:
        t = KTOTrainer(model=tiny_model(len(tok)), ref_model=tiny_model(len(tok)),
                       args=KTOConfig(**common), train_dataset=data, processing_class=tok)
        collate = DataCollatorForUnpairedPreference(pad_token_id=tok.pad_token_id,
                                                    max_length=max_len)
        keys = ("prompt_ids", "completion_ids", "label")
    kept = []
    for ex in t.train_dataset:
        rows = rows_of(collate([{k: ex[k] for k in keys}]))
        n = len(ex["prompt_ids"])
        full = [n + len(ex[k]) for k in keys[1:] if k.endswith("_ids")]
        entry = {"line": ex["line"], "prompt_len": n, "truncated": max(full) > max_len}
        if trainer == "dpo":
            entry["rows"] = rows  # chosen, rejected
            entry["identical"] = rows[0] == rows[1]
        else:
            entry.update(rows[0], desirable=bool(ex["label"]))
        kept.append(entry)
    dropped = sorted(set(range(1, len(lines) + 1)) - {e["line"] for e in kept})
    extra = {}
    if "prompt" not in lines[0]:  # TRL's extract_prompt on each line: the prompt it finds
        from trl.data_utils import extract_prompt
        extra["extract_prompt"] = [
            {"line": n, "prompt": p if isinstance(p, str) else {"messages": len(p)}}
            for n, p in ((n, extract_prompt(ex)["prompt"]) for n, ex in enumerate(lines, 1))]
    return {"input": name, "model": kind, "trainer": type(t).__name__, "max_len": max_len,
            "trl": TRL_VERSION, "tokenizer_sha256": sha256(os.path.join(path, "tokenizer.json")),
            "chat_template_sha256": sha256(os.path.join(path, "chat_template.jinja")),
            "kept": kept, "dropped": dropped, **extra}


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--remake-model", action="store_true",
                    help="train tests/data/preference/model/ again (every reference changes)")
    args = ap.parse_args()
    import trl
    if trl.__version__ != TRL_VERSION:
        sys.exit("gen_preference_reference: needs trl==%s, found %s"
                 % (TRL_VERSION, trl.__version__))
    if args.remake_model or not os.path.isdir(MODEL):
        make_model(MODEL)
    with tempfile.TemporaryDirectory() as scratch:
        for name, kind, trainer, max_len in CASES:
            ref = trl_reference(name, kind, trainer, max_len, scratch)
            out = os.path.join(DATA, name.replace(".jsonl", ".expected.json"))
            with open(out, "w", encoding="utf-8") as f:
                f.write(compact_json(ref))
            print("%s: %d kept, dropped lines %s" % (out, len(ref["kept"]), ref["dropped"]))


def compact_json(ref):
    """Indented JSON with each id list on one line (small diffs when a reference changes)."""
    text = json.dumps(ref, indent=1, ensure_ascii=False)
    out, buf = [], None
    for line in text.split("\n"):
        s = line.strip()
        if buf is not None:
            buf.append(s)
            if s.startswith("]"):
                out.append(buf[0] + " ".join(buf[1:]).replace(" ]", "]"))
                buf = None
            continue
        if s.endswith("[") and s.startswith(('"input_ids"', '"labels"', '"dropped"')):
            buf = [line]
            continue
        out.append(line)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
