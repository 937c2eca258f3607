"""Mako rendering and OpenCL program building, each cached.

Templates are named by their path from the directory that holds the packages, e.g.
``"clkernels/common.cl.mako"`` or ``"pyclad/codegen.cl.mako"``, so that any template can
include the shared one with ``<%namespace name="common" file="/clkernels/common.cl.mako"/>``.
A program is made once per (source, options, context, device) and kept for the process; its
binary is kept on disk (:mod:`clkernels.cache`), so another process loads it instead of building.
A caller that knows the programs it is about to need names them to :func:`prefetch`, which builds
the missing ones side by side in worker processes (:mod:`clkernels.build_pool`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import threading
import time
import warnings
from typing import Callable, Dict, Iterable, Optional, Tuple

import numpy as np
import pyopencl as cl

from . import build_pool, cache, dtypes, simulator
from .runtime import Runtime, get_runtime

__all__ = ["render", "render_string", "build", "get_program", "program_for", "prefetch", "start_build_workers", "Request",
           "template_request", "kernel", "BuildError", "ctype", "storage",
           "Storage", "FP64Error"]

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_lookup = None
# Mako's work, one thread at a time: it parses a template's Python with ast.parse when it first
# compiles it (a package template may be compiled at render time, by a namespace it names), and
# CPython before 3.12 can fail when two threads convert syntax trees at once ("SystemError: AST
# constructor recursion depth mismatch": 1 in 5 runs of 8 threads compiling the templates anew,
# Python 3.11.7; warmup's and several devices' threads render side by side). Rendering is
# milliseconds; builds, which take the time, are outside it.
_mako_lock = threading.RLock()


def _template_lookup():
    """Mako's lookup over the packages' templates, made at the first render: a process whose
    programs all come from the binary cache never imports Mako."""
    global _lookup
    if _lookup is None:
        from mako.lookup import TemplateLookup
        _lookup = TemplateLookup(directories=[_ROOT], strict_undefined=True, input_encoding="utf-8")
    return _lookup


class BuildError(RuntimeError):
    """An OpenCL program failed to build; carries the device, log and numbered source."""

    def __init__(self, device_name: str, log: str, source: str, options: Tuple[str, ...]):
        self.device_name, self.log, self.source, self.options = device_name, log, source, options
        super().__init__(
            f"OpenCL build failed on {device_name!r} (options {' '.join(options) or 'none'}).\n"
            f"--- build log ---\n{log.strip()}\n"
            f"--- source around the errors ---\n{numbered_excerpt(source, log)}")


def numbered_excerpt(source: str, log: str, context: int = 3) -> str:
    """Source lines with numbers, around each line the log names (all of it if none)."""
    lines = source.splitlines()
    # clang style "<source>:12:5: error: ..." (NVIDIA, Intel, Oclgrind) or PoCL's
    # "error: /path/file.cl:12:5: ...": any log line that says error and has a :line:col:.
    wanted = sorted({int(m.group(1)) for line in log.splitlines() if "error" in line
                     for m in [re.search(r":(\d+):\d+:", line)] if m})
    keep = set()
    for n in wanted:
        keep.update(range(max(1, n - context), min(len(lines), n + context) + 1))
    if not keep:
        keep = set(range(1, len(lines) + 1))
    out, last = [], 0
    for n in sorted(keep):
        if n != last + 1:
            out.append("   ...")
        mark = ">>" if n in wanted else "  "
        out.append(f"{mark}{n:5d} | {lines[n - 1]}")
        last = n
    return "\n".join(out)


def render(template: str, **params) -> str:
    """Render a Mako template by its package path with explicit parameters.

    Not cached: :func:`get_program` renders through it only when it has no program or binary
    of the render already.

    Args:
        template: the template's path from the directory that holds the packages, e.g.
            ``"clkernels/common.cl.mako"``.
        **params: the template's parameters; every name the template uses must be given.

    Returns:
        The rendered text (OpenCL C source).

    Raises:
        mako.exceptions.TemplateLookupException: no template of that path.
        NameError: the template uses a name that ``params`` does not give.
    """
    with _mako_lock:
        return _template_lookup().get_template(template).render(**params)


def render_string(text: str, **params) -> str:
    """Render template text given inline (it may include package templates)."""
    from mako.template import Template
    with _mako_lock:
        return Template(text, lookup=_template_lookup(), strict_undefined=True).render(**params)


_programs: Dict[tuple, cl.Program] = {}     # (source sha256, options, context, device)
_guard = threading.Lock()                    # for the two dicts around it
_building: Dict[tuple, threading.Lock] = {}  # a lock per program being made, so that threads
                                             # asking for one program build it once
_identities: Dict[int, str] = {}             # device pointer -> cache.device_identity


def build(source: str, runtime: Runtime = None, options: Iterable[str] = (), name: str = "") -> cl.Program:
    """Build OpenCL C source for a device, or find it built already.

    The program comes from this process' programs (one per source, options, context and
    device), else from the binary cache on disk (:mod:`clkernels.cache`), else it is built from
    source and its binary stored there. Threads that ask for the same program build it once.

    Args:
        source: the OpenCL C source.
        runtime: the :class:`Runtime` whose context and device the program is for, or anything
            :func:`get_runtime` takes (None: the selected device).
        options: the build options, e.g. ``("-cl-fast-relaxed-math",)``.
        name: a label for the program in the cache's listing and the build log.

    Returns:
        The built ``pyopencl.Program``, on the runtime's context.

    Raises:
        BuildError: the device's compiler refused the source (it carries the build log and the
            numbered source).
        DeviceNotFoundError: ``runtime`` is a spec that matches no device.
    """
    runtime = get_runtime(runtime)
    return _program(hashlib.sha256(source.encode()).hexdigest(), lambda: source, runtime,
                    tuple(options), name)


def _program(sha: str, get_source, runtime: Runtime, options: tuple, name: str) -> cl.Program:
    """The program whose source has sha256 ``sha`` (``get_source()`` makes the source, called
    only when it must be built from source)."""
    # Per context, not per device: a program belongs to its context, and a caller's own
    # context on the same device needs its own program (from the binary cache).
    key = (sha, options, runtime.context.int_ptr, runtime.device.int_ptr)
    program = _programs.get(key)
    if program is not None:
        return program
    with _guard:
        lock = _building.setdefault(key, threading.Lock())
    with lock:
        program = _programs.get(key)
        if program is None:
            program = _load(sha, runtime, options, name)
            if program is None:
                source = get_source()
                actual = hashlib.sha256(source.encode()).hexdigest()
                program = _from_source(source, actual, runtime, options, name)
                if actual != sha:       # the caller's sha was of another source: keep both keys
                    _programs[(actual,) + key[1:]] = program
            _programs[key] = program
    return program


def _identity(runtime: Runtime) -> str:
    ident = _identities.get(runtime.device.int_ptr)
    if ident is None:
        ident = _identities[runtime.device.int_ptr] = cache.device_identity(runtime.device)
    return ident


def _load(sha: str, runtime: Runtime, options: tuple, name: str):
    """The program from its cached binary, or None."""
    if not simulator.binary_cache_ok(runtime):
        return None
    t0 = time.perf_counter()
    ident = _identity(runtime)
    pkey = cache.program_key(sha, options, ident)
    worker_error = build_pool.wait(pkey)     # a worker process building it (prefetch): its binary
    if worker_error is not None:
        warnings.warn(f"a build worker process failed on {name or 'a program'} ({worker_error.splitlines()[0]}); "
                      "building it in this process", cache.CacheWarning, stacklevel=4)
    binary = cache.load_binary(pkey, ident)
    if binary is None:
        return None
    try:
        program = cl.Program(runtime.context, [runtime.device], [binary])
        program.build(options=list(options))
    except cl.Error as exc:
        # A whole entry of this device and driver that the driver still refuses: rebuild it.
        warnings.warn(f"{runtime.info.name!r} refused a cached program binary ({exc}); "
                      "building it from source", cache.CacheWarning, stacklevel=4)
        return None
    cache.count_binary_load(time.perf_counter() - t0, name)
    return program


def _from_source(source: str, sha: str, runtime: Runtime, options: tuple, name: str) -> cl.Program:
    t0 = time.perf_counter()
    program = cl.Program(runtime.context, source)
    try:
        program.build(options=list(options))
    except cl.RuntimeError as exc:
        try:
            log = program.get_build_info(runtime.device, cl.program_build_info.LOG)
        except cl.Error:
            log = str(exc)
        raise BuildError(runtime.info.name, log or str(exc), source, options) from None
    seconds = time.perf_counter() - t0
    pkey = None
    if simulator.binary_cache_ok(runtime):
        ident = _identity(runtime)
        pkey = cache.program_key(sha, options, ident)
        try:
            at = program.get_info(cl.program_info.DEVICES).index(runtime.device)
            binary = program.get_info(cl.program_info.BINARIES)[at]
        except (cl.Error, ValueError, IndexError) as exc:
            warnings.warn(f"no binary of the program for {runtime.info.name!r} ({exc}); it is not "
                          "cached", cache.CacheWarning, stacklevel=4)
        else:
            if binary:
                cache.store_binary(pkey, ident, bytes(binary), name=name,
                                   kernels=program.get_info(cl.program_info.KERNEL_NAMES), options=options)
    cache.count_source_build(pkey or sha, seconds, name)
    return program


_kernels: Dict[tuple, cl.Kernel] = {}


def kernel(program: cl.Program, name: str) -> cl.Kernel:
    """One kernel object per (program, name), reused: pyopencl creates a new one (and
    warns) on every attribute lookup. Programs live as long as the process, so ids are stable."""
    key = (id(program), name)
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = cl.Kernel(program, name)
    return k


_rendered: Dict[tuple, str] = {}     # (template, parameters) -> the source's sha256
_sources: Dict[str, str] = {}        # sha256 -> source, for sources rendered in this process


def get_program(template: str, runtime: Runtime = None, options: Iterable[str] = (),
                **params) -> cl.Program:
    """Render ``template`` with ``params`` and build it, both cached in the process and on disk.

    A render of parameters seen before (in this process, or recorded on disk by
    :mod:`clkernels.cache`) goes to its program or binary without rendering, so a warm process
    need not run Mako. On the simulator the template's own build options are added
    (clkernels.simulator.build_options) and the disk cache is not used.

    Args:
        template: the template's path from the directory that holds the packages, as
            :func:`render` takes it.
        runtime: the :class:`Runtime` whose context and device the program is for, or anything
            :func:`get_runtime` takes (None: the selected device).
        options: the build options.
        **params: the template's parameters. A render is found again by them: in the process
            when they are all hashable, on disk when they are all plain values (numbers,
            strings, dtypes, tuples or lists of them, objects with a ``cache_token``); one found
            neither way is rendered again on each call (its build is still cached).

    Returns:
        The built ``pyopencl.Program``, on the runtime's context.

    Raises:
        BuildError: the device's compiler refused the rendered source.
        mako.exceptions.TemplateLookupException: no template of that path.
        NameError: the template uses a name that ``params`` does not give.
        DeviceNotFoundError: ``runtime`` is a spec that matches no device.
    """
    runtime = get_runtime(runtime)
    return _indexed(template, params, lambda: render(template, **params), runtime,
                    _template_options(runtime, template, options))


def _template_options(runtime: Runtime, template: str, options) -> tuple:
    """A template's build options on ``runtime``: the caller's and the simulator's for it."""
    return tuple(options) + simulator.build_options(runtime, template)


