"""Ordering primitives on the device, for problem setup at the device's pace.

The device twins of :mod:`solvers.ba.ordering`'s host functions, each equal to a numpy expression
(given in its docstring) for int32 data:

- :func:`stable_order` -- ``np.argsort(keys, kind="stable")`` for keys in ``[0, bound)``: an LSD
  radix sort of (key, index) pairs, ``bound.bit_length()`` bits of it (few passes for small
  bounds, none for bound 1). Each pass counts the digits per tile of ``L * K`` elements
  (``radix_count``), scans the digit-major table of counts (:func:`exclusive_scan`), and writes
  each tile's elements at their digit's next position in input order (``radix_scatter``): stable,
  and the same bits on every run and every launch configuration (a stable order is unique).
- :func:`counts`, :func:`starts` -- ``np.bincount`` and its exclusive scan with the total at the
  end; :func:`exclusive_scan` -- device-wide, any length (reduce, scan the block sums, scan).
- :func:`inverse_permutation` -- ``q[p] = arange(n)``; :func:`take` -- ``a[idx]`` along axis 0;
  :func:`stack_pairs` -- ``np.stack((a, b), axis=1)``; :func:`run_starts` -- where each run of
  equal rows begins (``np.flatnonzero`` of the changes).

Inputs: device arrays (``pyopencl.array.Array``, on ``runtime``'s queue, or on another queue
whose pending events are waited for), or numpy arrays (copied over; the result comes back as
numpy). Everything is enqueued; nothing waits for the device unless ``check=True`` (it reads a
flag back) or the inputs are numpy. ``runtime`` may be None: the inputs' runtime, else the
selected device's.

Indices and keys must lie in their ranges, as the host versions assume. A bad one never touches
memory outside the arrays: the radix sort's destinations form a permutation whatever the keys
(a pass reads only its digit's bits), and the other kernels skip or clamp what is out of range
and set a flag; ``check=True`` reads that flag and raises ValueError.

Every size, shift and mask is a kernel argument: a new problem size builds nothing. The render
parameters (work-group size, elements per work-item, digit width; take's element size and row
width) come from the device (:func:`config_for`).
"""
from __future__ import annotations

import threading
from typing import NamedTuple, Optional

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from . import arrays, simulator
from .launch import device_array, owned_kernel, pooled_array, runtime_for
from .runtime import get_runtime
from .templates import get_program, template_request

__all__ = ["stable_order", "counts", "starts", "exclusive_scan", "inverse_permutation", "take", "stack_pairs",
           "run_starts", "Config", "config_for", "program_requests"]

TEMPLATE = "clkernels/sort.cl.mako"


class Config(NamedTuple):
    """The kernels' render parameters: ``L`` work-items per group (a power of two), ``K``
    elements per work-item of a radix tile (and of a count_keys run), ``bits`` per radix digit
    (4 or 8), ``SK`` elements per work-item of a scan block."""
    L: int
    K: int
    bits: int
    SK: int


def _pad(x: int) -> int:
    return x + (x >> 5)          # the template's PAD


def _local_bytes(c: Config) -> int:
    """The larger of radix_scatter's and scan_blocks' local arrays."""
    radix = _pad((1 << c.bits) * c.L) + c.L + (1 << c.bits)
    return 4 * max(radix, _pad(c.L * c.SK) + c.L)


