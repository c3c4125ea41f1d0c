#!/usr/bin/env python3
"""TRL 1.16's own numbers for kqlora's preference objectives (DPO, SimPO, ORPO) on three
committed reference models (CPU, float32, offline):

    python3 tools/gen_dpo_reference.py                    # gqa, qwen3, gemma2
    python3 tools/gen_dpo_reference.py --cases gemma2 --out /tmp/pref

Needs trl==1.16.0, transformers 5.x, peft, torchao, torch, tokenizers, datasets, h5py.
Nothing is downloaded. Deterministic (each case's token ids from its own seeded generator,
one thread); the outputs are committed.

Cases (read, never modified): tests/data/llama_reference/gqa (Llama, grouped-query
attention, the default attention implementation, as that case was generated),
tests/data/family_reference/qwen3 and tests/data/family_reference/gemma2 (eager attention;
Gemma 2's attention and final-logit soft-caps). Each is loaded from its config.json and
model.safetensors; every base projection's weight becomes torchao's NF4 dequantization of
it (block 32, scaler block 32: tools/gen_llama_reference.py's replace_with_nf4, checked
byte for byte against init.h5's NF4 components); LoRA rank 4, alpha 8, dropout 0 on the
seven projections (all-linear) with init.h5's adapters.

For each case it writes tests/data/preference_reference/<case>/ (HDF5 1.10 format):
  pairs.h5         kqlora's preference token file: input_ids, labels int32 [2P, T] (row
                   2i pair i's chosen = prompt + chosen completion, row 2i+1 its rejected =
                   the same prompt + rejected completion; labels -100 on the prompt and the
                   right padding (id 0), the ids on the completion), prompt_len int32 [2P];
                   attributes form = "pairs", pairs = P, vocab_size. P = 4, T = 14.
  init_fresh.h5    init.h5's NF4 groups and LoRA A, every LoRA B zeros (a fresh adapter)
  <variant>_<start>.h5 for the variants
                   dpo_sigmoid, dpo_hinge, dpo_ipo (beta 0.1), dpo_robust (beta 0.1,
                   label_smoothing 0.1): starts "adapter" and "fresh";
                   simpo (CPOTrainer loss_type "simpo", beta 2, simpo_gamma 0.5,
                   label_smoothing 0, cpo_alpha 0), orpo (ORPOTrainer, beta 0.1): "adapter"
                   start "adapter": the run starts from init.h5's A and B. The model handed
                   to DPOTrainer is that PeftModel (no peft_config), so DPOTrainer.__init__
                   itself adds the frozen copy under the adapter name "ref" and scores the
                   reference with it (use_adapter(model, "ref")).
                   start "fresh": the base model and a LoraConfig are handed to DPOTrainer
                   (peft_config), which wraps it; its adapter is then set to init_fresh.h5's
                   (A from init.h5, B zeros); TRL's reference is the base with the adapters
                   disabled (no "ref" adapter).
                   Datasets:
                     loss [1]            TRL's loss on the batch of all P pairs
                     metrics/<name> [1]  TRL's metrics of that call, TRL's names nested
                                         (metrics/rewards/chosen, metrics/logps/rejected,
                                         metrics/nll_loss, ...)
                     grads/<kqlora name> float64, d loss / d every LoRA tensor
                     losses [5]          5 AdamW steps over the whole batch, the loss of
                                         each before its update (losses[0] = loss)
                     step_metrics/<name> [5]  the metrics of those 5 calls (DPO's rewards
                                         are 0 at step 0, the policy being its reference)
                     final/<kqlora name> float32, the adapters after the 5 steps
                   attributes objective (dpo, simpo, orpo), loss_type, beta,
                   label_smoothing, simpo_gamma, lr, eps, weight_decay, start, steps, pairs
The steps: torch.optim.AdamW(lr 1e-2, betas (0.9, 0.999), eps 1e-3, weight_decay 0.01,
PyTorch's default) over the policy's ("default") LoRA tensors, the loss recomputed by TRL
each step on the same batch.

The numbers come from TRL's own code: DPOTrainer.compute_loss (= _compute_loss, its fused
LM head's log-probabilities), CPOTrainer.get_batch_loss_metrics and
ORPOTrainer.get_batch_loss_metrics, on batches made by the trainers' own collators
(DataCollatorForPreference from prompt_ids / chosen_ids / rejected_ids;
DPODataCollatorWithPadding from tokenize_row's per-pair fields) out of pairs.h5's rows, so
nothing is truncated, padded differently or packed (checked: the batch's rows are
pairs.h5's, TRL's order being the P chosen rows then the P rejected rows). Checked at each
of the 5 steps: TRL's per-sequence log-probabilities (the policy's, and DPO's reference's)
against a float64 log-softmax of the model's own logits (within 1e-5), TRL's reward and
log-probability metrics against those, and TRL's loss against the objective's formula
(include/kqlora/train/preference_loss.hpp's, written out here) evaluated on them: equal
for every variant except that ORPO's NLL is TRL's (ORPOTrainer.concatenated_forward's
cross-entropy over every attended token of the chosen rows, the prompt's tokens included
from position 1, where preference_loss.hpp takes the completions' tokens only).
"""
import argparse
import contextlib
import io
import logging
import os
import shutil
import sys
import tempfile
import warnings

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_llama_reference as glr  # noqa: E402  (also: torch.set_num_threads(1))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "preference_reference")
LIBVER = ("v110", "v110")
TRL_VERSION = "1.16.0"

