"""Program binaries on disk, so that a warm process builds nothing from source.

Where: ``$PYCLAD_CACHE_DIR``, else the user cache directory's ``pyclad/`` (``~/.cache/pyclad`` on
Linux). Two kinds of entries, each one file:

- ``programs/<key>.bin``: a program binary as the driver returns it (``CL_PROGRAM_BINARIES``),
  keyed by the sha256 of the source, the build options and the device's identity (platform name,
  vendor and version; device name, vendor and version; driver version). The file holds a header
  (the key, that identity, the binary's length and sha256, the kernels' names) and the binary.
  A load checks all of it: a truncated, corrupt or foreign entry (another device, another driver)
  is never handed to the driver; it is rebuilt from source and replaced, with a warning.
- ``renders/<key>``: which source (its sha256) a template rendered to with given parameters, keyed
  by the template's name, the parameters and a fingerprint of the packages' code (every ``.py`` and
  ``.cl.mako`` file of clkernels, pyclad and solvers, read once per process). With it, a warm
  process neither imports Mako nor renders: it goes from the parameters to the binary directly.
  Any change to the code changes the fingerprint, so an entry never outlives the code that made it.
- ``tuning/<key>``: a launch shape chosen by measuring (:mod:`clkernels.autotune`), keyed like a
  render (the code's fingerprint) and by the device's identity, the op and the call's shapes. A
  JSON record: the choice, every candidate's time, the identity; one that does not parse or is for
  another device is ignored, with a warning, and measured again where tuning is on.

Writers write a temporary file in the same folder and rename it over the entry: readers see the
old whole file or the new whole file, never a part, so MPI ranks, test workers and two users'
processes can fill one cache at once. A cache that cannot be written (a read-only folder, a full
disk) costs a warning, once per process, and programs are then built in memory as before.

The Oclgrind simulator is left out (:func:`clkernels.simulator.binary_cache_ok`).

``python -m clkernels cache`` lists the entries; ``--clear`` empties the cache. Every source build
is counted (:func:`stats`) and, where ``PYCLAD_BUILD_LOG`` names a file, appended to it as one line
(``source <key> <seconds> <name>``), so a test can see what another process built.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
import time
import warnings
from typing import Dict, List, Optional

__all__ = ["cache_dir", "device_identity", "program_key", "load_binary", "store_binary", "writable", "has_binary",
           "render_key", "load_render", "store_render", "code_seen", "tuning_key", "load_tuning", "store_tuning", "tunings",
           "stats", "made", "entries", "clear", "CacheWarning"]

ENV = "PYCLAD_CACHE_DIR"
BUILD_LOG_ENV = "PYCLAD_BUILD_LOG"
MAGIC = b"PYCLADBIN1\n"
_HEADER = struct.Struct("<I")          # length of the JSON header that follows the magic
_PACKAGES = ("clkernels", "pyclad", "solvers")


class CacheWarning(UserWarning):
    """The binary cache could not be read or written; the program was built from source."""


_lock = threading.Lock()
_stats = {"source_builds": 0, "binary_loads": 0, "rejected": 0, "write_failures": 0}
_warned: set = set()


def _warn_once(kind: str, message: str) -> None:
    with _lock:
        if kind in _warned:
            return
        _warned.add(kind)
    warnings.warn(message, CacheWarning, stacklevel=3)


def cache_dir() -> str:
    """The cache's folder: ``$PYCLAD_CACHE_DIR``, else the user cache directory's ``pyclad``."""
    path = os.environ.get(ENV, "").strip()
    if path:
        return os.path.abspath(os.path.expanduser(path))
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg and os.name == "posix":
        return os.path.join(xdg, "pyclad")
    try:    # platformdirs comes with pyopencl; it knows macOS' and Windows' folders
        from platformdirs import user_cache_dir
        return user_cache_dir("pyclad", appauthor=False)
    except ImportError:
        return os.path.join(os.path.expanduser("~"), ".cache", "pyclad")


def device_identity(device) -> str:
    """What a binary is valid for: the platform and the device, with their versions and the
    driver's. Binaries are loaded only where all of it matches."""
    p = device.platform
    fields = [p.name, p.vendor, p.version, device.name, device.vendor, device.version,
              device.driver_version]
    return " | ".join(str(f).strip() for f in fields)