def program_for(name: str, params: dict, make_source, runtime: Runtime = None,
                options: Iterable[str] = ()) -> cl.Program:
    """The program of ``make_source()``, a source that ``params`` (plain values: numbers,
    strings, dtypes, tuples of them) determine together with the packages' code: cached like
    :func:`get_program`'s, so a warm process does not make the source at all (pyclad's generated
    kernels). ``name`` says which generator made it."""
    return _indexed(name, params, make_source, get_runtime(runtime), tuple(options))


def _indexed(name: str, params: dict, make_source, runtime: Runtime, options: tuple) -> cl.Program:
    sha, get_source, local = _resolve(name, params, make_source, runtime, options)
    program = _program(sha, get_source, runtime, options, name)
    if local is not None:
        _rendered[local] = sha
    return program


def _resolve(name: str, params: dict, make_source, runtime: Runtime, options: tuple):
    """``(sha, get_source, local key)`` of a request: the source's sha256 from this process' renders
    or the disk's render index without making the source, else made now."""
    try:
        local = (name, tuple(sorted(params.items())))
        sha = _rendered.get(local)
    except TypeError:  # unhashable parameter: make the source every time, the build is still cached
        local, sha = None, None
    disk = simulator.binary_cache_ok(runtime)
    rkey = cache.render_key(name, params) if sha is None and disk else None
    if rkey is not None:
        sha = cache.load_render(rkey)

    def source():
        text = make_source()
        digest = hashlib.sha256(text.encode()).hexdigest()
        _sources[digest] = text
        if local is not None:
            _rendered[local] = digest
        key = rkey if rkey is not None or not disk else cache.render_key(name, params)
        if key is not None:
            cache.store_render(key, digest)
        return text

    if sha is None:
        text = source()
        sha = hashlib.sha256(text.encode()).hexdigest()
        get_source = lambda: text  # noqa: E731
    else:
        get_source = lambda: _sources.get(sha) or source()  # noqa: E731
    return sha, get_source, local