P, T = 4, 14
# (prompt, chosen, rejected) lengths of the 4 pairs: prompts of 3-6 tokens, completions of
# 2-8, the chosen and rejected lengths different in 3 pairs; the longest row fills T.
LAYOUT = [(4, 2, 7), (6, 8, 3), (3, 5, 5), (5, 6, 2)]
STEPS, LR, EPS, WEIGHT_DECAY = 5, glr.LR, 1e-3, 0.01

# name -> (folder, case dict, eager attention, seed of the pairs' ids)
CASES = {
    "gqa": ("tests/data/llama_reference/gqa", glr.LLAMA_CASES["gqa"], False, 3001),
    "qwen3": ("tests/data/family_reference/qwen3", glr.FAMILY_CASES["qwen3"], True, 3002),
    "gemma2": ("tests/data/family_reference/gemma2", glr.FAMILY_CASES["gemma2"], True, 3003),
}

# (variant, objective, loss_type, beta, label_smoothing, simpo_gamma, starts)
VARIANTS = [
    ("dpo_sigmoid", "dpo", "sigmoid", 0.1, 0.0, 0.0, ("adapter", "fresh")),
    ("dpo_hinge", "dpo", "hinge", 0.1, 0.0, 0.0, ("adapter", "fresh")),
    ("dpo_ipo", "dpo", "ipo", 0.1, 0.0, 0.0, ("adapter", "fresh")),
    ("dpo_robust", "dpo", "robust", 0.1, 0.1, 0.0, ("adapter", "fresh")),
    ("simpo", "simpo", "simpo", 2.0, 0.0, 0.5, ("adapter",)),
    ("orpo", "orpo", "orpo", 0.1, 0.0, 0.0, ("adapter",)),
]


# ---------------------------------------------------------------- data
def make_pairs(vocab, seed):
    """P pairs of random ids in 1..vocab-1 (LAYOUT's lengths) as kqlora's rows and as
    TRL's per-example fields."""
    gen = torch.Generator().manual_seed(seed)
    ids = np.zeros((2 * P, T), np.int32)
    labels = np.full((2 * P, T), -100, np.int32)
    prompt_len = np.zeros(2 * P, np.int32)
    examples = []
    for i, (lp, lc, lr) in enumerate(LAYOUT):
        assert lp + max(lc, lr) <= T
        prompt = torch.randint(1, vocab, (lp,), generator=gen).tolist()
        chosen = torch.randint(1, vocab, (lc,), generator=gen).tolist()
        rejected = torch.randint(1, vocab, (lr,), generator=gen).tolist()
        for row, comp in ((2 * i, chosen), (2 * i + 1, rejected)):
            seq = prompt + comp
            ids[row, :len(seq)] = seq
            labels[row, lp:len(seq)] = comp
            prompt_len[row] = lp
        examples.append(dict(prompt=prompt, chosen=chosen, rejected=rejected))
    assert max(lp + max(lc, lr) for lp, lc, lr in LAYOUT) == T
    return ids, labels, prompt_len, examples


def write_pairs(path, ids, labels, prompt_len, vocab):
    with h5py.File(path, "w", libver=LIBVER) as f:
        f.create_dataset("input_ids", data=ids)
        f.create_dataset("labels", data=labels)
        f.create_dataset("prompt_len", data=prompt_len)
        f.attrs["form"] = "pairs"
        f.attrs["pairs"] = np.int64(P)
        f.attrs["vocab_size"] = np.int64(vocab)


