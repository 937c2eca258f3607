"""What the command lines promise about their outputs: every output path is checked before
anything is read or solved, and a write that still fails after a solve keeps the solution.

- :func:`check` runs first: each output's folder exists and takes a new file (tried for real,
  :func:`solvers.io.atomic.check_writable`), so ``--out /nonexistent/dir/x`` is an ``error:`` line in
  a fraction of a second, not a traceback after the solve.
- :func:`write_or_keep` writes an output after the solve. If it fails (a disk that filled up
  meanwhile, a folder removed), the solution is written to a fallback in the working directory
  (else the temporary directory) and the ``error:`` line names both paths. With ``--checkpoint``
  the checkpoint already holds the best state, and the line says so too.
"""
from __future__ import annotations

import os
import sys
import tempfile
from typing import Callable, Iterable, Optional, Tuple

from .atomic import check_writable


def check(outputs: Iterable[Tuple[str, Optional[str], bool]]) -> Optional[str]:
    """``outputs``: (option, path or None, is_folder) triples. The first problem as an ``error:``
    message, or None when every given path can be written. A folder output is written beside
    itself and swapped in (:func:`solvers.io.atomic.replacing_folder`), so its parent must take new
    entries; a file output must not name a folder, nor a folder output a file."""
    for option, path, is_folder in outputs:
        if not path:
            continue
        if is_folder and os.path.exists(path) and not os.path.isdir(path):
            return f"{option} {path!r} is a file; give a folder"
        if not is_folder and os.path.isdir(path):
            return f"{option} {path!r} is a folder; give a file name"
        try:
            check_writable(path, option)
        except OSError as exc:
            return f"{exc.strerror or exc}"
    return None


def write_or_keep(write: Callable[[str], None], path: str, option: str,
                  checkpoint: Optional[str] = None) -> Optional[str]:
    """``write(path)``; on an OSError (or a ValueError: a value the format cannot hold), ``write``
    to a fallback path and return the ``error:`` message naming both (None when ``path`` was
    written), so the command line ends with an ``error:`` line and never a traceback after a
    solve."""
    try:
        write(path)
        return None
    except OSError as exc:
        failed = f"{option}: cannot write {path!r} ({exc.strerror or exc})"
    except ValueError as exc:       # what the format cannot hold: the fallback is tried all the same
        failed = f"{option}: cannot write {path!r} ({exc})"
    # kept-PID-NAME: the output's own name (so its format, .bz2 or .ply, is kept), never an
    # existing file of the user's.
    fallback_name = f"kept-{os.getpid()}-{os.path.basename(os.path.normpath(path))}"
    kept = []
    for folder in (os.getcwd(), tempfile.gettempdir()):
        target = os.path.join(folder, fallback_name)
        try:
            write(target)
        except (OSError, ValueError):
            continue
        kept.append(f"the solution is kept in {target!r}")
        break
    if checkpoint:
        kept.append(f"the best state is in the checkpoint {checkpoint!r}")
    if not kept:
        kept.append("no fallback could be written either (working and temporary folders)")
    return failed + "; " + "; ".join(kept)


def report(message: Optional[str]) -> bool:
    """Print ``error: message`` to stderr when there is one; True if there was."""
    if message:
        print(f"error: {message}", file=sys.stderr)
    return bool(message)