def program_key(source_sha: str, options, identity: str) -> str:
    h = hashlib.sha256()
    for part in (source_sha, "\0".join(options), identity):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()


# ---------------------------------------------------------------------------- files

def _path(kind: str, key: str) -> str:
    return os.path.join(cache_dir(), kind, key[:2], key)


def _write_atomic(path: str, data: bytes) -> bool:
    """``data`` to ``path`` by a temporary file in its folder and a rename; False (with a warning
    once per process) when it cannot be written."""
    folder = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError as exc:
        with _lock:
            _stats["write_failures"] += 1
        _warn_once("write", f"pyclad's program cache {cache_dir()!r} cannot be written ({exc}); "
                            f"programs are built in memory. Set {ENV} to a writable folder to keep them.")
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


_writable: Dict[str, bool] = {}


def writable() -> bool:
    """Whether entries can be written to the cache's folder (tried once per folder and process)."""
    top = os.path.join(cache_dir(), "programs")
    ok = _writable.get(top)
    if ok is None:
        try:
            os.makedirs(top, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=top)
            os.close(fd)
            os.unlink(tmp)
            ok = True
        except OSError:
            ok = False
        _writable[top] = ok
    return ok


def has_binary(key: str) -> bool:
    """Whether an entry for ``key`` exists (not whether it is whole: :func:`load_binary` checks)."""
    return os.path.exists(_path("programs", key))


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _warn_once("read", f"pyclad's program cache entry {path!r} cannot be read ({exc}); building from source")
        return None


def _reject(path: str, why: str, then: str = "it is rebuilt from source and replaced") -> None:
    with _lock:
        _stats["rejected"] += 1
    warnings.warn(f"pyclad's program cache entry {path} is {why}; {then}", CacheWarning, stacklevel=4)


# ---------------------------------------------------------------------------- binaries

def load_binary(key: str, identity: str) -> Optional[bytes]:
    """The cached binary for ``key`` if its entry is whole and for this device, else None (a bad
    entry is reported; the caller rebuilds it and :func:`store_binary` replaces it)."""
    path = _path("programs", key)
    data = _read(path)
    if data is None:
        return None
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not a pyclad cache entry")
        at = len(MAGIC)
        (n,) = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        header = json.loads(data[at:at + n].decode())
        binary = data[at + n:]
        if header.get("key") != key:
            raise ValueError("an entry of another key")
        if header.get("device") != identity:
            raise ValueError(f"for another device or driver ({header.get('device')!r})")
        if header.get("size") != len(binary):
            raise ValueError(f"truncated ({len(binary)} of {header.get('size')} bytes)")
        if hashlib.sha256(binary).hexdigest() != header.get("sha256"):
            raise ValueError("corrupt (checksum mismatch)")
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        _reject(path, str(exc))
        return None
    return binary


def store_binary(key: str, identity: str, binary: bytes, name: str = "", kernels: str = "",
                 options=()) -> bool:
    header = json.dumps({"key": key, "device": identity, "size": len(binary),
                         "sha256": hashlib.sha256(binary).hexdigest(), "name": name,
                         "kernels": kernels, "options": list(options),
                         "created": time.strftime("%Y-%m-%d %H:%M:%S")}).encode()
    return _write_atomic(_path("programs", key), MAGIC + _HEADER.pack(len(header)) + header + binary)


_made: List[tuple] = []       # (name, "source" or "binary", seconds) of this process' programs


def count_binary_load(seconds: float = 0.0, name: str = "") -> None:
    with _lock:
        _stats["binary_loads"] += 1
        _made.append((name, "binary", seconds))


