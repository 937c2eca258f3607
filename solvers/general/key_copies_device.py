"""The keys' copies of the problem's columns, on the OpenCL device.

Taken as a camera of K columns, a key (an observation's non-eliminated rows: for COLMAP its
image, which fixes its pose and its camera) holds a copy of each problem column it touches. A
column that many keys share (the intrinsics of a camera that many images use) has a copy per
key; a constant entry's key column copies none. :class:`KeyCopies` moves vectors and matrices
between the keys' columns and the problem's (``pair_schur_device.cl.mako``'s kernels):

- :meth:`compress`: the keys' dense matrix summed into the problem's ``nf x nf`` one;
- :meth:`to_columns`: a keys' vector summed per problem column; :meth:`to_copies`: a problem
  vector gathered into every copy; :meth:`sum_in_place`: every copy given its column's sum.

Used by the general core's device reduction (:mod:`solvers.general.pair_schur_device`) and by the
device-resident core's merged groups (:mod:`solvers.linalg.sparse_schur_device`).
"""
from __future__ import annotations

import numpy as np

from clkernels import arrays
from clkernels.launch import presets, release_kernels
from clkernels.templates import get_program

TEMPLATE = "solvers/general/pair_schur_device.cl.mako"


class KeyCopies:
    """``column`` (nv,): the problem column (``0 .. nf - 1``) of each key column, -1 where it copies
    none; keys of ``K`` columns (``R``: the residuals per observation, for the template)."""

    def __init__(self, runtime, column, nf: int, K: int, R: int):
        self.rt = rt = runtime
        column = np.asarray(column, np.int64).ravel()
        self.nv, self.nf, self.K = column.size, int(nf), int(K)
        held = np.flatnonzero(column >= 0)
        by_column = held[np.argsort(column[held], kind="stable")]
        start = np.concatenate(([0], np.cumsum(np.bincount(column[held], minlength=self.nf))))
        i32 = lambda a: arrays.to_device(rt, np.ascontiguousarray(a, np.int32))  # noqa: E731
        self.copy_start, self.copy_col = i32(start), i32(by_column if by_column.size else [0])
        self.column_dev = i32(column if column.size else [0])
        self.shared = bool(np.any(np.diff(start) > 1))
        self.k = presets(get_program(TEMPLATE, rt, K=self.K, R=int(R)), self)
        self.ls = arrays.work_group_size(rt, self.k["compress_rows"].kernel, 64 if rt.info.is_cpu else 256)
        self.by_column = None
        self.nbytes = 4 * (start.size + max(1, by_column.size) + max(1, column.size))

    def _items(self, n):
        return (arrays.round_up(max(1, n), self.ls),), (self.ls,)

    def compress(self, A, out, ld_out: int, lower: bool, sign: float):
        """``out[i, j] = -sign * sum over the copies u of i and v of j of A[u, v]`` (row-major,
        ``ld_out`` columns; the lower triangle only with ``lower``), where ``A`` (nv x nv) holds a
        keys' matrix's block lower triangle, each key's diagonal block whole (the reduced-system
        kernels' dense output)."""
        nf, nv, q = self.nf, self.nv, self.rt.queue
        if not nf:
            return
        if self.by_column is None:                      # the keys' rows summed per problem column
            self.by_column = arrays.scratch(self.rt, max(1, nv * nf), np.float64)
            self.nbytes += self.by_column.nbytes
        self.k["compress_columns"](q, *self._items(nv * nf), A.data, np.int32(nv), self.copy_start.data,
                                   self.copy_col.data, self.by_column.data, np.int32(nf))
        self.k["compress_rows"](q, *self._items(nf * nf), self.by_column.data, self.copy_start.data,
                                self.copy_col.data, out.data, np.int32(ld_out), np.int32(nf),
                                np.int32(1 if lower else 0), np.float64(sign))

    def sum_in_place(self, v):
        """Every copy in the keys' vector ``v`` (float64, nv) becomes its column's sum."""
        if self.shared:
            self.k["copies_sum"](self.rt.queue, *self._items(self.nf), v.data, self.copy_start.data,
                                 self.copy_col.data, np.int32(self.nf))

    def to_columns(self, v, out):
        """``out`` (nf) = the keys' vector ``v`` summed per problem column."""
        if self.nf:
            self.k["to_columns"](self.rt.queue, *self._items(self.nf), v.data, self.copy_start.data,
                                 self.copy_col.data, out.data, np.int32(self.nf))

    def to_copies(self, y, out):
        """``out`` (nv) = the problem vector ``y`` at every copy, 0 where a key column copies none."""
        if self.nv:
            self.k["to_copies"](self.rt.queue, *self._items(self.nv), y.data, self.column_dev.data, out.data,
                                np.int32(self.nv))

    def close(self):
        release_kernels(self)
