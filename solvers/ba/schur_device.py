"""The Schur complement's heavy products on an OpenCL device (same results as :mod:`solvers.ba.schur`).

Everything that loops over observations or over pairs of observations runs in one gather kernel,
``segment_products`` (``out[s] = sum over a segment of X[i1] Y[i2]^T``, one work-item per output
row, no atomics); the host keeps only per-camera and per-point work (3x3 inverses, the reduced
camera matrix's factorisation, segment reductions). Segments are cut at most ``MAX_SEGMENT``
products long so that a camera seen in thousands of observations still spreads over many
work-items; their partial sums are added on the host.

Per Jacobian: ``Jc^T Jc`` and ``Jc^T f`` per camera, ``Jp^T Jp`` and ``Jp^T f`` per point.
Per sparse_schur solve: ``W = Jc^T Jp`` and ``Z = W V^-1`` per observation, the pair sums
``Z W^T`` per block of the reduced camera matrix, the reduced right-hand side and the
back-substitution sums. iterative_schur's preconditioner, CG and back-substitution run in
:mod:`solvers.linalg.schur_pcg_device` instead, straight from ``Jc`` and ``Jp``.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from clkernels import arrays

from . import ordering
from .schur import NormalEquations, Structure
from ..linalg.linear_solver import linear_solver
from ..linalg.segment_products_device import Segments, segment_products

MAX_SEGMENT = 256


class _Reducer:
    """Segments of one kind plus how their partial sums map back to owners (cameras, points,
    blocks); owners without any product get zeros."""

    def __init__(self, runtime, owner_starts, owners, n_owners, i1, i2, n1, n2):
        runs = ordering.cut_runs(owner_starts, MAX_SEGMENT, min_runs=1)
        new_starts, first = runs.start, runs.item_run[:-1]
        self.first, self.owners, self.n_owners = first, owners, n_owners
        self.seg = Segments(runtime, new_starts, i1, i2, n1, n2)
        self.trivial = new_starts.size - 1 == n_owners and np.array_equal(owners, np.arange(n_owners))
        self.empty_owner = np.diff(np.asarray(owner_starts)) == 0

    def run(self, X, Y, x_t=False, y_t=False):
        return self.start(X, Y, x_t, y_t)()

    def start(self, X, Y, x_t=False, y_t=False):
        """Enqueue the product and a non-blocking read of its partial sums; returns a function
        that waits for them and gives the owners' sums. (Starting several products before the
        first wait saves a round trip to the device per product.)"""
        part = segment_products(self.seg, X, Y, x_t, y_t)
        host = np.empty(part.shape)
        if not host.size:
            return lambda: self.finish(host)
        event = cl.enqueue_copy(part.queue, host, part.data, is_blocking=False)
        return lambda: (event.wait(), self.finish(host))[1]

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
        # iterative_schur's CG runs whole on the device (solvers.linalg.schur_pcg_device): per iteration three
        # launches and no transfer. False: the host CG with scipy's sparse products.
        self.device_cg = True
        self._pcg = None

    def device_pcg(self):
        if self._pcg is None:
            from ..linalg.schur_pcg_device import DevicePCG
            st = self.st
            self._pcg = DevicePCG(self.rt, st.cam, st.pt, st.nc, st.npt, st.C, st.P, st.R)
        return self._pcg

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
        # The Jacobian blocks go over as the model returns them, (n, R, C) and (n, R, P): the
        # kernel reads them as transposed (C, R) and (P, R) blocks.
        # Everything is enqueued before the first wait: uploads, products, reads.
        uploads = []
        self.Jc_dev = _upload(cs.rt, Jc, uploads)
        self.Jp_dev = _upload(cs.rt, Jp, uploads)
        self.r_dev = r_dev = _upload(cs.rt, np.reshape(r, (-1, 1, st.R)), uploads)
        B = cs.cameras.start(self.Jc_dev, self.Jc_dev, True, True)              # (nc, C, C)
        gc = cs.cameras.start(self.Jc_dev, r_dev, True, False)                  # (nc, C, 1)
        V = cs.points.start(self.Jp_dev, self.Jp_dev, True, True)               # (npt, P, P)
        gp = cs.points.start(self.Jp_dev, r_dev, True, False)                   # (npt, P, 1)
        self.B, self.gc, self.V, self.gp = B(), gc()[:, :, 0], V(), gp()[:, :, 0]
        self._W_dev = None
        self._zd = self._zd_for = None
        self._z_cache = self._z_for = None
        # iterative_schur back-substitutes on the device (solve() sets it per solve).
        self._device_back_substitution = False

    @property
    def W_dev(self):
        """``W = Jc^T Jp`` per observation (n, C, P) on the device, made when first needed:
        sparse_schur's products use it, the device CG's never do."""
        if self._W_dev is None:
            self._W_dev = segment_products(self.cs.per_obs, self.Jc_dev, self.Jp_dev, True, True)
        return self._W_dev

    @property
    def W(self):
        return self.W_dev.get()

    def _z_dev(self, Vinv):
        if self._zd_for is not Vinv:
            self._vinv_upload = []   # a pending upload, done by the time anything reads Z
            vinv = _upload(self.cs.rt, Vinv, self._vinv_upload)
            self._zd, self._zd_for = segment_products(self.cs.per_obs_pt, self.W_dev, vinv), Vinv
        return self._zd

    def _pair_sums(self, which, Vinv):
        return self.cs.pairs(which).run(self._z_dev(Vinv), self.W_dev)

    def _rhs(self, Vinv):
        # gc - sum_o W_o (V^-1 gp)_pt(o): the per-point product on the host, the sum on the device.
        v = (Vinv * self.gp[:, None, :]).sum(axis=2)
        v_dev = arrays.to_device(self.cs.rt, v[:, None, :])
        return self.gc - self.cs.cameras_pt.run(self.W_dev, v_dev)[:, :, 0]

    # With the device CG (iterative_schur's default) the preconditioner's blocks, the solve and
    # the back-substitution all run in solvers.linalg.schur_pcg_device, straight from Jc and Jp.
    def _device_pcg(self):
        pcg = self.cs.device_pcg()
        pcg.bind_jacobian(self.Jc_dev, self.Jp_dev, self.r_dev)
        return pcg

    def diagonal_pair_sums(self, Vinv):
        if not self.cs.device_cg:
            return NormalEquations.diagonal_pair_sums(self, Vinv)
        return self._device_pcg().jacobi_sums(Vinv)

    def solve_pcg(self, Vinv, Dc2, eta, max_iterations, r_tolerance):
        if not self.cs.device_cg:
            return NormalEquations.solve_pcg(self, Vinv, Dc2, eta, max_iterations, r_tolerance)
        Pinv = self._schur_jacobi(Vinv, Dc2)
        x, ok, its, msg = self._device_pcg().solve(Vinv, Dc2, Pinv, q_tolerance=eta,
                                                   r_tolerance=r_tolerance, max_iterations=max_iterations)
        return (x.reshape(self.st.nc, self.st.C) if x is not None else None), ok, its, msg

    def solve(self, D, method="sparse_schur", **kw):
        # sparse_schur has W on the device anyway; iterative_schur back-substitutes without it.
        self._device_back_substitution = self.cs.device_cg and linear_solver(method).iterative
        return NormalEquations.solve(self, D, method, **kw)

    def back_substitute(self, Vinv, yc):
        if self._device_back_substitution:
            return self._device_pcg().back_substitute(Vinv, self.gp, yc)
        return NormalEquations.back_substitute(self, Vinv, yc)

    def _wty(self, yc):
        pending = []
        y = _upload(self.cs.rt, yc[:, None, :], pending)
        return self.cs.points_cam.run(self.W_dev, y, True, False)[:, :, 0]   # W read as W^T


def _upload(runtime, a, pending):
    """A float64 device copy of ``a`` by a non-blocking write (see ``arrays.write_async``)."""
    return arrays.write_async(runtime, arrays.empty(runtime, np.shape(a), np.float64), a, pending)