def start_build_workers(runtime: Runtime = None) -> int:
    """Start build worker processes now (:func:`clkernels.build_pool.start`) where this code has not
    filled the binary cache yet (a first run, or the first after an update), so that they are ready
    when :func:`prefetch` hands them sources; a command-line tool calls it before reading its input.
    Returns how many were started (0 where the cache looks warm)."""
    runtime = get_runtime(runtime)
    if not simulator.binary_cache_ok(runtime) or not build_pool.enabled() or cache.code_seen():
        return 0
    return build_pool.start(_identity(runtime))


@dataclasses.dataclass(frozen=True)
class Request:
    """A program a caller is about to ask for, for :func:`prefetch`: ``get_program``'s template
    and parameters (``make_source`` None), or ``program_for``'s name, parameters and source maker."""
    name: str
    params: dict
    make_source: Optional[Callable[[], str]] = None
    options: tuple = ()


def template_request(template: str, options: Iterable[str] = (), **params) -> Request:
    """The :class:`Request` of ``get_program(template, runtime, options, **params)``."""
    return Request(template, params, None, tuple(options))


def prefetch(requests: Iterable[Optional[Request]], runtime: Runtime = None) -> int:
    """Start building, side by side in worker processes (:mod:`clkernels.build_pool`), the programs
    of ``requests`` (None entries are skipped) that neither this process nor the binary cache has,
    when there are at least two or workers are running already; later ``get_program``/
    ``program_for`` calls for them wait for their worker and load the binary. Returns how many
    went to workers. A hint only: what it misses is built when asked for, as without it."""
    runtime = get_runtime(runtime)
    if not simulator.binary_cache_ok(runtime) or not build_pool.enabled():
        return 0
    ident = _identity(runtime)
    jobs = []
    for r in requests:
        if r is None:
            continue
        if r.make_source is None:      # get_program's request: its options and its render
            options = _template_options(runtime, r.name, r.options)
            make = (lambda r=r: render(r.name, **r.params))
        else:
            options, make = tuple(r.options), r.make_source
        sha, get_source, local = _resolve(r.name, r.params, make, runtime, options)
        if (sha, options, runtime.context.int_ptr, runtime.device.int_ptr) in _programs:
            continue
        pkey = cache.program_key(sha, options, ident)
        if cache.has_binary(pkey) or build_pool.pending(pkey) or any(j[0] == pkey for j in jobs):
            continue
        jobs.append((pkey, get_source(), options, r.name))
        if local is not None:
            _rendered[local] = sha
    if not jobs or (len(jobs) < 2 and not build_pool.running(ident)):
        return 0          # one build is as fast here as in a worker, unless a worker is up already
    return build_pool.submit(ident, jobs)