def write_init_fresh(src, dst):
    """init.h5's NF4 groups (copied as they are) and LoRA A; every LoRA B zeros (the same
    layout: one chunk, fletcher32)."""
    with h5py.File(src, "r") as fi, h5py.File(dst, "w", libver=LIBVER) as fo:
        g = fo.create_group("params")
        for name in sorted(fi["params"]):
            item = fi["params"][name]
            if isinstance(item, h5py.Group):  # (rewritten: a copy keeps the old B-tree index)
                grp = g.create_group(name)
                for k in sorted(item):
                    a = item[k][()]
                    grp.create_dataset(k, data=a, chunks=a.shape, fletcher32=True)
                for k, val in item.attrs.items():
                    grp.attrs[k] = val
            elif ".lora_b." in name:
                z = np.zeros(item.shape, item.dtype)
                g.create_dataset(name, data=z, chunks=z.shape, fletcher32=True)
            else:
                a = item[()]
                g.create_dataset(name, data=a, chunks=a.shape, fletcher32=True)


def read_adapters(path):
    with h5py.File(path, "r") as f:
        return {n: torch.from_numpy(f["params"][n][()]) for n in f["params"]
                if isinstance(f["params"][n], h5py.Dataset) and ".lora_" in n}


# ---------------------------------------------------------------- models
def load_base(folder, case, eager):
    """The case's model in float32 with every projection NF4-dequantized; checks the NF4
    components against init.h5's."""
    model = glr.build_from(folder, case, eager=eager)
    nf4 = glr.replace_with_nf4(model, torch.float32, glr.family_of(case)[2])
    with h5py.File(os.path.join(folder, "init.h5"), "r") as f:
        groups = [n for n in f["params"] if isinstance(f["params"][n], h5py.Group)]
        assert sorted(groups) == sorted(nf4), "NF4 tensors differ from init.h5's"
        for n, t in nf4.items():
            g = f["params"][n]
            for comp in ("quantized_data", "quantized_scalers", "quantization_factor"):
                assert np.array_equal(g[comp][()], getattr(t, comp).numpy()), (n, comp)
    model.train()  # (TRL's metrics go to "train"; every dropout is 0)
    return model


def lora_config(case):
    from peft import LoraConfig
    return LoraConfig(r=glr.RANK, lora_alpha=glr.ALPHA, lora_dropout=0.0,
                      target_modules=list(glr.targets_of(case)))


def policy_params(peft_model):
    """kqlora name -> the policy's ("default") LoRA tensors."""
    out = {}
    for n, p in peft_model.named_parameters():
        if ".lora_" in n and ".default." in n:
            out[glr.kq_name(n)] = p
    return out


def set_adapters(peft_model, adapters):
    params = policy_params(peft_model)
    assert sorted(params) == sorted(adapters), "adapter names differ from the file's"
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(adapters[n])


