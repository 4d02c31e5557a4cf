"""Atomic output: write under a temporary name in the same folder, rename when complete.

A run that stops half-way (an error, Ctrl-C, a full disk) then leaves either the old file or the new
one, never a truncated file that a later step would take for finished output. Pure Python (imports
neither fairseq nor torch).

    with atomic_write("result.json") as f:          # a text (or, mode="wb", binary) file object
        json.dump(result, f)
    with atomic_path("loss.png") as tmp:            # for tools that write the file themselves
        fig.savefig(tmp)
    with atomic_path("train.hints", suffixes=(".bin", ".idx")) as tmp:   # a .bin/.idx pair
        write_pair(tmp)
"""

import os
import shutil
from contextlib import contextmanager

__all__ = ["atomic_write", "atomic_path"]


def _temporary_name(path, keep_extension=True):
    """``folder/name.tmp-PID.ext``: same folder (so the rename is atomic), same extension (so tools
    that pick a format by extension, like matplotlib's savefig, still do)."""
    stem, ext = os.path.splitext(path) if keep_extension else (path, "")
    return f"{stem}.tmp-{os.getpid()}{ext}"


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _replace(tmp, path):
    """os.replace, also onto an existing folder (moved aside first, removed once the new one is in place)."""
    if not (os.path.isdir(tmp) and os.path.isdir(path)):
        os.replace(tmp, path)
        return
    old = _temporary_name(path) + ".old"
    os.replace(path, old)
    try:
        os.replace(tmp, path)
    except OSError:
        os.replace(old, path)
        raise
    shutil.rmtree(old)


@contextmanager
def atomic_path(path, suffixes=("",)):
    """Yield a temporary path beside ``path``; when the block succeeds, rename ``tmp + s`` to
    ``path + s`` for every suffix (a file, or a folder such as fairseq-preprocess's --destdir).

    Several suffixes make one output of several files (fairseq's ``.bin``/``.idx`` pairs): the old
    files are removed first, so an old index never stands beside a new ``.bin``. On an error every
    temporary is removed and the old output is left as it was."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = _temporary_name(path, keep_extension=tuple(suffixes) == ("",))  # else the suffixes are the extensions
    for s in suffixes:
        _remove(tmp + s)  # a leftover of an earlier run of this process id
    try:
        yield tmp
        missing = [tmp + s for s in suffixes if not os.path.lexists(tmp + s)]
        if missing:
            raise FileNotFoundError(f"{path}: the temporary {missing[0]} was not written; nothing was replaced")
        if len(suffixes) > 1:
            for s in suffixes:
                _remove(path + s)
        for s in suffixes:
            _replace(tmp + s, path + s)
    finally:
        for s in suffixes:
            _remove(tmp + s)


@contextmanager
def atomic_write(path, mode="w", encoding="utf-8", newline="\n"):
    """``open(path, mode)`` under a temporary name, renamed to ``path`` when the block succeeds
    (text: UTF-8 with ``\\n`` line ends by default, so outputs are the same bytes on every system)."""
    if not mode.startswith("w"):
        raise ValueError(f"atomic_write({path!r}): mode {mode!r} does not write a new file (use 'w' or 'wb')")
    kwargs = {} if "b" in mode else {"encoding": encoding, "newline": newline}
    with atomic_path(path) as tmp:
        with open(tmp, mode, **kwargs) as f:
            yield f