def count_source_build(key: str, seconds: float, name: str) -> None:
    """Count a build from source, and log it where PYCLAD_BUILD_LOG asks."""
    with _lock:
        _stats["source_builds"] += 1
        _made.append((name, "source", seconds))
    log = os.environ.get(BUILD_LOG_ENV, "").strip()
    if log:
        line = f"source {key} {seconds:.3f} {name or '-'}\n".encode()
        try:    # one short O_APPEND write: whole lines, also from several processes
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as exc:
            _warn_once("log", f"{BUILD_LOG_ENV}={log!r} cannot be written: {exc}")


def made() -> List[tuple]:
    """``(name, how, seconds)`` of every program this process made, in order: ``how`` is
    "source" (built from source) or "binary" (loaded from the cache)."""
    with _lock:
        return list(_made)


def stats() -> Dict[str, int]:
    """This process' counts: ``source_builds``, ``binary_loads``, ``rejected`` (bad entries
    rebuilt) and ``write_failures``."""
    with _lock:
        return dict(_stats)


# ---------------------------------------------------------------------------- renders

_fingerprint: Optional[str] = None


def code_fingerprint() -> str:
    """sha256 of every .py and .cl.mako file of the three packages, read once per process: the
    rendered sources are a function of these files and the parameters."""
    global _fingerprint
    if _fingerprint is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        h = hashlib.sha256()
        for pkg in _PACKAGES:
            top = os.path.join(root, pkg)
            for folder, dirs, files in sorted(os.walk(top)):
                dirs.sort()
                for name in sorted(files):
                    if name.endswith((".py", ".cl.mako")):
                        path = os.path.join(folder, name)
                        h.update(os.path.relpath(path, root).encode() + b"\0")
                        with open(path, "rb") as f:
                            h.update(f.read())
        _fingerprint = h.hexdigest()
    return _fingerprint


_PLAIN = (bool, int, float, str, type(None))


def _canonical(value) -> Optional[str]:
    """A text that names ``value`` exactly, for the plain values templates take (numbers,
    strings, dtypes, tuples of them, objects that declare one with ``cache_token``); None for
    anything else, whose render is then not indexed (a repr could hide a difference)."""
    if isinstance(value, _PLAIN):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, (tuple, list, frozenset)):
        items = [_canonical(v) for v in (sorted(value, key=repr) if isinstance(value, frozenset) else value)]
        if any(i is None for i in items):
            return None
        return f"{type(value).__name__}(" + ",".join(items) + ")"
    token = getattr(value, "cache_token", None)
    if callable(token):
        return f"{type(value).__module__}.{type(value).__qualname__}:{token()}"
    import numpy as np
    if isinstance(value, np.dtype):     # (bfloat16's str is a plain '<V2': named instead)
        from .dtypes import BFLOAT16, is_bfloat16
        return f"dtype:{BFLOAT16 if is_bfloat16(value) else value.str}"
    if isinstance(value, np.generic):
        return f"{value.dtype.str}:{value.item()!r}"
    return None