def make_tokenizer(vocab):
    """A word-level tokenizer over the config's vocabulary (<pad> = 0, <s> = 1, </s> = 2):
    the trainers need one; the batches are built from ids, never from text."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast
    names = ["<pad>", "<s>", "</s>"] + ["t%d" % i for i in range(3, vocab)]
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(names)}, unk_token="t3"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="t3")


def common_args(tmp):
    return dict(output_dir=tmp, report_to="none", use_cpu=True, bf16=False, fp16=False,
                gradient_checkpointing=False, per_device_train_batch_size=P, seed=42,
                save_strategy="no", disable_dropout=True, dataset_num_proc=None)


def dummy_dataset():
    from datasets import Dataset
    return Dataset.from_list([{"prompt": "t5 t6", "chosen": " t7", "rejected": " t8"}])


# ---------------------------------------------------------------- TRL calls
class DpoRun:
    """DPOTrainer on the case; batch from DataCollatorForPreference."""

    def __init__(self, base, case, tok, examples, v, start, adapters, tmp):
        from peft import get_peft_model
        from trl import DPOConfig, DPOTrainer
        _, _, loss_type, beta, ls, _, _ = v
        args = DPOConfig(beta=beta, loss_type=loss_type, label_smoothing=ls, max_length=None,
                         precompute_ref_log_probs=False, padding_free=False,
                         **common_args(tmp))
        if start == "adapter":
            model = get_peft_model(base, lora_config(case))
            set_adapters(model, adapters)
            self.trainer = DPOTrainer(model=model, args=args, processing_class=tok,
                                      train_dataset=dummy_dataset())
            assert "ref" in self.trainer.model.peft_config, "TRL added no 'ref' adapter"
        else:
            self.trainer = DPOTrainer(model=base, args=args, processing_class=tok,
                                      train_dataset=dummy_dataset(),
                                      peft_config=lora_config(case))
            assert "ref" not in self.trainer.model.peft_config
            set_adapters(self.trainer.model, adapters)
        self.model = self.trainer.model
        assert self.trainer.ref_model is None and not self.trainer.precompute_ref_logps
        assert self.trainer.loss_types == [loss_type] and self.trainer.ld_alpha is None
        assert self.trainer.f_divergence_type == "reverse_kl" and not self.trainer.use_weighting
        feats = [dict(prompt_ids=e["prompt"], chosen_ids=e["chosen"], rejected_ids=e["rejected"])
                 for e in examples]
        self.batch = self.trainer.data_collator(feats)
        self.captured = []
        self.model.register_forward_hook(lambda m, i, o: self.captured.append(o))

    def loss_metrics(self):
        tr = self.trainer
        tr._metrics["train"].clear()
        tr._total_train_tokens = 0
        self.captured.clear()
        loss = tr.compute_loss(self.model, dict(self.batch))
        metrics = {k: float(v[-1]) for k, v in tr._metrics["train"].items()}
        return loss, metrics

    def trl_logps(self):
        """TRL's per-sequence sums of the last loss_metrics call: policy, reference
        ([2P] each, TRL's order: chosen rows then rejected rows)."""
        assert len(self.captured) == 2, len(self.captured)
        return [o.log_probs.detach().double().sum(1) for o in self.captured]

    def float64_logps(self):
        """The same sums from a float64 log-softmax of the model's logits (its ordinary
        forward), the reference through the same adapter switch TRL uses."""
        from trl.trainer.utils import use_adapter
        b = self.batch
        labels = b["input_ids"].masked_fill(b["completion_mask"] == 0, -100)
        out = []
        ref = "ref" if "ref" in self.model.peft_config else None
        for ctx in (contextlib.nullcontext(), use_adapter(self.model, ref)):
            with torch.no_grad(), ctx:
                logits = self.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                    use_cache=False).logits
            out.append(seq_logps(logits, labels, average=False))
        self.captured.clear()
        return out

    def counts(self):
        c = self.batch["completion_mask"].sum(1).double()
        return c[:P], c[P:]


