"""Orderings of a problem's observations (by point, by camera) and what is read off them, for tens
of millions of observations.

Each function equals a plain numpy definition, given in its docstring and checked in
``tests/test_solver_ordering.py``; only the cost differs. What makes them cheaper:

- a sort is skipped when the keys are sorted already (one O(n) pass to find out);
- keys are bounded integers (camera or point indices), so a stable sort is a bucket pass on the
  high bits followed by small per-bucket sorts of the low bits, both numpy's radix sort (it sorts
  integers of up to 16 bits stably in O(n)), not a comparison sort of 64-bit keys;
- the per-bucket and per-chunk work runs on threads (numpy releases the GIL in its sorts and in
  ``take``, not in fancy indexing); every thread writes its own slice of the output, so the
  result does not depend on the thread count;
- outputs are int32 where the values fit, large temporaries are made chunk by chunk, and fresh
  output memory is first written on threads: on a machine where new memory is slow to fault in
  (a virtual machine whose host takes freed memory back), the bytes touched cost more than the
  arithmetic, and faulting them in on several cores is faster than on one.
"""
from __future__ import annotations

import collections
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# Elements per chunk of the chunked passes: large enough that numpy's per-call cost vanishes,
# small enough that a chunk's temporaries stay in memory already touched.
CHUNK = 1 << 20
# Bits per bucket pass of stable_order: 8 for the bucket ids, up to 16 for numpy's radix sort.
BUCKET_BITS, RADIX_BITS = 8, 16


# Inputs up to this length are sorted by numpy alone.
SMALL = 1 << 18


