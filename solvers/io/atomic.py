"""Outputs that are either the old whole or the new whole: every writer of the solvers (BAL files,
PLY, checkpoints, COLMAP model folders) goes through here.

- :func:`replacing` writes a file under a temporary name beside the target, flushes and fsyncs it,
  then renames it over the target (``os.replace``: atomic within one file system, which is why the
  temporary lives in the target's own folder and not in ``/tmp``).
- :func:`replacing_folder` does the same for a folder: the new folder is filled beside the target,
  then the two are exchanged in one step (``renameat2(RENAME_EXCHANGE)`` on Linux; elsewhere two
  renames, with the old folder kept under a recognisable name until the new one is in place).

Temporary names are ``.NAME.PID.RANDOM.pyclad-tmp`` (and ``.pyclad-old`` for a replaced folder on
its way out). A writer killed before its rename leaves one behind; the next writer to the same
target removes those whose process is gone (:func:`clean_stale`), never a live writer's.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
import stat
from typing import Iterator

TMP = ".pyclad-tmp"
OLD = ".pyclad-old"


def temp_name(path, suffix: str = TMP) -> str:
    """A hidden name beside ``path`` that says which process made it."""
    folder, base = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(folder, f".{base}.{os.getpid()}.{secrets.token_hex(4)}{suffix}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:             # PermissionError: another user's live process
        return True
    return True


def clean_stale(path) -> list:
    """Remove what killed writers of ``path`` left beside it (their process is gone); return the
    names removed. A temporary of a live process (a concurrent writer) is left alone."""
    folder, base = os.path.split(os.path.abspath(os.fspath(path)))
    prefix = f".{base}."
    removed = []
    try:
        names = os.listdir(folder or ".")
    except OSError:
        return removed
    for name in names:
        if not name.startswith(prefix) or not (name.endswith(TMP) or name.endswith(OLD)):
            continue
        parts = name[len(prefix):].split(".")
        if len(parts) < 3 or not parts[0].isdigit() or _alive(int(parts[0])):
            continue
        full = os.path.join(folder, name)
        try:
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
            removed.append(full)
        except OSError:
            pass        # someone else's to clean; it never stands for the target
    return removed


def _fsync_folder(folder: str) -> None:
    """Make a rename in ``folder`` durable where the platform allows it."""
    try:
        fd = os.open(folder or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_writable(path, what: str = "output") -> None:
    """Raise ``OSError`` naming ``what`` unless ``path`` could be written now: its folder exists,
    is a folder, and takes a new file (tried with a real temporary file, since permissions alone
    do not tell about read-only mounts, quotas or /proc). An existing ``path`` that is a folder
    is refused for a file output."""
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, f"{what}: the folder {folder!r} does not exist", path)
    probe = temp_name(path)
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise type(exc)(exc.errno, f"{what}: cannot write in {folder!r} ({exc.strerror})", path) from None
    os.close(fd)
    os.unlink(probe)


@contextlib.contextmanager
def replacing(path, mode: str = "wb") -> Iterator:
    """``with replacing(path) as f: ...`` writes ``f`` and puts it in place of ``path`` only when
    the block ends without an exception; otherwise ``path`` is untouched and the temporary removed.
    A new file gets the permissions a plain ``open`` would give it (umask), not mkstemp's 0600."""
    path = os.fspath(path)
    clean_stale(path)
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(os.path.dirname(os.path.abspath(path)))


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one step (Linux renameat2); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False            # an old kernel or a file system without it
    raise OSError(err, f"cannot exchange {a!r} and {b!r}: {os.strerror(err)}")


@contextlib.contextmanager
def replacing_folder(path) -> Iterator[str]:
    """``with replacing_folder(path) as tmp: ...`` fills the new folder ``tmp`` (made empty, beside
    ``path``); when the block ends without an exception, ``tmp`` takes ``path``'s place in one
    step and the old folder is removed. On an exception ``path`` is untouched and ``tmp`` removed.
    The caller decides what of the old folder the new one keeps (it is still at ``path`` inside
    the block)."""
    path = os.path.abspath(os.fspath(path))
    if os.path.lexists(path) and not os.path.isdir(path):
        raise NotADirectoryError(errno.ENOTDIR, "not a folder; a model is written into a folder", path)
    clean_stale(path)
    tmp = temp_name(path)
    os.mkdir(tmp)
    try:
        yield tmp
        for root, _, files in os.walk(tmp):          # the files durable before they count
            for name in files:
                full = os.path.join(root, name)
                if not stat.S_ISREG(os.lstat(full).st_mode):
                    continue        # a symlink (maybe dangling) or a FIFO: nothing of ours to sync
                fd = os.open(full, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        if not os.path.lexists(path):
            os.rename(tmp, path)
        elif _exchange(tmp, path):
            shutil.rmtree(tmp, ignore_errors=True)   # tmp now holds the old folder
        else:
            old = temp_name(path, OLD)
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_folder(os.path.dirname(path))