class PairRun:
    """CPOTrainer (SimPO) or ORPOTrainer; batch from DPODataCollatorWithPadding over
    tokenize_row's fields."""

    def __init__(self, base, case, tok, examples, v, adapters, tmp):
        from peft import get_peft_model
        from trl.experimental.cpo import CPOConfig, CPOTrainer
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer
        _, objective, loss_type, beta, ls, gamma, _ = v
        model = get_peft_model(base, lora_config(case))
        set_adapters(model, adapters)
        if objective == "simpo":
            args = CPOConfig(loss_type="simpo", beta=beta, simpo_gamma=gamma, label_smoothing=ls,
                             cpo_alpha=0.0, max_length=64,
                             remove_unused_columns=False, **common_args(tmp))
            self.trainer = CPOTrainer(model=model, args=args, processing_class=tok,
                                      train_dataset=dummy_dataset())
            assert self.trainer.alpha == 0.0 and self.trainer.cpo_alpha == 0.0
            assert self.trainer.loss_type == "simpo"
            pad = self.trainer.pad_token_id
        else:
            args = ORPOConfig(beta=beta, max_length=64,
                              remove_unused_columns=False, **common_args(tmp))
            self.trainer = ORPOTrainer(model=model, args=args, processing_class=tok,
                                       train_dataset=dummy_dataset())
            pad = self.trainer.padding_value
        assert pad == 0 and not self.trainer.is_encoder_decoder
        assert not self.trainer.aux_loss_enabled
        self.model = self.trainer.model
        self.objective = objective
        feats = []
        for e in examples:  # tokenize_row's fields (decoder-only)
            f = dict(prompt_input_ids=e["prompt"], prompt_attention_mask=[1] * len(e["prompt"]))
            for side in ("chosen", "rejected"):
                seq = e["prompt"] + e[side]
                f[side + "_input_ids"] = seq
                f[side + "_attention_mask"] = [1] * len(seq)
                f[side + "_labels"] = [-100] * len(e["prompt"]) + e[side]
            feats.append(f)
        self.batch = self.trainer.data_collator(feats)

    def loss_metrics(self):
        return self.trainer.get_batch_loss_metrics(self.model, self.batch, train_eval="train")

    def concatenated(self):
        return self.trainer.concatenated_inputs(self.batch, padding_value=0)

    def trl_logps(self):
        with torch.no_grad():
            out = self.trainer.concatenated_forward(self.model, self.batch)
        return [torch.cat([out[0], out[1]]).double()]

    def float64_logps(self):
        cb = self.concatenated()
        with torch.no_grad():
            logits = self.model(input_ids=cb["concatenated_input_ids"],
                                attention_mask=cb["concatenated_attention_mask"],
                                use_cache=False).logits
        return [seq_logps(logits, cb["concatenated_labels"], average=True)]

    def counts(self):
        c = (self.concatenated()["concatenated_labels"][:, 1:] != -100).sum(1).double()
        return c[:P], c[P:]

    def orpo_nll64(self):
        """ORPO's NLL as TRL builds it (every attended token of the chosen rows, the
        prompt's included), from a float64 log-softmax."""
        cb = self.concatenated()
        with torch.no_grad():
            logits = self.model(input_ids=cb["concatenated_input_ids"],
                                attention_mask=cb["concatenated_attention_mask"],
                                use_cache=False).logits
        lab = cb["concatenated_input_ids"].masked_fill(cb["concatenated_attention_mask"] == 0, -100)
        lp, mask = token_logps(logits[:P], lab[:P])
        return float(-(lp * mask).sum() / mask.sum()), int(mask.sum())


