"""The Schur complement's heavy products on an OpenCL device (same results as :mod:`solvers.schur`).

Everything that loops over observations or over pairs of observations runs in one gather kernel,
``segment_products`` (``out[s] = sum over a segment of X[i1] Y[i2]^T``, one work-item per output
row, no atomics); the host keeps only per-camera and per-point work (3x3 inverses, the reduced
camera matrix's factorisation, segment reductions). Segments are cut at most ``MAX_SEGMENT``
products long so that a camera seen in thousands of observations still spreads over many
work-items; their partial sums are added on the host.

Per Jacobian: ``Jc^T Jc`` and ``Jc^T f`` per camera, ``Jp^T Jp`` and ``Jp^T f`` per point,
``W = Jc^T Jp`` per observation. Per linear solve: ``Z = W V^-1`` per observation,
the pair sums ``Z W^T`` per block of the reduced camera matrix, the reduced right-hand side and
the back-substitution sums.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from clkernels import arrays, templates

from .schur import NormalEquations, Structure
from .segment_products import BoundProduct, Segments, segment_products

MAX_SEGMENT = 256


def _split(starts, max_len):
    """Cut segments [starts[i], starts[i+1]) into pieces of at most ``max_len``; returns the new
    starts and, per owner segment, the index of its first piece (for ``numpy.add.reduceat``)."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.diff(starts)
    pieces = np.maximum(1, -(-lengths // max_len))
    first = np.concatenate(([0], np.cumsum(pieces)[:-1]))
    owner = np.repeat(np.arange(lengths.size), pieces)
    k = np.arange(owner.size) - first[owner]
    new = np.minimum(starts[owner] + k * max_len, starts[owner + 1])
    return np.concatenate((new, starts[-1:])), first


class _Reducer:
    """Segments of one kind plus how their partial sums map back to owners (cameras, points,
    blocks); owners without any product get zeros."""

    def __init__(self, runtime, owner_starts, owners, n_owners, i1, i2, n1, n2):
        new_starts, first = _split(owner_starts, MAX_SEGMENT)
        self.first, self.owners, self.n_owners = first, owners, n_owners
        self.seg = Segments(runtime, new_starts, i1, i2, n1, n2)
        self.trivial = new_starts.size - 1 == n_owners and np.array_equal(owners, np.arange(n_owners))
        self.empty_owner = np.diff(np.asarray(owner_starts)) == 0

    def run(self, X, Y, x_t=False, y_t=False):
        return self.finish(segment_products(self.seg, X, Y, x_t, y_t).get())

    def finish(self, part):
        """The owners' sums from the segments' partial sums (host)."""
        if self.trivial and part.shape[0] == self.n_owners:
            out = part
        else:
            out = np.zeros((self.n_owners,) + part.shape[1:])
            if part.shape[0]:
                out[self.owners] = np.add.reduceat(part, self.first, axis=0)
        if self.empty_owner.any():   # reduceat copies a row for empty segments: they hold nothing
            out[self.owners[self.empty_owner]] = 0.0
        return out


class ClStructure:
    """The device-side index arrays of a :class:`Structure`, built once per solve and device."""

    def __init__(self, st: Structure, runtime):
        self.st, self.rt = st, runtime
        n, nc, npt = st.n, st.nc, st.npt
        # Per observation (identity segments): W = Jc^T Jp, W^T, and Z = W V^-1[pt].
        self.per_obs = Segments(runtime, np.arange(n + 1), None, None, n, n)
        self.per_obs_pt = Segments(runtime, np.arange(n + 1), None, st.pt, n, npt)
        # Per point: the observations are sorted by point, so a point's segment is contiguous.
        pt_starts = np.concatenate((np.searchsorted(st.pt, np.arange(npt)), [n]))
        self.points = _Reducer(runtime, pt_starts, np.arange(npt), npt, None, None, n, n)
        self.points_cam = _Reducer(runtime, pt_starts, np.arange(npt), npt, None, st.cam, n, nc)
        # Per camera: observations gathered in camera order.
        order = np.argsort(st.cam, kind="stable")
        cam_starts = np.concatenate((np.searchsorted(st.cam[order], np.arange(nc)), [n]))
        self.cameras = _Reducer(runtime, cam_starts, np.arange(nc), nc, order, order, n, n)
        self.cameras_pt = _Reducer(runtime, cam_starts, np.arange(nc), nc, order, st.pt[order], n, npt)
        self._pairs = {}
        # For the implicit Schur complement of iterative_schur: F x per observation, E^T t per
        # point (whole points, so the result stays on the device), V^-1 u per point. With the
        # products bound once per solve, this beats scipy's single-threaded sparse products on a
        # 2-core CPU too (16-31 % faster whole solves on the BAL problems), so every device uses it.
        self.device_cg = True
        self.per_obs_cam = Segments(runtime, np.arange(n + 1), None, st.cam, n, nc)
        self.points_whole = Segments(runtime, pt_starts, None, None, n, n)
        self.per_point = Segments(runtime, np.arange(npt + 1), None, None, npt, npt)

    def pairs(self, which):
        if which not in self._pairs:
            p = self.st.pairs() if which == "all" else self.st.diag_pairs()
            nb = p.block_row.size
            block_starts = np.zeros(nb + 1, dtype=np.int64)
            if p.o1.size:   # pairs are sorted by block: each block is a contiguous run
                block_starts[1:] = np.cumsum(np.bincount(_block_of_pairs(p), minlength=nb))
            self._pairs[which] = _Reducer(self.rt, block_starts, np.arange(nb), nb, p.o1, p.o2, self.st.n, self.st.n)
        return self._pairs[which]


def _block_of_pairs(p):
    """Block index of every pair (pairs are sorted by block)."""
    out = np.empty(p.o1.size, dtype=np.int64)
    for s, e, local, blocks in p.chunks:
        bounds = np.concatenate((local, [e - s]))
        out[s:e] = np.repeat(blocks, np.diff(bounds))
    return out


class NormalEquationsCL(NormalEquations):
    """:class:`NormalEquations` with the per-observation and per-pair products on an OpenCL device."""

    def __init__(self, st: Structure, r, Jc, Jp, cl_structure: ClStructure):
        self.st, self.r, self.Jc, self.Jp = st, r, Jc, Jp
        self.cs = cs = cl_structure
        # The Jacobian blocks go over as the model returns them, (n, 2, 9) and (n, 2, 3): the
        # kernel reads them as transposed (9, 2) and (3, 2) blocks.
        self.Jc_dev = arrays.to_device(cs.rt, Jc)
        self.Jp_dev = arrays.to_device(cs.rt, Jp)
        r_dev = arrays.to_device(cs.rt, np.ascontiguousarray(r).reshape(-1, 1, 2))
        self.B = cs.cameras.run(self.Jc_dev, self.Jc_dev, True, True)              # (nc, 9, 9)
        self.gc = cs.cameras.run(self.Jc_dev, r_dev, True, False)[:, :, 0]         # (nc, 9)
        self.V = cs.points.run(self.Jp_dev, self.Jp_dev, True, True)               # (npt, 3, 3)
        self.gp = cs.points.run(self.Jp_dev, r_dev, True, False)[:, :, 0]          # (npt, 3)
        self.W_dev = segment_products(cs.per_obs, self.Jc_dev, self.Jp_dev, True, True)    # (n, 9, 3)

    @property
    def W(self):
        return self.W_dev.get()

    def _z_dev(self, Vinv):
        if getattr(self, "_zd_for", None) is not Vinv:
            vinv = arrays.to_device(self.cs.rt, Vinv)
            self._zd, self._zd_for = segment_products(self.cs.per_obs_pt, self.W_dev, vinv), Vinv
        return self._zd

    def _pair_sums(self, pairs, Vinv):
        which = "all" if pairs is self.st.pairs() else "diag"
        return self.cs.pairs(which).run(self._z_dev(Vinv), self.W_dev)

    def _rhs(self, Vinv):
        # gc - sum_o W_o (V^-1 gp)_pt(o): the per-point product on the host, the sum on the device.
        v = (Vinv * self.gp[:, None, :]).sum(axis=2)
        v_dev = arrays.to_device(self.cs.rt, v[:, None, :])
        return self.gc - self.cs.cameras_pt.run(self.W_dev, v_dev)[:, :, 0]

    def _pcg_operator(self, Vinv, Dc2):
        if not self.cs.device_cg:
            return NormalEquations._pcg_operator(self, Vinv, Dc2)
        cs, st = self.cs, self.st
        rt, q = cs.rt, cs.rt.queue
        dc2 = Dc2.ravel()
        # Every product of the implicit Schur complement, bound once to its buffers: an
        # application of S is then five kernel enqueues, one small copy in and one out.
        x_dev = arrays.empty(rt, (st.nc, 1, 9), np.float64)
        F_x = BoundProduct(cs.per_obs_cam, self.Jc_dev, x_dev)                              # t = F x
        t = F_x.out                                                                          # (n, 2, 1)
        Et_t = BoundProduct(cs.points_whole, self.Jp_dev, t.reshape(st.n, 1, 2), x_t=True)  # u = E^T t
        Vinv_u = BoundProduct(cs.per_point, arrays.to_device(rt, Vinv),
                              Et_t.out.reshape(st.npt, 1, 3))                                # v = V^-1 u
        E_v = BoundProduct(cs.per_obs_pt, self.Jp_dev, Vinv_u.out.reshape(st.npt, 1, 3))    # E v
        w = arrays.empty(rt, (st.n, 1, 2), np.float64)
        subtract = _subtract_kernel(rt)
        Ft_w = BoundProduct(cs.cameras.seg, self.Jc_dev, w, True, False)                    # F^T w

        def project_out_points():
            """``F^T (t - E V^-1 E^T t)`` for the per-observation 2-vectors in ``t``."""
            Et_t.run()
            Vinv_u.run()
            E_v.run()
            subtract(q, (2 * st.n,), None, t.data, E_v.out.data, w.data)
            Ft_w.run()
            part = np.empty(Ft_w.out.shape)
            cl.enqueue_copy(q, part, Ft_w.out.data)  # blocking: the queue is in order
            return cs.cameras.finish(part)[:, :, 0].ravel()

        def apply_S(x):
            cl.enqueue_copy(q, x_dev.data, np.ascontiguousarray(x, dtype=np.float64))
            F_x.run()
            return project_out_points() + dc2 * x

        cl.enqueue_copy(q, t.data, np.ascontiguousarray(self.r, dtype=np.float64))  # t = f
        return apply_S, project_out_points()

    def _wty(self, yc):
        y = arrays.to_device(self.cs.rt, yc[:, None, :])
        return self.cs.points_cam.run(self.W_dev, y, True, False)[:, :, 0]   # W read as W^T


def _subtract_kernel(runtime):
    """``c = a - b`` over float64 buffers, as a bound kernel."""
    src = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
           "__kernel void subtract(__global const double *a, __global const double *b, "
           "__global double *c) { const size_t i = get_global_id(0); c[i] = a[i] - b[i]; }")
    return templates.kernel(templates.build(src, runtime), "subtract")
