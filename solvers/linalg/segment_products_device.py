"""Launcher of ``segment_products_device.cl.mako``: segmented sums of small block products on an OpenCL
device, the heavy part of the Schur complement (see :mod:`solvers.ba.schur_device`)."""
from __future__ import annotations

import numpy as np
import pyopencl.array as cla

from clkernels.arrays import empty, round_up, work_group_size
from clkernels.templates import get_program, kernel

TEMPLATE = "solvers/linalg/segment_products_device.cl.mako"


class Segments:
    """Index arrays of one segmented product, validated once on the host and kept on the device.

    ``starts`` (nseg + 1) cut the products ``p`` into segments; ``i1``/``i2`` (or None for the
    identity) pick the X and Y blocks of product ``p``; ``n1``/``n2`` are the numbers of X and Y
    blocks the indices may address."""

    def __init__(self, runtime, starts, i1, i2, n1, n2):
        starts = np.ascontiguousarray(starts, dtype=np.int32)
        nprod = int(starts[-1]) if starts.size else 0
        if starts.size == 0 or starts[0] != 0 or np.any(np.diff(starts) < 0):
            raise ValueError("segment starts must begin at 0 and be non-decreasing")
        for name, idx, n in (("i1", i1, n1), ("i2", i2, n2)):
            if idx is None:
                if nprod > n:
                    raise ValueError(f"identity {name} addresses {nprod} blocks but only {n} exist")
            elif idx.shape != (nprod,) or (nprod and (idx.min() < 0 or idx.max() >= n)):
                raise ValueError(f"{name} must hold {nprod} indices in [0, {n})")
        if max(nprod, n1, n2) >= 2 ** 31:
            raise ValueError("segment_products indexes with 32-bit ints: problem too large")
        q = runtime.queue
        self.runtime, self.nseg, self.nprod, self.n1, self.n2 = runtime, starts.size - 1, nprod, n1, n2
        self.starts = cla.to_device(q, starts)
        self.i1 = None if i1 is None else cla.to_device(q, np.ascontiguousarray(i1, dtype=np.int32))
        self.i2 = None if i2 is None else cla.to_device(q, np.ascontiguousarray(i2, dtype=np.int32))


def segment_products(seg: Segments, X: cla.Array, Y: cla.Array, x_t: bool = False, y_t: bool = False) -> cla.Array:
    """``out[s, a, b] = sum_{p in s} sum_k X[i1(p), a, k] Y[i2(p), b, k]`` -> device (nseg, NA, NB).

    ``x_t`` / ``y_t``: X (Y) is stored as (n, K, NA) blocks, i.e. its transposes, as Jacobian
    blocks come from the model."""
    if X.dtype != np.float64 or Y.dtype != np.float64 or X.ndim != 3 or Y.ndim != 3:
        raise ValueError(f"X and Y must be float64 3-d arrays; got {X.shape} {X.dtype}, {Y.shape} {Y.dtype}")
    NA, KX = (X.shape[2], X.shape[1]) if x_t else (X.shape[1], X.shape[2])
    NB, KY = (Y.shape[2], Y.shape[1]) if y_t else (Y.shape[1], Y.shape[2])
    if KX != KY:
        raise ValueError(f"X and Y blocks must share their inner size; got {X.shape} (x_t={x_t}), {Y.shape} (y_t={y_t})")
    if X.shape[0] < seg.n1 or Y.shape[0] < seg.n2:
        raise ValueError(f"X has {X.shape[0]} blocks and Y {Y.shape[0]}; the segments address {seg.n1} and {seg.n2}")
    rt = seg.runtime
    # Rows per work-item: as many as keep R * NB accumulators <= 27 (registers), dividing NA.
    R = max(r for r in range(1, NA + 1) if NA % r == 0 and (r * NB <= 27 or r == 1))
    prg = get_program(TEMPLATE, rt, NA=NA, NB=NB, K=KX, R=R, identity1=seg.i1 is None,
                      identity2=seg.i2 is None, x_t=bool(x_t), y_t=bool(y_t))
    k = kernel(prg, "segment_products")
    out = empty(rt, (seg.nseg, NA, NB), np.float64)
    if seg.nseg:
        local = work_group_size(rt, k, 64)
        args = [X.data, Y.data] + [i.data for i in (seg.i1, seg.i2) if i is not None] + \
            [seg.starts.data, out.data, np.int32(seg.nseg)]
        out.add_event(k(rt.queue, (round_up(seg.nseg * (NA // R), local),), (local,), *args))
    return out