def token_logps(logits, labels):
    lp = torch.log_softmax(logits.double()[:, :-1], -1)
    lab = labels[:, 1:]
    mask = lab != -100
    g = lp.gather(-1, lab.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return g * mask, mask


def seq_logps(logits, labels, average):
    lp, mask = token_logps(logits, labels)
    s = lp.sum(1)
    return s / mask.sum(1) if average else s


# ---------------------------------------------------------------- formulas
def log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def formula(v, c, r, nc, nr, c0=None, r0=None, nll=None):
    """The objective's loss from float64 per-sequence log-probabilities (sums for DPO,
    averages for SimPO / ORPO), as preference_loss.hpp writes it (ORPO's NLL given)."""
    _, objective, lt, b, e, gamma, _ = v
    if objective == "dpo":
        lc, lr = c - c0, r - r0
        d = lc - lr
        if lt == "sigmoid":
            per = -log_sigmoid(b * d)
        elif lt == "hinge":
            per = np.maximum(0.0, 1 - b * d)
        elif lt == "ipo":
            per = (lc / nc - lr / nr - 1 / (2 * b)) ** 2
        else:
            per = (-(1 - e) * log_sigmoid(b * d) + e * log_sigmoid(-b * d)) / (1 - 2 * e)
        return per.mean()
    if objective == "simpo":
        u = c - r - gamma / b
        return (-(1 - e) * log_sigmoid(b * u) - e * log_sigmoid(-b * u)).mean()
    lo = (c - r) - (np.log(-np.expm1(c)) - np.log(-np.expm1(r)))
    return (-b * log_sigmoid(lo)).mean() + nll


# ---------------------------------------------------------------- one file
def run_variant(run, v, start):
    """One-batch loss, metrics, gradients, TRL-vs-float64 checks, then the 5 steps."""
    params = policy_params(run.model)
    others = {n: p.detach().clone() for n, p in run.model.named_parameters()
              if ".lora_" in n and ".default." not in n}
    opt = torch.optim.AdamW(list(params.values()), lr=LR, eps=EPS, weight_decay=WEIGHT_DECAY)
    losses, steps_metrics = [], []
    for step in range(STEPS):
        run.model.zero_grad(set_to_none=True)
        loss, metrics = run.loss_metrics()
        if v[2] == "hinge" and step > 0:  # no pair within 1e-4 of relu's kink
            pol, ref = (o.log_probs.detach().double().sum(1) for o in run.captured[:2])
            d = (pol[:P] - ref[:P]) - (pol[P:] - ref[P:])
            run.kink = min(getattr(run, "kink", 1.0), (1 - v[3] * d).abs().min().item())
            assert run.kink > 1e-4, run.kink
        check(run, v, loss, metrics)  # (every step: DPO's log-ratios are 0 at the first)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().double().clone() for n, p in params.items()}
            for n, g in grads.items():
                assert torch.isfinite(g).all(), n
        losses.append(loss.item())
        steps_metrics.append(metrics)
        opt.step()
    for n, p in run.model.named_parameters():  # the "ref" adapter stayed as it was
        if n in others:
            assert torch.equal(p.detach(), others[n]), n
    final = {n: p.detach().clone() for n, p in params.items()}
    return losses, steps_metrics, grads, final


def check(run, v, loss, metrics):
    objective = v[1]
    trl = run.trl_logps()
    f64 = run.float64_logps()
    for a, b in zip(trl, f64):
        err = (a - b).abs().max().item()
        assert err < 1e-5, "TRL's log-probabilities differ from float64's by %g" % err
    pol = f64[0].numpy()
    c, r = pol[:P], pol[P:]
    nc, nr = (x.numpy() for x in run.counts())
    kw = {}
    if objective == "dpo":
        ref = f64[1].numpy()
        kw = dict(c0=ref[:P], r0=ref[P:])
        for k, x in (("rewards/chosen", v[3] * (c - ref[:P])),
                     ("rewards/rejected", v[3] * (r - ref[P:]))):
            assert abs(metrics[k] - x.mean()) < 1e-6, (k, metrics[k], x.mean())
    elif objective == "orpo":
        kw = dict(nll=run.orpo_nll64()[0])
        assert abs(metrics["nll_loss"] - kw["nll"]) < 1e-5
        # preference_loss.hpp's NLL: the chosen completions' tokens only
        if not hasattr(run, "nll_completions"):  # (the first step's)
            run.nll_completions = -(c * nc).sum() / nc.sum()
    assert abs(metrics["logps/chosen"] - c.mean()) < 1e-5, (metrics["logps/chosen"], c.mean())
    assert abs(metrics["logps/rejected"] - r.mean()) < 1e-5
    want = formula(v, c, r, nc, nr, **kw)
    got = loss.item()
    assert abs(got - want) < 1e-5 * max(1.0, abs(want)), (v[0], got, want)
    err = max((a - b).abs().max().item() for a, b in zip(trl, f64))
    run.checked = dict(err=max(err, getattr(run, "checked", {}).get("err", 0.0)))


def write_result(path, v, start, loss, metrics, grads, losses, steps_metrics, final):
    name, objective, lt, beta, ls, gamma, _ = v

    def ds(f, key, arr):
        arr = np.ascontiguousarray(arr)
        # (float64 holding float32 values: shuffle + gzip leave about the float32's size)
        f.create_dataset(key, data=arr, chunks=arr.shape, shuffle=True, compression="gzip",
                         compression_opts=9, fletcher32=True)

    with h5py.File(path, "w", libver=LIBVER) as f:
        f.create_dataset("loss", data=np.array([loss], np.float64))
        f.create_dataset("losses", data=np.array(losses, np.float64))
        for k, val in sorted(metrics.items()):
            f.create_dataset("metrics/" + k, data=np.array([val], np.float64))
        for k in sorted(metrics):
            f.create_dataset("step_metrics/" + k,
                             data=np.array([m[k] for m in steps_metrics], np.float64))
        for n in sorted(grads):
            ds(f, "grads/" + n, grads[n].numpy())
        for n in sorted(final):
            ds(f, "final/" + n, final[n].numpy().astype(np.float32))
        f.attrs["objective"] = objective
        f.attrs["loss_type"] = lt
        f.attrs["beta"] = np.float64(beta)
        f.attrs["label_smoothing"] = np.float64(ls)
        f.attrs["simpo_gamma"] = np.float64(gamma)
        f.attrs["start"] = start
        f.attrs["lr"] = np.float64(LR)
        f.attrs["eps"] = np.float64(EPS)
        f.attrs["weight_decay"] = np.float64(WEIGHT_DECAY)
        f.attrs["steps"] = np.int64(STEPS)
        f.attrs["pairs"] = np.int64(P)
        f.attrs["trl_version"] = TRL_VERSION


def generate(case_name, out_root, table):
    folder_rel, case, eager, seed = CASES[case_name]
    folder = os.path.join(ROOT, folder_rel)
    vocab = case["arch"]["vocab_size"]
    out = os.path.join(out_root, case_name)
    os.makedirs(out, exist_ok=True)
    ids, labels, prompt_len, examples = make_pairs(vocab, seed)
    write_pairs(os.path.join(out, "pairs.h5"), ids, labels, prompt_len, vocab)
    write_init_fresh(os.path.join(folder, "init.h5"), os.path.join(out, "init_fresh.h5"))
    starts = {"adapter": read_adapters(os.path.join(folder, "init.h5")),
              "fresh": read_adapters(os.path.join(out, "init_fresh.h5"))}
    tok = make_tokenizer(vocab)
    for v in VARIANTS:
        for start in v[6]:
            tmp = tempfile.mkdtemp(prefix="kqlora_dpo_ref_")
            try:
                torch.manual_seed(0)
                with quiet():
                    base = load_base(folder, case, eager)
                    if v[1] == "dpo":
                        run = DpoRun(base, case, tok, examples, v, start, starts[start], tmp)
                    else:
                        run = PairRun(base, case, tok, examples, v, starts[start], tmp)
                check_batch(run, v, ids, labels)
                losses, steps_metrics, grads, final = run_variant(run, v, start)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            path = os.path.join(out, "%s_%s.h5" % (v[0], start))
            write_result(path, v, start, losses[0], steps_metrics[0], grads, losses,
                         steps_metrics, final)
            m = steps_metrics[0]
            m5 = steps_metrics[-1]
            line = ("%-7s %-19s loss %.8f  rewards %+.6f %+.6f  losses[4] %.8f  "
                    "rewards[4] %+.6f %+.6f  (TRL-f64 logps %.1e)" % (
                        case_name, "%s_%s" % (v[0], start), losses[0], m["rewards/chosen"],
                        m["rewards/rejected"], losses[-1], m5["rewards/chosen"],
                        m5["rewards/rejected"], run.checked["err"]))
            if v[1] == "orpo":
                line += ("  nll %.6f (completions only: %.6f) log_odds_ratio %.6f"
                         % (m["nll_loss"], run.nll_completions, m["log_odds_ratio"]))
            if v[2] == "hinge":
                line += "  min|1-b d| over steps 1-4 %.3g" % run.kink
            print(line, flush=True)
            table.append(line)


def check_batch(run, v, ids, labels):
    """The trainer's batch holds exactly pairs.h5's rows (TRL's order: the P chosen rows,
    then the P rejected rows) and scores exactly its labelled tokens."""
    order = [2 * i for i in range(P)] + [2 * i + 1 for i in range(P)]
    if v[1] == "dpo":
        b = run.batch
        got_ids = b["input_ids"].numpy()
        got_lab = b["input_ids"].masked_fill(b["completion_mask"] == 0, -100).numpy()
        att = b["attention_mask"].numpy()
    else:
        cb = run.concatenated()
        got_ids = cb["concatenated_input_ids"].numpy()
        got_lab = cb["concatenated_labels"].numpy()
        att = cb["concatenated_attention_mask"].numpy()
    w = got_ids.shape[1]
    assert w == T, w
    assert np.array_equal(got_ids, ids[order]) and np.array_equal(got_lab, labels[order])
    real = np.array([(r != 0).nonzero()[0].max() + 1 for r in ids[order]])
    assert np.array_equal(att.sum(1), real)


@contextlib.contextmanager
def quiet():
    """TRL's and transformers' construction chatter (warnings about defaults) off."""
    logging.disable(logging.WARNING)
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma list of %s (default: all)" % ",".join(CASES))
    ap.add_argument("--out", default=OUT,
                    help="write DIR/<case> (default: tests/data/preference_reference)")
    args = ap.parse_args(argv)
    import trl
    if trl.__version__ != TRL_VERSION:
        sys.exit("needs trl==%s (found %s)" % (TRL_VERSION, trl.__version__))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    for n in names:
        if n not in CASES:
            sys.exit("unknown case '%s' (%s)" % (n, ",".join(CASES)))
    table = []
    for n in names:
        generate(n, args.out, table)
    total = sum(os.path.getsize(os.path.join(d, x)) for d, _, fs in os.walk(args.out)
                for x in fs)
    print("\n%d files, %d bytes under %s" % (len(table) + 2 * len(names), total, args.out))


if __name__ == "__main__":
    main()