def config_for(runtime) -> Config:
    """The configuration for a device. CPUs (and the simulator): one work-item per group with a
    run of 4096 elements and 8-bit digits: a group is a loop on one core, whose 256 counters stay
    in its cache; 3 passes cover a million keys. (PoCL, 2 cores, 10M keys, 21 bits: 120 ms a sort;
    16 items of 256 elements 240 ms, 4-bit digits 350 ms, 11-bit digits in 2 passes 145 ms.)
    GPUs: 256 work-items of 16 elements, 4-bit digits (16 x 256 counters fit local memory; 8-bit
    ones would take 256 KiB). Within the device's work-group and local memory limits."""
    info = runtime.info
    c = Config(1, 4096, 8, 4096) if simulator.cpu_like(info) else Config(256, 16, 4, 16)
    L = arrays.work_group_size(runtime, None, c.L)
    c = c._replace(L=L)
    while _local_bytes(c) > info.local_mem_bytes and c.bits > 4:
        c = c._replace(bits=4)
    while _local_bytes(c) > info.local_mem_bytes and c.L > 1:
        c = c._replace(L=c.L // 2)
    return c


def _params(rt, config: Config, item: int, W: int) -> dict:
    """The template's parameters: ``config``'s, and take's element size (bytes; 0 for the
    program without take) and row width."""
    # A row as one vector where OpenCL has its width; on CPUs only within the native width
    # (wider vectors change the ABI of PoCL's builtins, see DeviceInfo.widest_vector).
    widest = rt.info.widest_vector("float")
    vector = W in (2, 3, 4, 8, 16) and (widest is None or W * item <= 4 * widest)
    return dict(L=config.L, K=config.K, BITS=config.bits, SK=config.SK, item=item, W=W, vector=vector)


def program_requests(runtime, takes=()) -> list:
    """The programs of the calls on ``runtime`` with its default configuration, for
    :func:`clkernels.templates.prefetch`: the one every function but :func:`take` builds, and
    take's for each ``(itemsize, row width)`` in ``takes`` (a 1-D array's width is 1)."""
    rt = get_runtime(runtime)
    c = config_for(rt)
    return [template_request(TEMPLATE, **_params(rt, c, item, W)) for item, W in ((0, 1), *takes)]


class _Kernels:
    """One program's kernels (objects of this one's own) and a lock: a launch sets its kernel's
    arguments, so two threads must not interleave theirs.

    Every argument is set at every launch, not only when it changed (launch.Preset): the
    buffers of these calls are made and freed per call (uploads, flags, a caller's arrays), so
    a new buffer can get a freed one's handle, and a set skipped for an equal handle is not
    safe everywhere: through Presets, Oclgrind reported reads of a freed buffer in the radix
    kernels after earlier calls (apparently it keeps the address given at clSetKernelArg).
    A call makes a few dozen launches at most: the microseconds a skipped set saves do not
    matter here."""

    def __init__(self, rt, config: Config, item: int = 0, W: int = 1):
        self.rt, self.config = rt, config
        program = get_program(TEMPLATE, rt, **_params(rt, config, item, W))
        names = program.get_info(cl.program_info.KERNEL_NAMES).split(";")
        self.k = {name: owned_kernel(program, name, self) for name in names if name}
        for name in ("radix_count", "radix_scatter", "block_sums", "scan_blocks"):
            if name in self.k and arrays.work_group_size(rt, self.k[name], config.L) < config.L:
                raise ValueError(f"{name} cannot run {config.L} work-items per group on "
                                 f"{rt.info.name}; pass a config with a smaller L")
        first = next(iter(self.k.values()))
        self.ls = arrays.work_group_size(rt, first, 64 if simulator.cpu_like(rt.info) else 256)
        self.lock = threading.Lock()
        # Flag of the calls without check=True: written, never read.
        self.sticky = cla.to_device(rt.queue, np.zeros(1, np.int32))

    def items(self, n: int):
        """Global and local size for one work-item per element."""
        return (arrays.round_up(max(1, n), self.ls),), (self.ls,)


def _kernels(rt, config: Optional[Config], item: int = 0, W: int = 1) -> _Kernels:
    config = config_for(rt) if config is None else Config(*config)
    key = ("clkernels.sort", config, item, W)
    ks = rt.plans.get(key)
    if ks is None:
        ks = rt.plans[key] = _Kernels(rt, config, item, W)
    return ks


# ------------------------------------------------------------------------------ arguments

def _runtime(runtime, *arrays_):
    """``runtime`` (a Runtime, device or spec), else the runtime of the first device array."""
    return get_runtime(runtime) if runtime is not None else runtime_for(arrays_)


def _input(rt, a, name: str, dtypes=(np.int32,), ndim=1):
    """The device array of an argument (numpy copied over), after the checks; waits for its
    events from another queue."""
    a = arrays.check_array(a, name, dtypes, ndim=ndim)
    if a.shape and a.shape[0] > 2 ** 31 - 1:
        raise ValueError(f"{name} has {a.shape[0]} entries; int32 positions reach 2**31 - 1")
    if isinstance(a, np.ndarray):
        return cla.to_device(rt.queue, np.ascontiguousarray(a))
    device_array(rt, a, name)           # context, offset, layout
    if a.events and a.queue is not rt.queue:
        cl.enqueue_barrier(rt.queue, wait_for=a.events)
    return a


def _bound(bound) -> int:
    if isinstance(bound, (bool, np.bool_)) or not isinstance(bound, (int, np.integer)):
        raise TypeError(f"bound must be an int, not {type(bound).__name__}")
    if not 0 <= bound <= 2 ** 31:
        raise ValueError(f"bound must lie in [0, 2**31], got {bound}")
    return int(bound)


def _result(out: cla.Array, event, host: bool):
    if event is not None:
        out.add_event(event)
    return out.get() if host else out


def _new(rt, shape, dtype) -> cla.Array:
    """An output or temporary: from the queue's pool; on the simulator written from the host
    first (simulator.zeros_from_host: its checker reuses a released buffer's shadow at the old
    size, so kernel-written outputs read back as uninitialised past it)."""
    if simulator.zeros_from_host(rt):
        return arrays.scratch(rt, shape, dtype)
    return pooled_array(rt, shape, dtype)


def _int32(rt, n: int) -> cla.Array:
    return _new(rt, (n,), np.int32)


class _Flag:
    """The flag a call's kernels set on a bad index: with check, a fresh zero that
    :meth:`raise_if_set` reads back (waiting for the device); else the kernels' sticky one."""

    def __init__(self, ks: _Kernels, check: bool):
        self.check = check
        self.dev = cla.to_device(ks.rt.queue, np.zeros(1, np.int32)) if check else ks.sticky

    def raise_if_set(self, message: str):
        if self.check and self.dev.get()[0]:
            raise ValueError(message)


# ---------------------------------------------------------------------------------- scans

def _scan(ks: _Kernels, a, n_in: int, n_out: int, out) -> cl.Event:
    """out[:n_out] = exclusive scan of a[:n_in] (zeros after it); buffers; out may be a."""
    c, k, q = ks.config, ks.k, ks.rt.queue
    block = c.L * c.SK
    nblocks = -(-n_out // block)
    if nblocks <= 1:
        return k["scan_blocks"](q, (c.L,), (c.L,), a, np.uint64(n_in), np.uint64(n_out), a,
                                np.int32(0), out)
    sums = _int32(ks.rt, nblocks)
    k["block_sums"](q, (nblocks * c.L,), (c.L,), a, np.uint64(n_in), sums.data)
    _scan(ks, sums.data, nblocks, nblocks, sums.data)
    return k["scan_blocks"](q, (nblocks * c.L,), (c.L,), a, np.uint64(n_in), np.uint64(n_out),
                            sums.data, np.int32(1), out)


def exclusive_scan(runtime, a, *, total: bool = False, config: Config = None):
    """``np.concatenate(([0], np.cumsum(a)[:-1]))`` of an int32 array (any length), as int32
    (sums wrap as int32 does); ``total=True`` gives ``n + 1`` entries, the total last
    (``np.concatenate(([0], np.cumsum(a)))``)."""
    rt = _runtime(runtime, a)
    host = isinstance(a, np.ndarray)
    a = _input(rt, a, "a")
    n = a.size
    out = _int32(rt, n + int(total))
    ks = _kernels(rt, config)
    event = None
    if out.size:
        with ks.lock:
            event = _scan(ks, a.data if n else out.data, n, out.size, out.data)
    return _result(out, event, host)


# ----------------------------------------------------------------------------- radix sort

def stable_order(runtime, keys, bound: int, *, check: bool = False, config: Config = None):
    """``np.argsort(keys, kind="stable").astype(np.int32)`` for int32 keys in ``[0, bound)``.

    ``(bound - 1).bit_length()`` bits are sorted, ``config.bits`` per pass. Keys outside the
    range are sorted by those bits only (no memory outside the arrays is touched);
    ``check=True`` tests the range first (one wait for the device) and raises ValueError."""
    rt = _runtime(runtime, keys)
    host = isinstance(keys, np.ndarray)
    keys = _input(rt, keys, "keys")
    bound, n = _bound(bound), keys.size
    out = _int32(rt, n)
    if n == 0:
        return _result(out, None, host)
    ks = _kernels(rt, config)
    c, k, q = ks.config, ks.k, rt.queue
    with ks.lock:
        if check:
            flag = _Flag(ks, True)
            k["check_keys"](q, *ks.items(n), keys.data, np.uint64(n), np.uint32(bound), flag.dev.data)
            flag.raise_if_set(f"keys lie outside [0, {bound})")
        bits = max(0, bound - 1).bit_length()
        passes = -(-bits // c.bits)
        if passes == 0:             # one key value: the order is the identity
            return _result(out, k["fill_int"](q, *ks.items(n), out.data, np.uint64(n),
                                              np.int32(0), np.int32(1)), host)
        tile = c.L * c.K
        ntiles = -(-n // tile)
        hist = _int32(rt, min(1 << c.bits, 1 << bits) * ntiles)
        # Ping-pong buffers, chosen so that the last pass writes its values into out.
        vals = [out, _int32(rt, n)] if passes % 2 else [_int32(rt, n), out]
        tmp_keys = [_int32(rt, n) for _ in range(min(2, passes - 1))]
        keys_in, vals_in = keys.data, keys.data     # (pass 0 reads no values: they are j)
        event = None
        for p in range(passes):
            shift = p * c.bits
            mask = (1 << min(c.bits, bits - shift)) - 1
            last = p == passes - 1
            keys_out = keys.data if last else tmp_keys[p % 2].data   # (last: written nowhere)
            vals_out = vals[p % 2].data
            args = (np.uint64(n), np.int32(shift), np.uint32(mask), np.uint64(ntiles))
            k["radix_count"](q, (ntiles * c.L,), (c.L,), keys_in, *args, hist.data)
            m = (mask + 1) * ntiles
            _scan(ks, hist.data, m, m, hist.data)
            event = k["radix_scatter"](q, (ntiles * c.L,), (c.L,), keys_in, vals_in, *args,
                                       hist.data, keys_out, vals_out, np.int32(p == 0),
                                       np.int32(not last))
            keys_in, vals_in = keys_out, vals_out
    return _result(out, event, host)


# ------------------------------------------------------------------------ counts and starts

def _count_into(ks: _Kernels, keys, n: int, bound: int, out, size: int, check: bool):
    """out[:size] = 0, then out[key] += 1 per key (keys >= bound counted nowhere)."""
    k, q = ks.k, ks.rt.queue
    flag = _Flag(ks, check)
    event = k["fill_int"](q, *ks.items(size), out.data, np.uint64(size), np.int32(0), np.int32(0))
    if n:
        runs = -(-n // ks.config.K)
        event = k["count_keys"](q, *ks.items(runs), keys.data, np.uint64(n), np.uint32(bound),
                                out.data, flag.dev.data)
    return flag, event


def counts(runtime, keys, bound: int, *, check: bool = False, config: Config = None):
    """``np.bincount(keys, minlength=bound).astype(np.int32)`` for int32 keys in ``[0, bound)``
    (integer atomics: the same result every run). Keys outside the range are counted nowhere;
    ``check=True`` raises ValueError for them (one wait for the device)."""
    rt = _runtime(runtime, keys)
    host = isinstance(keys, np.ndarray)
    keys = _input(rt, keys, "keys")
    bound, n = _bound(bound), keys.size
    out = _int32(rt, bound)
    if bound == 0:
        return _result(out, None, host)
    ks = _kernels(rt, config)
    with ks.lock:
        flag, event = _count_into(ks, keys, n, bound, out, bound, check)
        flag.raise_if_set(f"keys lie outside [0, {bound})")
    return _result(out, event, host)


def starts(runtime, keys, bound: int, *, check: bool = False, config: Config = None):
    """``np.concatenate(([0], np.cumsum(np.bincount(keys, minlength=bound)))).astype(np.int32)``
    (bound + 1 entries): where each key's run begins in the stable order, then n. From counts
    already made: ``exclusive_scan(runtime, counts, total=True)``."""
    rt = _runtime(runtime, keys)
    host = isinstance(keys, np.ndarray)
    keys = _input(rt, keys, "keys")
    bound, n = _bound(bound), keys.size
    out = _int32(rt, bound + 1)
    ks = _kernels(rt, config)
    with ks.lock:
        # Counted into the first bound entries, the last one zero: the in-place scan then ends
        # with the total.
        flag, _ = _count_into(ks, keys, n, bound, out, bound + 1, check)
        flag.raise_if_set(f"keys lie outside [0, {bound})")
        event = _scan(ks, out.data, bound + 1, bound + 1, out.data)
    return _result(out, event, host)


# ---------------------------------------------------------------------- permutations, take

def inverse_permutation(runtime, p, *, check: bool = False, config: Config = None):
    """``q`` with ``q[p] = np.arange(n)`` (``np.argsort(p).astype(np.int32)`` for a permutation
    ``p`` of int32). Entries outside ``[0, n)`` write nothing (``check=True``: ValueError); a
    ``p`` with repeats leaves the missing entries of ``q`` unwritten."""
    rt = _runtime(runtime, p)
    host = isinstance(p, np.ndarray)
    p = _input(rt, p, "p")
    n = p.size
    out = _int32(rt, n)
    if n == 0:
        return _result(out, None, host)
    ks = _kernels(rt, config)
    with ks.lock:
        flag = _Flag(ks, check)
        event = ks.k["inverse_permutation"](rt.queue, *ks.items(n), p.data, np.uint64(n), out.data,
                                            flag.dev.data)
        flag.raise_if_set(f"p has entries outside [0, {n})")
    return _result(out, event, host)


_TAKE_DTYPES = (np.int32, np.float32, np.float64)


def take(runtime, a, idx, out=None, *, check: bool = False):
    """``np.take(a, idx, axis=0)``: rows ``a[idx]`` of a 1-D array or of a 2-D one with rows of
    1 to 16 elements (int32, float32 or float64), for int32 ``idx`` in ``[0, len(a))``. Indices
    outside the range read the nearest row (numpy's ``mode="clip"``; ``check=True``:
    ValueError). ``out``: an array of the result's shape and dtype to write into (device or
    numpy, as the result is: numpy when ``a`` and ``idx`` are)."""
    rt = _runtime(runtime, a, idx)
    host = isinstance(a, np.ndarray) and isinstance(idx, np.ndarray)
    a = arrays.check_array(a, "a", _TAKE_DTYPES)
    if a.ndim not in (1, 2) or (a.ndim == 2 and not 1 <= a.shape[1] <= 16):
        raise ValueError(f"a must be 1-D or 2-D with rows of 1 to 16 elements, got shape {a.shape}")
    a = _input(rt, a, "a", _TAKE_DTYPES, a.ndim)
    idx = _input(rt, idx, "idx")
    n, rows, W = idx.size, a.shape[0], (a.shape[1] if a.ndim == 2 else 1)
    shape = (n,) + a.shape[1:]
    if n and not rows:
        raise ValueError("cannot take rows from an empty a")
    if out is None or host:
        result = _new(rt, shape, a.dtype)
    else:
        result = arrays.check_array(out, "out", (a.dtype,), shape=shape)
        device_array(rt, result, "out")
    if host and out is not None:
        arrays.check_array(out, "out", (a.dtype,), shape=shape)
    event = None
    if n:
        ks = _kernels(rt, None, item=a.dtype.itemsize, W=W)
        with ks.lock:
            flag = _Flag(ks, check)
            event = ks.k["take_rows"](rt.queue, *ks.items(n), a.data, np.uint64(rows), idx.data,
                                      np.uint64(n), result.data, flag.dev.data)
            flag.raise_if_set(f"idx has entries outside [0, {rows})")
    if host and out is not None:
        result.get(ary=out)
        return out
    return _result(result, event, host)


def stack_pairs(runtime, a, b):
    """``np.stack((a, b), axis=1)`` of two int32 arrays of one length: (n, 2) int32 (an index of
    pairs, as a bundle adjustment's (camera, point) per observation)."""
    rt = _runtime(runtime, a, b)
    host = isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
    a, b = _input(rt, a, "a"), _input(rt, b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have one shape, got {a.shape} and {b.shape}")
    n = a.size
    out = _new(rt, (n, 2), np.int32)
    event = None
    if n:
        ks = _kernels(rt, None)
        with ks.lock:
            event = ks.k["stack_pairs"](rt.queue, *ks.items(n), a.data, b.data, np.uint64(n), out.data)
    return _result(out, event, host)


def run_starts(runtime, a, b=None, *, config: Config = None):
    """Where each run of equal ``a`` (of equal ``(a, b)`` rows with ``b``) begins, for int32 arrays
    of one length: ``np.flatnonzero(np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])])`` as
    int32 (empty for empty inputs). Its length is data-dependent, so the call reads one count
    back (one wait for the device)."""
    rt = _runtime(runtime, a, b)
    host = isinstance(a, np.ndarray) and (b is None or isinstance(b, np.ndarray))
    a = _input(rt, a, "a")
    b = a if b is None else _input(rt, b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have one shape, got {a.shape} and {b.shape}")
    n = a.size
    if n == 0:
        return _result(_int32(rt, 0), None, host)
    ks = _kernels(rt, config)
    flags, at = _int32(rt, n), _int32(rt, n + 1)
    with ks.lock:
        ks.k["run_flags"](rt.queue, *ks.items(n), a.data, b.data, np.uint64(n), flags.data)
        _scan(ks, flags.data, n, n + 1, at.data)
    total = np.empty(1, np.int32)
    cl.enqueue_copy(rt.queue, total, at.data, src_offset=4 * n)       # blocking: the count
    out = _int32(rt, int(total[0]))
    with ks.lock:
        event = ks.k["flagged_positions"](rt.queue, *ks.items(n), flags.data, at.data, np.uint64(n), out.data)
    return _result(out, event, host)
