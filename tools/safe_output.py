"""No output may destroy an input: the rules every tools/ writer follows (issue 49;
docs/RELIABILITY.md, exit codes; the C++ apps follow the same rules).

    from safe_output import check_output_file, file_output, check_output_directory, \\
        directory_output

1. An output that is one of the run's inputs, lies inside an input directory, or (a
   directory output, or any output that is an existing directory) contains an input is
   refused before any work: exit 2, "TOOL: error: OPTION OUT is the input FILE" / "... is
   inside the input directory DIR" / "... contains the input FILE" (the C++ apps' words,
   core/output_guard). Paths are compared as written paths (the folders resolved, links
   and `..` included, the last part as written: a link as output is the link) and fully
   resolved (the link's target), and by inode (st_dev, st_ino of the output and its
   existing folders against each input and its folders), so symlinks, hard links, `..`
   and bind mounts do not get around it.
2. An existing directory where a file is expected (or a file where a directory is), a
   missing parent folder, or a place that cannot be written (tried by creating a file
   there) is refused up front, exit 2.
3. A file is written to a temporary name in the same directory (.NAME.tmp-PID-XXXX) and
   renamed over the output at the end (os.replace): a full disk, a failed writer or a kill
   leaves an earlier output at that path intact. A failed write exits 1 naming the output
   and removes the temporary file.
4. A directory output is written whole into a temporary directory beside it, then swapped
   in (renameat2 RENAME_EXCHANGE where Linux has it, else the old one renamed aside, the
   new one renamed in), and the old one removed. An existing output directory that is
   not empty and holds an entry that is not of the tool's kind (`own`: a set of names or a
   predicate) is refused, exit 2, naming that entry: it is not an earlier output of the
   tool, and swapping it out would destroy it. Entries of the old one the caller names
   (`keep`) and the writer did not write are carried into the new one.
5. Files read while they grow (kqlora-train's metrics_file) are inputs like any other:
   the tools only read them.
"""
import contextlib
import ctypes
import os
import shutil
import sys
import tempfile


def tool_name():
    """The running tool's name, as its messages start: tools/tokenize_sft.py -> tokenize_sft."""
    name = os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else "tool")
    return name[:-3] if name.endswith(".py") else name


def fail(msg, code=2):
    """Print "TOOL: error: msg" on stderr and exit with `code` (2: bad input, 1: I/O)."""
    print("%s: error: %s" % (tool_name(), msg), file=sys.stderr, flush=True)
    sys.exit(code)


def _absolute(path):
    """`path` joined to the working directory, not normalised (`link/..` is the link's
    target's parent, as the kernel reads it), without trailing separators."""
    a = os.path.join(os.getcwd(), os.fspath(path))
    return a.rstrip(os.sep) or os.sep


def written_path(path):
    """The path a write to `path` touches: its folders resolved, its last part as written
    (a link is the link, not its target)."""
    a = _absolute(path)
    head, tail = os.path.split(a)
    if tail in ("", ".", ".."):
        return os.path.realpath(a)
    return os.path.join(os.path.realpath(head), tail)


def _forms(path):
    """Both spellings compared: the written path and the fully resolved one."""
    return {written_path(path), os.path.realpath(_absolute(path))}