# ---------------------------------------------------------------- dtypes in templates

class FP64Error(RuntimeError):
    """float64 asked for on a device without cl_khr_fp64."""


_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
           np.dtype(np.float16): "half", np.dtype(np.int32): "int",
           np.dtype(np.uint32): "uint", np.dtype(np.int64): "long",
           np.dtype(np.uint8): "uchar", np.dtype(np.int8): "char"}


def ctype(dtype) -> str:
    """The OpenCL C type name of a numpy dtype."""
    try:
        return _CTYPES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"no OpenCL type for dtype {np.dtype(dtype)}") from None


_BF16_HELPERS = """// bfloat16 storage (ushort bits): the high half of a float. Loads shift the bits up; stores
// round to nearest even, a NaN staying a quiet NaN of its sign (as ml_dtypes and torch round).
inline ushort bf16_rte(float f)
{
    const uint u = as_uint(f);
    return (u & 0x7fffffffu) > 0x7f800000u ? (ushort)((u >> 16) | 0x40u)
                                           : (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
""" + "".join(f"""inline ushort{n} bf16_rte{n}(float{n} f)
{{
    const uint{n} u = as_uint{n}(f);
    return convert_ushort{n}(select((u + 0x7fffu + ((u >> 16) & 1u)) >> 16, (u >> 16) | 0x40u,
                                   (u & 0x7fffffffu) > 0x7f800000u));
}}
""" for n in (2, 4, 8, 16))