def threads() -> int:
    """Threads for the parallel passes: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:      # not on Linux
        return max(1, os.cpu_count() or 1)


_pool = None
_pool_lock = threading.Lock()


def _threads_pool() -> ThreadPoolExecutor:
    """One pool for the process, made on first use: a pool per call started and joined its
    threads every time (16 of them, 16 calls in the setup of a 200-image COLMAP solve: about
    0.03 s of the H200 machine's 0.2 s first solve)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(threads(), thread_name_prefix="ordering")
        return _pool


def _forget_pool():
    # A forked child has none of the parent's threads: it makes its own pool when it needs one.
    global _pool
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _map(fn, items):
    """``fn`` over ``items`` (for its side effects), on threads when there is more than one.
    Not reentrant: ``fn`` must not call _map (its tasks would wait for the pool it fills)."""
    items = list(items)
    if min(threads(), len(items)) <= 1:
        for item in items:
            fn(item)
        return
    for _ in _threads_pool().map(fn, items):
        pass


def _chunks(n, size=CHUNK):
    return [(a, min(n, a + size)) for a in range(0, n, size)]


def empty(shape, dtype) -> np.ndarray:
    """``np.empty(shape, dtype)`` with its memory touched on threads (zeros), for an output that
    is then written in an order that one thread would fault in page by page (a scatter)."""
    out = np.empty(shape, dtype)
    flat = out.reshape(-1)
    _map(lambda c: flat[c[0]:c[1]].fill(0), _chunks(flat.size, 4 * CHUNK))
    return out


def converted(a, dtype) -> np.ndarray:
    """``np.ascontiguousarray(a, dtype)`` of a 1-D ``a``: ``a`` itself when it is that already,
    else converted a chunk at a time on threads, so the fresh output's memory faults in on several
    cores (two int64 index arrays of 116M observations to int32: 0.33 s on one core)."""
    a = np.asarray(a)
    dtype = np.dtype(dtype)
    if a.ndim != 1 or a.size <= SMALL or (a.dtype == dtype and a.flags.c_contiguous):
        return np.ascontiguousarray(a, dtype)
    out = np.empty(a.size, dtype)
    _map(lambda c: np.copyto(out[c[0]:c[1]], a[c[0]:c[1]], casting="unsafe"), _chunks(a.size, 4 * CHUNK))
    return out


def columns(cols, dtype) -> np.ndarray:
    """``np.stack(cols, axis=1).astype(dtype)``, written a chunk at a time on threads, without the
    stacked copy in the columns' own dtype."""
    cols = [np.asarray(c) for c in cols]
    n = cols[0].size if cols else 0
    if any(c.shape != (n,) for c in cols):
        raise ValueError(f"columns of different lengths: {[c.shape for c in cols]}")
    out = np.empty((n, len(cols)), dtype)

    def write(chunk):
        lo, hi = chunk
        for j, c in enumerate(cols):
            out[lo:hi, j] = c[lo:hi]

    _map(write, _chunks(n))
    return out


def index_dtype(n: int):
    """int32 for indices below ``n`` when they fit, else int64."""
    return np.dtype(np.int32) if n <= 2 ** 31 else np.dtype(np.int64)


def is_sorted(a) -> bool:
    """``bool(np.all(a[1:] >= a[:-1]))``, a chunk at a time (stops at the first unsorted chunk)."""
    a = np.asarray(a)
    for lo, hi in _chunks(a.size - 1):
        if not np.all(a[lo + 1:hi + 1] >= a[lo:hi]):
            return False
    return True


def is_sorted_by(major, minor) -> bool:
    """Whether the pairs ``(major, minor)`` are in lexicographic order (ties allowed): whether
    ``np.lexsort((minor, major))`` is the identity."""
    major, minor = np.asarray(major), np.asarray(minor)
    for lo, hi in _chunks(major.size - 1):
        a0, a1 = major[lo:hi], major[lo + 1:hi + 1]
        if not np.all((a1 > a0) | ((a1 == a0) & (minor[lo + 1:hi + 1] >= minor[lo:hi]))):
            return False
    return True


def counts(keys, bound: int) -> np.ndarray:
    """``np.bincount(keys, minlength=bound)`` for keys in ``[0, bound)`` (int64), a chunk at a time
    (bincount converts its whole input to int64 first)."""
    keys = np.asarray(keys)
    out = np.zeros(bound, np.int64)
    for lo, hi in _chunks(keys.size, 8 * CHUNK):
        out += np.bincount(keys[lo:hi], minlength=bound)
    return out


def starts(keys, bound: int) -> np.ndarray:
    """``np.concatenate((np.searchsorted(np.sort(keys), np.arange(bound)), [n]))`` for keys in
    ``[0, bound)``: where each key's run begins once they are sorted stably, and the end (int64,
    bound + 1). From the counts alone, so the keys need not be sorted."""
    out = np.zeros(bound + 1, np.int64)
    np.cumsum(counts(keys, bound), out=out[1:])
    return out


def stable_order(keys, bound: int, dtype=None) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for integer keys in ``[0, bound)``, as ``dtype``
    (default: :func:`index_dtype` of the length).

    Sorted keys give ``arange`` after one pass. Otherwise the keys' top ``BUCKET_BITS`` bits
    (their bucket) order them first: each chunk of the input is sorted by bucket on its own
    thread (numpy's radix sort, stable), and every chunk's run of a bucket is copied to where that
    bucket's elements from earlier chunks end, so each bucket holds its elements in input order.
    Then each bucket is sorted stably on the bits below (radix sort when they are at most 16), on
    threads. Sorting on the high bits, then stably on the low ones, is sorting on the whole key,
    ties in input order.
    """
    keys = np.asarray(keys)
    n = keys.size
    dtype = np.dtype(dtype) if dtype is not None else index_dtype(n)
    if is_sorted(keys):
        return np.arange(n, dtype=dtype)
    if n <= SMALL:
        # Below this the buckets' threads cost more than numpy's own sort (256 tasks of nothing).
        # Keys below 2^16 as uint16: numpy's stable sort of 16-bit keys is a radix sort, 10x
        # faster than its merge sort of int64 (200k keys: 1.3 ms against 15 ms).
        if bound <= 1 << RADIX_BITS and keys.dtype.itemsize > 2:
            keys = keys.astype(np.uint16)
        return np.argsort(keys, kind="stable").astype(dtype, copy=False)
    shift = max(0, int(bound - 1).bit_length() - BUCKET_BITS)
    nb = 1 << BUCKET_BITS
    chunks = _chunks(n)
    bucket = np.empty(n, np.uint8)
    per_chunk = np.zeros((len(chunks), nb), np.int64)

    def bucket_ids(i):
        lo, hi = chunks[i]
        np.right_shift(keys[lo:hi], shift, out=bucket[lo:hi], casting="unsafe")
        per_chunk[i] = np.bincount(bucket[lo:hi], minlength=nb)

    _map(bucket_ids, range(len(chunks)))
    edges = np.zeros(nb + 1, np.int64)
    np.cumsum(per_chunk.sum(axis=0), out=edges[1:])
    # Where chunk i's elements of bucket k go: after bucket k's elements of chunks 0 .. i-1.
    dest = edges[:-1] + np.cumsum(per_chunk, axis=0) - per_chunk
    by_bucket = np.empty(n, dtype if shift == 0 else index_dtype(n))
    # The bits below the bucket's travel with the indices, so that the per-bucket sorts read
    # them in place rather than gathering them from all over the input.
    low_mask = (1 << shift) - 1
    low_by_bucket = None if shift == 0 else np.empty(n, np.uint16 if shift <= RADIX_BITS else keys.dtype)

    def place(i):
        lo, hi = chunks[i]
        local = np.argsort(bucket[lo:hi], kind="stable")
        low = None
        if low_by_bucket is not None:
            low = np.take(keys[lo:hi], local)
            low &= low_mask
        local += lo
        at = 0
        for k in np.flatnonzero(per_chunk[i]):
            m, d = int(per_chunk[i, k]), int(dest[i, k])
            by_bucket[d:d + m] = local[at:at + m]
            if low is not None:
                low_by_bucket[d:d + m] = low[at:at + m]
            at += m

    _map(place, range(len(chunks)))
    bucket = None      # free it (the closures above are done with it)
    if shift == 0:
        return by_bucket
    out = np.empty(n, dtype)

    def sort_bucket(k):
        lo, hi = int(edges[k]), int(edges[k + 1])
        if hi > lo:
            within = np.argsort(low_by_bucket[lo:hi], kind="stable")
            out[lo:hi] = np.take(by_bucket[lo:hi], within)

    _map(sort_bucket, range(nb))
    return out


def sort_within(starts, keys, *values):
    """Each range ``[starts[i], starts[i + 1])`` sorted stably by ``keys`` on its own, ``values``
    moved alike: with ``seg`` each element's range and
    ``order = np.lexsort((np.arange(n), keys, seg))``, returns ``(keys[order], *(v[order] for v in
    values))``. ``starts`` ascend from 0 to ``n``.

    For many short ranges (a camera's pairs of groups): each is sorted where it lies, so the
    gathers stay within memory just read, where one sort of everything by (range, key) gathers
    from anywhere. Ranges are sorted on threads, runs of consecutive ranges of about ``CHUNK``
    elements a task; keys of 16 bits or fewer make each sort numpy's radix sort."""
    starts = np.asarray(starts, np.int64)
    keys = np.asarray(keys)
    values = [np.asarray(v) for v in values]
    outs = [np.empty_like(keys)] + [np.empty_like(v) for v in values]
    ins = [keys] + values
    # Tasks: consecutive ranges whose elements add up to about CHUNK.
    cuts = np.unique(np.searchsorted(starts, np.arange(0, int(starts[-1]) if starts.size else 0, CHUNK)))
    tasks = list(zip(cuts, list(cuts[1:]) + [starts.size - 1]))

    def sort_ranges(task):
        for r in range(int(task[0]), int(task[1])):
            lo, hi = int(starts[r]), int(starts[r + 1])
            if hi - lo > 1:
                local = np.argsort(keys[lo:hi], kind="stable")
                for src, dst in zip(ins, outs):
                    np.take(src[lo:hi], local, axis=0, out=dst[lo:hi])
            elif hi > lo:
                for src, dst in zip(ins, outs):
                    dst[lo:hi] = src[lo:hi]

    _map(sort_ranges, tasks)
    return tuple(outs)


Runs = collections.namedtuple("Runs", "start item_run owner k")


def cut_runs(starts, max_len: int, min_runs: int = 0) -> Runs:
    """The ranges ``[starts[i], starts[i + 1])`` cut into runs of at most ``max_len``, an empty
    range into ``min_runs`` (0 or 1) runs of nothing. ``start``: the runs' starts, then the end
    (nruns + 1); ``item_run``: each range's first run, then nruns (n + 1, for reduceat or a
    gather of its runs' sums); ``owner`` and ``k``: each run's range and its place in it."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.diff(starts)
    pieces = np.maximum(min_runs, -(-lengths // max_len))
    item_run = np.concatenate(([0], np.cumsum(pieces)))
    owner = np.repeat(np.arange(lengths.size), pieces)
    k = np.arange(owner.size) - item_run[owner]
    start = np.minimum(starts[owner] + k * max_len, starts[owner + 1])
    return Runs(np.concatenate((start, starts[-1:])), item_run, owner, k)


def inverse_permutation(p, dtype=None) -> np.ndarray:
    """``q`` with ``q[p] = arange(n)`` (``np.argsort(p)`` for a permutation ``p``), as ``dtype``
    (default: :func:`index_dtype` of the length), a chunk at a time."""
    p = np.asarray(p)
    n = p.size
    dtype = np.dtype(dtype) if dtype is not None else index_dtype(n)
    # The scatter runs on one thread (numpy holds the GIL in a fancy-index assignment, which is
    # still faster than np.put); the output's fresh memory is faulted in on threads first.
    out = empty(n, dtype)
    for lo, hi in _chunks(n):
        out[p[lo:hi]] = np.arange(lo, hi, dtype=dtype)
    return out


def take(a, idx, dtype=None) -> np.ndarray:
    """``a[idx]`` along the first axis (as ``dtype``, default ``a``'s), chunks on threads."""
    a, idx = np.asarray(a), np.asarray(idx)
    out = np.empty((idx.size,) + a.shape[1:], dtype or a.dtype)

    def gather(chunk):
        lo, hi = chunk
        if out.dtype == a.dtype:
            # Indices come from the orderings above, so in range; "clip" lets take write into
            # out directly (the default "raise" mode buffers it).
            np.take(a, idx[lo:hi], axis=0, out=out[lo:hi], mode="clip")
        else:
            out[lo:hi] = np.take(a, idx[lo:hi], axis=0)

    _map(gather, _chunks(idx.size))
    return out


def changes(values, order) -> np.ndarray:
    """Where ``v = values[order]`` changes: ``np.concatenate(([True], v[1:] != v[:-1]))`` (bool),
    ``v`` gathered a chunk at a time."""
    values, order = np.asarray(values), np.asarray(order)
    n = order.size
    out = np.empty(n, bool)

    def one(chunk):
        lo, hi = chunk
        v = np.take(values, order[max(0, lo - 1):hi])
        if lo == 0:
            out[0] = True
            np.not_equal(v[1:], v[:-1], out=out[1:hi])
        else:
            np.not_equal(v[1:], v[:-1], out=out[lo:hi])

    _map(one, _chunks(n))
    return out


def next_true(mask, positions) -> np.ndarray:
    """For each position, the first index at or after it where ``mask`` is True, else
    ``mask.size``: with ``t = np.concatenate((np.flatnonzero(mask), [mask.size]))``,
    ``t[np.searchsorted(t, positions)]``. Only the False entries are listed (few where the mask
    marks the starts of runs that are mostly one long)."""
    mask = np.asarray(mask, bool)
    positions = np.asarray(positions, np.int64)
    false = np.flatnonzero(~mask)
    if not false.size or not positions.size:
        return positions.copy()
    # Runs of consecutive False entries: a position inside one moves to just past its end.
    last_of_run = np.flatnonzero(np.concatenate((np.diff(false) != 1, [True])))
    j = np.minimum(np.searchsorted(false, positions), false.size - 1)
    inside = false[j] == positions
    run_end = false[last_of_run[np.searchsorted(last_of_run, j)]] + 1
    return np.where(inside, run_end, positions)
