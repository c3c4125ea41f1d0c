#!/usr/bin/env python3
"""A training run's metrics_file (kqlora-train's JSON lines, docs/TRAINING.md) as a PNG:
loss, eval_loss, learning rate, tokens/s and gradient norm against the step, a panel each;
for a preference objective (dpo, simpo, orpo) also rewards, rewards/accuracies and logps,
and for ORPO nll_loss and the log odds, train and eval.

    python3 tools/plot_metrics.py METRICS.jsonl [MORE.jsonl ...] -o run.png [--title T]

Several files draw on the same panels, each labelled by its file name (a run beside
another, e.g. packed and unpacked). tokens/s is each logged interval's: the tokens it
trained over its elapsed seconds (the first interval's includes the first step's set-up
of buffers). Skipped steps (a non-finite gradient) are marked on the loss panel. A panel
with nothing to draw says so. Needs matplotlib (pip install matplotlib); a bad line exits
2 naming the file and line.

A file with TRL's preference metrics (docs/TRAINING.md "Preference training") gets more
panels below those: "rewards" (rewards/chosen, rewards/rejected, rewards/margins),
"rewards/accuracies", "logps" (logps/chosen, logps/rejected) and, for ORPO, "ORPO
nll_loss" (nll_loss) and "ORPO log odds" (log_odds_ratio, log_odds_chosen); each training
series solid, its eval_ counterpart of the eval lines dashed in the same colour. A panel
is there when any file has any of its keys; a file without them draws as before.

No output destroys an input (tools/safe_output.py): an -o that is one of the metrics files
(links, hard links and ".." included), a directory, or in a missing directory is refused
up front (exit 2); the picture is written to a temporary name beside it and renamed, so a
failed write (exit 1) leaves an earlier picture whole. The metrics files are only read
(kqlora-train may still be appending to them).
"""
import argparse
import json
import math
import os

from safe_output import check_output_file, fail, file_output

PANELS = [("loss", "training loss"), ("eval_loss", "eval loss"), ("lr", "learning rate"),
          ("tokens_per_s", "tokens/s"), ("grad_norm", "gradient norm")]
# Preference objectives' panels (TRL's names): (the panel's label, its training keys); each
# key's eval counterpart is "eval_" + key on the eval lines.
PREFERENCE_PANELS = [
    ("rewards", ["rewards/chosen", "rewards/rejected", "rewards/margins"]),
    ("rewards/accuracies", ["rewards/accuracies"]),
    ("logps", ["logps/chosen", "logps/rejected"]),
    ("ORPO nll_loss", ["nll_loss"]),
    ("ORPO log odds", ["log_odds_ratio", "log_odds_chosen"]),
]
NUMERIC = (["loss", "eval_loss", "lr", "grad_norm", "elapsed_s", "tokens"] +
           [p + k for _, keys in PREFERENCE_PANELS for k in keys for p in ("", "eval_")])


def read_metrics(path):
    """Step records and eval records of one metrics file."""
    steps, evals = [], []
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        fail("%s: cannot read (%s)" % (path, e.strerror))
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            fail("%s:%d: not a JSON line (%s)" % (path, n, e))
        if not isinstance(rec, dict):
            fail("%s:%d: expected a JSON object" % (path, n))
        if "step" not in rec:  # the run's summary (memory, page faults): not plotted
            continue
        if not isinstance(rec["step"], int):
            fail("%s:%d: \"step\" is %r, expected an integer" % (path, n, rec["step"]))
        for key in NUMERIC:
            if key in rec and not isinstance(rec[key], (int, float)):
                fail("%s:%d: \"%s\" is %r, expected a number" % (path, n, key, rec[key]))
        if "eval_loss" in rec:
            evals.append(rec)
        elif "loss" in rec:
            steps.append(rec)
    if not steps and not evals:
        fail("%s: no step or eval records (is it a kqlora-train metrics_file?)" % path)
    return steps, evals


def tokens_per_s(steps):
    """(step, tokens/s) of each logged interval, from the cumulative tokens and seconds."""
    out, prev_t, prev_s = [], 0, 0.0
    for r in steps:
        if "tokens" not in r or "elapsed_s" not in r:
            continue
        dt = r["elapsed_s"] - prev_s
        if dt > 0:
            out.append((r["step"], (r["tokens"] - prev_t) / dt))
        prev_t, prev_s = r["tokens"], r["elapsed_s"]
    return out


