"""The general core's Schur reduction ``W V^-1 W^T`` on the OpenCL device: :class:`DevicePairSchur`
has :class:`solvers.general.pair_schur.PairSchur`'s methods and results (to rounding), for reduced
matrices that are dense.

Every observation of the kind has a key: the tuple of its non-eliminated rows (for COLMAP: the
image, which fixes the camera). Taken as a camera with K columns (the kind's non-eliminated
entries), a key gives the bundle adjuster's structure, one camera and one point per observation,
so the bundle-adjustment core's kernels (:mod:`solvers.linalg.schur_reduced_device`) assemble the keys' dense
``F^T F - W V^-1 W^T`` (the keys' blocks of ``F^T F`` from ``key_normal``, ``Dc^2 = 0``). A
problem column shared by many keys (the intrinsics of a camera that every image uses) has a copy
per key; ``pair_schur_device.cl.mako`` sums the copies into the problem's ``nf x nf`` matrix.
On CPUs that matrix comes back to the host for LAPACK; on GPUs it is factorised and solved on the
device (:meth:`DevicePairSchur.factor_solve`). numpy's pair products cost seconds there (1,000
images with a shared camera: 1.9 s per Jacobian, and 5.3 s to index the pairs once); the
device's take a fraction of that.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from clkernels import arrays
from clkernels.launch import presets, release_kernels
from clkernels.templates import get_program

from ..linalg import factorisation_limits as limits
from ..linalg.host_cholesky import MSG_NOT_FINITE, MSG_NOT_PD
from .key_copies_device import KeyCopies
from .pair_schur import PairReduction, observation_keys, sum_copies
from ..linalg.schur_reduced_device import MAX_RUN_CPU, MAX_RUN_GPU, ReducedCameraSystem, ReducedPattern

TEMPLATE = "solvers/general/pair_schur_device.cl.mako"


def factors_on_device(runtime) -> bool:
    """Where sparse_schur's dense S is factorised: on GPUs on the device (no nf x nf matrix
    crosses to the host), on CPUs by LAPACK on the host, faster there than the OpenCL Cholesky."""
    return not runtime.info.is_cpu


class NoDevicePairSchur(ValueError):
    """The device reduction does not serve this problem (the message says why: a sparse reduced
    matrix, no fp64, a matrix larger than one device buffer); the host's
    (:class:`solvers.general.pair_schur.PairSchur`) does."""


class DevicePairSchur(PairReduction):
    """``W V^-1 W^T``, ``W V^-1 g_E`` and ``W^T y`` for one residual kind ``kind`` (a
    :class:`solvers.general.sparse_state._Kind` with an eliminated slot) on ``runtime``'s device.
    Raises :class:`NoDevicePairSchur` where :class:`PairSchur` should serve."""

    def __init__(self, kind, block, nf: int, ne_rows: int, runtime, mixed=False):
        """``mixed``: ``Options.mixed_precision_solves`` for :meth:`factor_solve`."""
        self.rt = rt = runtime
        self.mixed = mixed
        self.factor_note = ""          # how factor_solve factorises, beyond "dense Cholesky"
        if not rt.info.fp64:
            raise NoDevicePairSchur(f"{rt.info.name!r} has no fp64")
        if nf > limits.DENSE_FILL_MAX:
            raise NoDevicePairSchur(f"{nf} unknowns: more than a dense reduced matrix takes")
        C = kind.f_cols_full                          # (n, K) problem columns, -1 where constant
        self.obs, self.e, key, key_cols = observation_keys(kind, block, ne_rows)
        nk = key_cols.shape[0]
        self.nf, self.ne_rows = nf, ne_rows
        self.K, self.kE, self.R = C.shape[1], kind.e_free.size, kind.R
        pattern = ReducedPattern(key, self.e, nk, ne_rows,
                                 max_run=MAX_RUN_CPU if rt.info.is_cpu else MAX_RUN_GPU)
        # The kernels read the kind's Jacobians as they come, all n observations: the pattern's
        # observations (positions in the point-sorted valid ones) become positions in those.
        pattern.obs = self.obs[pattern.obs]
        # For W^T y on the host, per observation of the kind: its columns (constant entries and
        # observations of constant eliminated rows: a zero pad) and eliminated row.
        n = kind.e_rank.size
        self.cols_or_pad = np.where(C >= 0, C, nf)
        self.cols_or_pad[kind.e_rank < 0] = nf
        self.e_all = np.maximum(kind.e_rank, 0)
        # The entries the blocks give the problem's matrix (copies counted), as PairSchur counts.
        free = (key_cols >= 0).sum(axis=1)
        br, bc = pattern.block_row, pattern.block_col
        entries = int(np.sum(free[br] * free[bc] * np.where(br != bc, 2, 1)))
        if entries < limits.DENSE_FILL * nf * nf:
            raise NoDevicePairSchur(f"sparse: {pattern.nblocks} blocks of {self.K} x {self.K} in {nf} x {nf}")
        nv = self.nv = nk * self.K
        if max(nv * nv, nf * nf, nv * nf) * 8 > rt.info.max_alloc_bytes:
            raise NoDevicePairSchur(f"a {nv} x {nv} matrix of the keys' columns exceeds a device buffer")
        self.system = ReducedCameraSystem(rt, pattern, C=self.K, P=self.kE, R=self.R)
        # Each problem column's copies among the keys' columns (solvers.general.key_copies_device).
        self.copy_of = key_cols.ravel()                   # problem column of each key column
        self.copies = KeyCopies(rt, self.copy_of, nf, self.K, self.R)
        i32 = lambda a: arrays.to_device(rt, np.ascontiguousarray(a, np.int32))  # noqa: E731
        f64 = lambda size: arrays.scratch(rt, max(1, int(size)), np.float64)  # noqa: E731
        # The keys' matrix: reduced_blocks writes the same blocks at every call, the rest stays 0.
        self.A = arrays.zeros(rt, nv * nv, np.float64)
        self.zero_B = arrays.zeros(rt, nk * self.K * (self.K + 1) // 2, np.float64)
        self.zero_v = arrays.zeros(rt, nv, np.float64)    # Dc^2 and the rhs' gc
        self.flag = arrays.zeros(rt, 1, np.int32)
        self.red, self.rhs = f64(nf * nf), f64(nv)
        self.Jc, self.Jp = f64(n * self.R * self.K), f64(n * self.R * self.kE)
        self.Vinv, self.gp = f64(ne_rows * self.kE * self.kE), f64(ne_rows * self.kE)
        self.k = presets(get_program(TEMPLATE, rt, K=self.K, R=self.R), self)
        # The keys' blocks of F^T F (key_normal), over the pattern's observations in key order.
        self.normal = f64(nk * self.K * (self.K + 1) // 2)
        self.key_start = i32(pattern.group_start[pattern.cam_group])
        # The rows of F (n, R per observation) whose F^T F the keys' matrix holds: the rest
        # (observations of constant eliminated rows) is the caller's (covered_rows).
        self.covered = self.obs
        self.ls = arrays.work_group_size(rt, self.k["compress_rows"].kernel, 64 if rt.info.is_cpu else 256)
        self.description = f"keys' {nv} x {nv} matrix on {rt.info.name}"
        self.covers_rows = True
        self.factors = factors_on_device(rt)
        self.cholesky = None

    def _upload(self, dev, host):
        cl.enqueue_copy(self.rt.queue, dev.data, np.ascontiguousarray(host, np.float64), is_blocking=False)

    def prepare(self, F_full, E):
        """Per Jacobian: the kind's (n, R, K) and (n, R, kE) blocks (observations of constant
        eliminated rows: E zero)."""
        self.F, self.E = np.ascontiguousarray(F_full), np.ascontiguousarray(E)
        self._upload(self.Jc, self.F)
        self._upload(self.Jp, self.E)

    def covered_rows(self, offset: int) -> np.ndarray:
        """The rows of the problem's F (the kind's first at ``offset``) whose ``F^T F`` is part
        of :meth:`reduced_matrix` and :meth:`factor_solve`: every residual of an observation of an
        active eliminated row."""
        return (offset + self.covered[:, None] * self.R + np.arange(self.R)).ravel()

    def enqueue_keys(self, Vinv, with_normal=True):
        """Enqueue the keys' ``F^T F - W V^-1 W^T`` (``-W V^-1 W^T`` without ``with_normal``) for
        the blocks ``Vinv`` (ne_rows, kE, kE), and the groups' products that :meth:`w_times`
        reads."""
        rt = self.rt
        self._upload(self.Vinv, Vinv)
        cl.enqueue_copy(rt.queue, self.flag.data, np.zeros(1, np.int32), is_blocking=False)
        self.system.enqueue_groups(self.Jc, self.Jp, self.Vinv)
        B = self.zero_B
        if with_normal:
            self.k["key_normal"](rt.queue, (arrays.round_up(self.nv, self.ls),), (self.ls,),
                                 self.Jc.data, self.system.obs.data, self.key_start.data, self.normal.data,
                                 np.int32(self.nv // self.K))
            B = self.normal
        self.system.enqueue_dense(B, self.zero_v, self.A, self.nv, self.flag)

    def _compress(self, out, ld_out, lower, sign):
        self.copies.compress(self.A, out, ld_out, bool(lower), sign)

    def reduction(self, Vinv):
        """``(W V^-1 W^T, None)`` for the blocks ``Vinv`` (ne_rows, kE, kE): a dense (nf, nf)
        array (the second item stands for PairSchur's ``ZV``; :meth:`w_times` ignores it)."""
        self.enqueue_keys(Vinv, with_normal=False)
        self._compress(self.red, self.nf, 0, 1.0)
        out = np.empty((self.nf, self.nf))
        cl.enqueue_copy(self.rt.queue, out, self.red.data)
        return out, None

    def reduced_matrix(self, Vinv, FtF, d2):
        """``(S, None)``: the dense ``S = F^T F + diag(d2) - W V^-1 W^T`` on the host, where
        ``FtF`` (sparse, nf x nf) is ``F^T F`` of the rows outside :meth:`covered_rows` (the
        device has the rest) and ``d2`` (nf) the diagonal; ``FtF``'s entries are added where they
        are (a dense copy of it would cost a pass over nf^2 entries)."""
        self.enqueue_keys(Vinv)
        self._compress(self.red, self.nf, 0, -1.0)
        S = np.empty((self.nf, self.nf))
        cl.enqueue_copy(self.rt.queue, S, self.red.data)
        M = FtF.tocsr()
        M.sum_duplicates()
        rows = np.repeat(np.arange(self.nf), np.diff(M.indptr))
        S[rows, M.indices] += M.data
        S[np.arange(self.nf), np.arange(self.nf)] += d2
        return S, None

    def factor_solve(self, FtF, d2, b):
        """``(y, ok, message)``: ``y = (F^T F + diag(d2) - W V^-1 W^T)^-1 b`` assembled,
        factorised and solved on the device (:class:`solvers.linalg.dense_cholesky_device.DenseCholesky`), after
        :meth:`enqueue_keys`; ``FtF`` (scipy sparse) is ``F^T F`` of the rows outside
        :meth:`covered_rows`, ``d2`` and ``b`` host vectors (nf)."""
        from ..linalg.dense_cholesky_device import DenseCholesky
        from ..linalg.mixed_cholesky_device import MixedCholesky, choose_mixed
        rt, nf, q = self.rt, self.nf, self.rt.queue
        if not (np.all(np.isfinite(FtF.data)) and np.all(np.isfinite(b))):
            return None, False, MSG_NOT_FINITE
        if self.cholesky is None:
            mixed = choose_mixed(rt.info, nf, 0, self.mixed)
            self.cholesky = (MixedCholesky if mixed else DenseCholesky)(rt, nf)
            self.factor_note = " (float32, refined in float64)" if mixed else ""
            self.x = arrays.scratch(rt, max(1, nf), np.float64)
        dc = self.cholesky
        dc.clear()
        self._compress(dc.A, dc.m, 1, -1.0)
        M = FtF.tocsr()
        i32 = lambda a: np.ascontiguousarray(a, np.int32)  # noqa: E731
        parts = [arrays.to_device(rt, a) for a in (i32(M.indptr), i32(M.indices if M.nnz else [0]),
                                                  np.ascontiguousarray(M.data if M.nnz else [0.0], np.float64),
                                                  np.ascontiguousarray(d2, np.float64))]
        self.k["add_lower"](q, (arrays.round_up(nf, self.ls),), (self.ls,), dc.A.data, np.int32(dc.m),
                            *(p.data for p in parts), np.int32(nf))
        padded = np.zeros(dc.m)          # the whole of b: its padding too (zero)
        padded[:nf] = b
        cl.enqueue_copy(q, dc.b.data, padded)
        dc.factor()
        dc.solve(self.x)
        y = np.empty(nf)
        cl.enqueue_copy(q, y, self.x.data, is_blocking=False)
        flag = np.empty(1, np.int32)
        cl.enqueue_copy(q, flag, self.flag.data)
        if flag[0]:
            return None, False, MSG_NOT_FINITE
        if dc.failed():
            return None, False, MSG_NOT_PD
        return y, True, "Success."

    def w_times(self, ZV, u):
        """``W V^-1 u`` for a per-row vector ``u`` (ne_rows, kE) -> (nf,), with the ``V^-1`` of the
        last :meth:`enqueue_keys` (which :meth:`reduction` and :meth:`reduced_matrix` call)."""
        self._upload(self.gp, u)
        self.system.enqueue_rhs(self.zero_v, self.gp, self.rhs, self.flag)
        v = np.empty(self.nv)
        cl.enqueue_copy(self.rt.queue, v, self.rhs.data)
        # rhs = 0 - W V^-1 u over the keys' columns; each problem column sums its copies.
        return -sum_copies(self.copy_of, v, self.nf)

    def wt_times(self, y):
        """``W^T y`` per eliminated row (ne_rows, kE) for an F vector ``y`` (nf,)."""
        yp = np.append(y, 0.0)[self.cols_or_pad]                   # (m, K)
        t = np.einsum("nrk,nk->nr", self.F, yp)
        u = np.einsum("nre,nr->ne", self.E, t)
        out = np.zeros((self.ne_rows, self.kE))
        for k in range(self.kE):
            out[:, k] = np.bincount(self.e_all, weights=u[:, k], minlength=self.ne_rows)
        return out

    def close(self):
        release_kernels(self, self.system, self.copies)
        if self.cholesky is not None:
            self.cholesky.release()