def _id(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _ancestor_ids(path):
    """(st_dev, st_ino) of every existing folder above `path`, in each of its forms."""
    ids = set()
    for form in _forms(path):
        d = os.path.dirname(form)
        while True:
            i = _id(d)
            if i is not None:
                ids.add(i)
            up = os.path.dirname(d)
            if up == d:
                break
            d = up
    return ids


def _below(path, folder):
    prefix = folder if folder.endswith(os.sep) else folder + os.sep
    return path != folder and path.startswith(prefix)


def refuse_output_over_inputs(option, out, inputs, out_is_dir=False):
    """Exit 2 when the output `out` (given as `option`) is one of `inputs` (files or
    directories), lies inside an input directory, or -- a directory output, or an output
    that is an existing directory -- contains an input."""
    if not out:
        fail("%s: an empty path" % option)
    out_forms, out_id = _forms(out), _id(out)
    out_up = _ancestor_ids(out)
    contains = out_is_dir or os.path.isdir(out)
    seen = [(inp, _forms(inp), _id(inp), os.path.isdir(inp)) for inp in inputs if inp is not None]
    for inp, in_forms, in_id, in_dir in seen:  # (the most precise message first)
        if out_forms & in_forms or (out_id is not None and out_id == in_id):
            fail("%s %s is the input %s %s: writing it would destroy an input"
                 % (option, out, "directory" if in_dir else "file", inp))
    for inp, in_forms, in_id, in_dir in seen:
        if in_dir and (any(_below(o, i) for o in out_forms for i in in_forms)
                       or (in_id is not None and in_id in out_up)):
            fail("%s %s is inside the input directory %s: writing it would change an input"
                 % (option, out, inp))
    for inp, in_forms, in_id, in_dir in seen:
        if contains and (any(_below(i, o) for o in out_forms for i in in_forms)
                         or (out_id is not None and out_id in _ancestor_ids(inp))):
            fail("%s %s contains the input %s: replacing it would destroy an input"
                 % (option, out, inp))


def _probe_writable(option, out, folder):
    """Create (and remove) a file in `folder`: the place can be written (as root too)."""
    try:
        fd, probe = tempfile.mkstemp(prefix="." + os.path.basename(written_path(out))
                                     + ".probe-", dir=folder)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        fail("%s %s: cannot write in %s (%s)" % (option, out, folder, e.strerror or e))


def check_output_file(option, out, inputs=()):
    """Rules 1 and 2 for a file output, before any work: not an input nor inside an input
    directory; not an existing directory; its directory exists and can be written."""
    refuse_output_over_inputs(option, out, inputs)
    if os.path.isdir(out):
        fail("%s %s is an existing directory; a file is expected" % (option, out))
    folder = os.path.dirname(written_path(out))
    if not os.path.exists(folder):
        fail("%s %s: its folder %s does not exist" % (option, out, folder))
    if not os.path.isdir(folder):
        fail("%s %s: %s is not a directory" % (option, out, folder))
    _probe_writable(option, out, folder)


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temporary_file(out):
    folder, name = os.path.split(written_path(out))
    fd, tmp = tempfile.mkstemp(prefix=".%s.tmp-%d-" % (name, os.getpid()), dir=folder)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # (mkstemp's 0600: the mode a plain open would give)
    return tmp


@contextlib.contextmanager
def file_output(out, mode=None):
    """Rule 3: yields a temporary path beside `out` (mode None: for writers that take a path,
    h5py, savefig, save_file) or that file opened in `mode` ("w", "wb"); renamed over `out`
    when the block ends. Any failure of the block or the rename removes the temporary and
    exits 1 naming `out`; SystemExit and KeyboardInterrupt remove it and go on."""
    try:
        tmp = _temporary_file(out)
    except OSError as e:
        fail("writing %s failed: %s" % (out, e.strerror or e), 1)
    try:
        if mode is None:
            yield tmp
        else:
            with open(tmp, mode) as f:
                yield f
        os.replace(tmp, written_path(out))
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if not isinstance(e, Exception):
            raise
        fail("writing %s failed: %s" % (out, getattr(e, "strerror", None) or
                                        "%s: %s" % (type(e).__name__, e)), 1)


def _owns(own, name):
    return own(name) if callable(own) else name in own


def check_output_directory(option, out, inputs=(), own=()):
    """Rules 1, 2 and 4 for a directory output, before any work: it holds no input and is
    in none; an existing `out` is a directory whose every entry is of the tool's kind
    (`own`: names or a predicate), else exit 2 naming the first foreign entry; its parent
    can be written (created when missing)."""
    refuse_output_over_inputs(option, out, inputs, out_is_dir=True)
    if os.path.lexists(out) and not os.path.isdir(out):
        fail("%s %s is not a directory; a directory is expected" % (option, out))
    if os.path.isdir(out):
        try:
            entries = sorted(os.listdir(out))
        except OSError as e:
            fail("%s %s: cannot list it (%s)" % (option, out, e.strerror or e))
        foreign = [e for e in entries if not _owns(own, e)]
        if foreign:
            fail("%s %s is a directory that is not an earlier output of %s (it holds %s): "
                 "name a new or empty directory" % (option, out, tool_name(), foreign[0]))
    parent = os.path.dirname(written_path(out))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        fail("%s %s: cannot create %s (%s)" % (option, out, parent, e.strerror or e))
    if not os.path.isdir(parent):
        fail("%s %s: %s is not a directory" % (option, out, parent))
    _probe_writable(option, out, parent)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a, b):
    """Swap the names a and b in one step (renameat2 RENAME_EXCHANGE); False where the
    C library or the file system lacks it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not here; rename aside instead
        return False
    raise OSError(err, os.strerror(err), b)


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def _swap_in(new, out):
    """`new` (a complete directory) takes the name `out`; the old `out`, if any, is
    removed afterwards. Returns the old one's leftover path when it could not be removed."""
    target = written_path(out)
    if not os.path.lexists(target):
        os.rename(new, target)
        return None
    if _exchange(new, target):
        old = new
    else:
        old = tempfile.mkdtemp(prefix=".%s.old-%d-" % (os.path.basename(target), os.getpid()),
                               dir=os.path.dirname(target))
        os.rmdir(old)  # (a free name beside it)
        os.rename(target, old)
        try:
            os.rename(new, target)
        except OSError:
            os.rename(old, target)  # the old one back
            raise
    try:
        _remove(old)
    except OSError:
        return old
    return None


def _carry(old, new, keep):
    """Entries of the old directory that `keep` names and the new one lacks, hard-linked
    (copied across file systems) into the new one, after the writer is done with it."""
    if not keep or not os.path.isdir(old):
        return
    for name in sorted(os.listdir(old)):
        src, dst = os.path.join(old, name), os.path.join(new, name)
        if not _owns(keep, name) or os.path.lexists(dst):
            continue
        if os.path.isdir(src) and not os.path.islink(src):
            shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(src, dst)


def _link_or_copy(src, dst):
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@contextlib.contextmanager
def directory_output(out, keep=None):
    """Rule 4: yields a new temporary directory beside `out` to write the whole output in;
    when the block ends, the entries of the old `out` that `keep` names (names or a
    predicate) and the writer did not write are carried over, and the new directory is
    swapped in. A failure removes the temporary directory and exits 1 naming `out`;
    SystemExit and KeyboardInterrupt remove it and go on. Call check_output_directory
    first."""
    target = written_path(out)
    try:
        tmp = tempfile.mkdtemp(prefix=".%s.tmp-%d-" % (os.path.basename(target), os.getpid()),
                               dir=os.path.dirname(target))
        os.chmod(tmp, 0o777 & ~_umask())
    except OSError as e:
        fail("writing %s failed: %s" % (out, e.strerror or e), 1)
    try:
        yield tmp
        _carry(target, tmp, keep)
        left = _swap_in(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, Exception):
            raise
        fail("writing %s failed: %s" % (out, getattr(e, "strerror", None) or
                                        "%s: %s" % (type(e).__name__, e)), 1)
    if left:
        print("%s: warning: %s is written; its previous contents, renamed to %s, could not "
              "be removed" % (tool_name(), out, left), file=sys.stderr)