def render_key(template: str, params: dict) -> Optional[str]:
    """The key of a template's render with ``params``, or None if a parameter has no exact text."""
    parts = [code_fingerprint(), template]
    for name in sorted(params):
        c = _canonical(params[name])
        if c is None:
            return None
        parts.append(f"{name}={c}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def load_render(key: str) -> Optional[str]:
    """The source sha256 a render key is known to give, or None."""
    data = _read(_path("renders", key))
    if data is None:
        return None
    text = data.decode(errors="replace").strip()
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        _reject(_path("renders", key), "not a render entry")
        return None
    return text


_code_marked = False


def store_render(key: str, source_sha: str) -> bool:
    global _code_marked
    ok = _write_atomic(_path("renders", key), source_sha.encode() + b"\n")
    if ok and not _code_marked:
        _code_marked = _write_atomic(_path("renders", "code-" + code_fingerprint()), b"")
    return ok


def code_seen() -> bool:
    """Whether a process running this very code (:func:`code_fingerprint`) has stored renders in
    this cache: its programs are then likely there too. False on a first run and after an update,
    where a caller may start build workers ahead (:func:`clkernels.templates.start_build_workers`)."""
    return os.path.exists(_path("renders", "code-" + code_fingerprint()))


# ---------------------------------------------------------------------------- tunings

def tuning_key(identity: str, what: str, shape_key) -> str:
    """The key of a measured choice: the code (its fingerprint), the device, the op, the shapes."""
    text = "\n".join([code_fingerprint(), identity, what, repr(shape_key)])
    return hashlib.sha256(text.encode()).hexdigest()


def load_tuning(key: str, identity: str) -> Optional[dict]:
    """The record stored under ``key``, or None: none stored, or one that is not a whole record
    of this device (a warning says which; the caller measures again where it tunes)."""
    path = _path("tuning", key)
    data = _read(path)
    if data is None:
        return None
    try:
        record = json.loads(data.decode())
        ok = isinstance(record, dict) and record.get("identity") == identity and "choice" in record
    except (UnicodeDecodeError, ValueError):
        ok = False
    if not ok:
        _reject(path, "not a tuning record of this device",
                "the default launch shape is used, and measured again where tuning is on")
        return None
    return record


def store_tuning(key: str, identity: str, record: dict) -> bool:
    """Store a measured choice (a JSON-able dict with ``choice``) atomically; False if the cache
    cannot be written (a warning once per process)."""
    return _write_atomic(_path("tuning", key), json.dumps(
        {**record, "identity": identity, "created": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())


# ---------------------------------------------------------------------------- listing

def entries() -> List[dict]:
    """The program entries' headers (with ``path`` and ``bytes``), newest first; unreadable
    entries as ``{"path", "bytes", "error"}``."""
    out = []
    for path in _files("programs"):
        try:
            with open(path, "rb") as f:
                head = f.read(len(MAGIC) + _HEADER.size)
                if not head.startswith(MAGIC):
                    raise ValueError("not a pyclad cache entry")
                (n,) = _HEADER.unpack_from(head, len(MAGIC))
                info = json.loads(f.read(n).decode())
            info.update(path=path, bytes=os.path.getsize(path))
        except (OSError, ValueError, struct.error) as exc:
            info = {"path": path, "bytes": os.path.getsize(path) if os.path.exists(path) else 0,
                    "error": str(exc)}
        out.append(info)
    out.sort(key=lambda e: e.get("created", ""), reverse=True)
    return out


def _files(kind: str):
    """The paths of one kind's entries (``programs``, ``renders``, ``tuning``)."""
    for folder, _, files in os.walk(os.path.join(cache_dir(), kind)):
        for name in files:
            yield os.path.join(folder, name)


def tunings() -> List[dict]:
    """The stored launch choices (:mod:`clkernels.autotune`), each record with its ``path``;
    one that does not parse as ``{"path", "error"}``."""
    out = []
    for path in _files("tuning"):
        try:
            with open(path, "rb") as f:
                record = json.loads(f.read().decode())
            whole = isinstance(record, dict) and {"identity", "choice"} <= set(record)
            out.append({**record, "path": path} if whole else {"path": path, "error": "not a tuning record"})
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            out.append({"path": path, "error": str(exc)})
    return out


def size_bytes() -> int:
    total = 0
    for folder, _, files in os.walk(cache_dir()):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(folder, name))
            except OSError:
                pass
    return total


def clear() -> int:
    """Remove every entry (and nothing else of the folder); returns how many files went."""
    removed = 0
    for kind in ("programs", "renders", "tuning"):
        top = os.path.join(cache_dir(), kind)
        for folder, _, files in os.walk(top, topdown=False):
            for name in files:
                try:
                    os.unlink(os.path.join(folder, name))
                    removed += 1
                except FileNotFoundError:
                    pass
            try:
                os.rmdir(folder)
            except OSError:
                pass
    return removed