def preference_panels(runs):
    """The PREFERENCE_PANELS that any of runs [(name, steps, evals)] has a key of."""
    return [(label, keys) for label, keys in PREFERENCE_PANELS
            if any(k in r for _, steps, _ in runs for r in steps for k in keys) or
            any("eval_" + k in r for _, _, evals in runs for r in evals for k in keys)]


def draw_preference_panel(ax, runs, label, keys):
    """One preference panel: per run and key, the training series solid and its eval
    counterpart dashed in the same colour. Whether anything was drawn."""
    drawn = False
    for name, steps, evals in runs:
        for key in keys:
            color = None
            for prefix, recs, style in (("", steps, "-"), ("eval_", evals, "--")):
                k = prefix + key
                pts = [(r["step"], r[k]) for r in recs if k in r and math.isfinite(r[k])]
                if not pts:
                    continue
                line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color,
                                marker="o" if len(pts) < 30 else None, markersize=3,
                                label=k if len(runs) == 1 else "%s: %s" % (name, k))
                color = line.get_color()
                drawn = True
    return drawn


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+", help="metrics_file(s) of kqlora-train")
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    ap.add_argument("--title", default=None, help="the figure's title")
    args = ap.parse_args(argv)
    check_output_file("-o", args.output, args.metrics)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("needs matplotlib (pip install matplotlib)")
    fmt = os.path.splitext(args.output)[1][1:].lower() or "png"
    if fmt not in plt.figure().canvas.get_supported_filetypes():
        fail("-o %s: matplotlib cannot write .%s files (png, pdf, svg, ...)" % (args.output, fmt))
    plt.close("all")
    runs = [(os.path.basename(p), *read_metrics(p)) for p in args.metrics]

    fig, extra = draw(plt, runs, args.title)
    with file_output(args.output) as tmp:
        fig.savefig(tmp, dpi=100, format=fmt)
    total = sum(len(s) + len(e) for _, s, e in runs)
    print("%s: %d records of %d file(s) drawn (loss, eval_loss, lr, tokens/s, grad_norm%s)"
          % (args.output, total, len(runs), "".join(", " + label for label, _ in extra)))


def draw(plt, runs, title=None):
    """The figure of runs [(name, steps, evals)], a panel each of PANELS and of the
    preference_panels; (the figure, those preference panels)."""
    extra = preference_panels(runs)
    n = len(PANELS) + len(extra)
    fig, axes = plt.subplots(n, 1, figsize=(8, 13 * n / len(PANELS)), sharex=True)
    for ax, (key, label) in zip(axes, PANELS):
        drawn = False
        for name, steps, evals in runs:
            if key == "eval_loss":
                pts = [(r["step"], r["eval_loss"]) for r in evals]
            elif key == "tokens_per_s":
                pts = tokens_per_s(steps)
            else:
                pts = [(r["step"], r[key]) for r in steps if key in r]
            pts = [(s, v) for s, v in pts if math.isfinite(v)]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if len(pts) < 30
                    else None, markersize=3, label=name)
            if key == "loss":
                skipped = [r["step"] for r in steps if r.get("skipped")]
                for s in skipped:
                    ax.axvline(s, color="red", alpha=0.3, linewidth=1)
            drawn = True
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if not drawn:
            ax.text(0.5, 0.5, "no %s in the file(s)" % label, transform=ax.transAxes,
                    ha="center", va="center", color="gray")
        elif len(runs) > 1:
            ax.legend(fontsize=8)
    for ax, (label, keys) in zip(axes[len(PANELS):], extra):
        drawn = draw_preference_panel(ax, runs, label, keys)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:  # its keys are there, but no finite value
            ax.text(0.5, 0.5, "no finite %s in the file(s)" % label, transform=ax.transAxes,
                    ha="center", va="center", color="gray")
    axes[-1].set_xlabel("step")
    fig.suptitle(title or ", ".join(r[0] for r in runs))
    fig.tight_layout()
    return fig, extra


if __name__ == "__main__":
    main()
