"""Runs a tools/ script's main(argv) inside the test's own Python, as a process would run it.

The reference tests call tools/make_hf_model.py and tools/tokenize_sft.py many times; a new
Python pays 5-11 s importing torch and transformers on a slow CPU, which made those tests
the longest of the suite. Run here, the imports are paid once. What a process would show
is kept: the exit status (sys.exit's code; 1 for a message or an uncaught exception, with
its traceback; 0 when main returns) and what it printed on stdout and stderr, together.
"""
import contextlib
import importlib.util
import io
import os
import sys
import traceback

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools")
if TOOLS not in sys.path:  # (as for a script in tools/: `from safe_output import ...`)
    sys.path.insert(0, TOOLS)
_loaded = {}


def _tool(name):
    if name not in _loaded:
        spec = importlib.util.spec_from_file_location("kqlora_tool_" + name,
                                                      os.path.join(TOOLS, name + ".py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[name] = module
    return _loaded[name]


def run_tool(name, argv):
    """(exit status, stdout and stderr) of tools/<name>.py with the arguments argv."""
    main = _tool(name).main
    out = io.StringIO()
    saved_argv = sys.argv
    sys.argv = [os.path.join(TOOLS, name + ".py")] + list(argv)  # argparse's prog name
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                main(argv)
                status = 0  # the tools end with main(), so a return value is not an exit status
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    status = e.code or 0
                else:  # sys.exit("message"): printed on stderr, exit 1
                    print(e.code, file=sys.stderr)
                    status = 1
            except Exception:  # an uncaught exception: the traceback on stderr, exit 1
                traceback.print_exc()
                status = 1
    finally:
        sys.argv = saved_argv
    return status, out.getvalue()


def make_hf_model(*argv):
    """tools/make_hf_model.py with these arguments; a failure ends the test with its output."""
    status, log = run_tool("make_hf_model", list(argv))
    if status != 0:
        raise SystemExit("make_hf_model.py failed (%d): %s\n%s" % (status, " ".join(argv), log))