class Storage:
    """How a floating-point array is stored and read in a kernel.

    Computation is always in ``compute`` (float, or double for float64 storage); half
    storage goes through the core ``vload_half``/``vstore_half`` so no device needs
    ``cl_khr_fp16``; bfloat16 storage is ``ushort`` bits, the high half of a float, stored with
    rounding to nearest even by helper functions that :meth:`helpers` emits. Use in templates:
    ``${st.helpers()}`` once at the top, ``${st.load('p', 'i')}``, ``${st.store('v', 'p', 'i')}``,
    ``${st.loadn(4, 'p', 'i')}`` (the i-th group of 4), ``${st.ptr}`` for the pointer type.
    ``narrow``: 16-bit storage (half or bfloat16), which kernels accumulate in float and store
    at the end.
    """

    def __init__(self, dtype):
        self.is_bf16 = dtypes.is_bfloat16(dtype)
        self.dtype = np.dtype(dtype) if not isinstance(dtype, str) else dtypes.bfloat16()
        if not self.is_bf16 and self.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError(f"storage dtype must be float16, bfloat16, float32 or float64, not {self.dtype}")
        self.is_half = self.dtype == np.float16
        self.narrow = self.is_half or self.is_bf16
        self.ptr = "half" if self.is_half else "ushort" if self.is_bf16 else ctype(self.dtype)
        self.compute = "double" if self.dtype == np.float64 else "float"

    # Equal storages render the same code: value equality keeps the render cache hitting.
    def __eq__(self, other):
        return isinstance(other, Storage) and other.cache_token() == self.cache_token()

    def __hash__(self):
        return hash(("Storage", self.cache_token()))

    def __repr__(self):
        return f"Storage({self.dtype})"

    def cache_token(self) -> str:
        """The exact text of this storage for the render cache (clkernels.cache)."""
        return dtypes.BFLOAT16 if self.is_bf16 else self.dtype.str

    def helpers(self, *others: "Storage") -> str:
        """The device functions that this storage's (or ``others``') stores call, once."""
        return _BF16_HELPERS if any(s is not None and s.is_bf16 for s in (self, *others)) else ""

    def load(self, ptr: str, index: str) -> str:
        if self.is_bf16:
            return f"as_float((uint)({ptr})[{index}] << 16)"
        return f"vload_half({index}, {ptr})" if self.is_half else f"{ptr}[{index}]"

    def store(self, value: str, ptr: str, index: str) -> str:
        if self.is_half:
            return f"vstore_half_rte({value}, {index}, {ptr})"
        if self.is_bf16:
            return f"({ptr})[{index}] = bf16_rte({value})"
        return f"{ptr}[{index}] = {value}"

    def loadn(self, n: int, ptr: str, index: str) -> str:
        if n == 1:
            return self.load(ptr, index)
        if self.is_bf16:
            return f"as_float{n}(convert_uint{n}(vload{n}({index}, {ptr})) << 16)"
        return f"vload_half{n}({index}, {ptr})" if self.is_half else f"vload{n}({index}, {ptr})"

    def storen(self, n: int, value: str, ptr: str, index: str) -> str:
        if n == 1:
            return self.store(value, ptr, index)
        if self.is_half:
            return f"vstore_half{n}_rte({value}, {index}, {ptr})"
        if self.is_bf16:
            return f"vstore{n}(bf16_rte{n}({value}), {index}, {ptr})"
        return f"vstore{n}({value}, {index}, {ptr})"


def storage(dtype, runtime: Runtime = None) -> Storage:
    """A :class:`Storage` for ``dtype``, refusing float64 where the device lacks it."""
    st = Storage(dtype)
    runtime = get_runtime(runtime)
    if st.dtype == np.float64 and not runtime.info.fp64:
        raise FP64Error(
            f"device {runtime.info.name!r} has no double precision (cl_khr_fp64); "
            "use dtype=np.float32, or pick another device with PYCLAD_DEVICE")
    return st
