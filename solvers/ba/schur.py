"""Linear solvers for the Levenberg-Marquardt step of bundle adjustment, by the Schur complement.

The step solves ``(J^T J + D^2) y = J^T f`` for a Jacobian ``J = [F E]`` whose rows are observations,
``F`` the camera blocks (R x C per observation: 2x9 in BAL) and ``E`` the point blocks (R x P: 2x3).
With ``B = F^T F + Dc^2`` (block diagonal C x C per camera), ``V = E^T E + Dp^2`` (block diagonal
P x P per point) and ``W = F^T E`` (a C x P block per observation), eliminating the points gives the reduced
camera system ``S yc = gc - W V^-1 gp`` with ``S = B - W V^-1 W^T``; then ``yp = V^-1 (gp - W^T yc)``.

- ``sparse_schur``: ``S`` is assembled explicitly: one C x C product per pair of observations of the
  same point (pairs enumerated once per solve, sorted by their block of ``S``, summed with
  ``numpy.add.reduceat``), the block matrix built on a fixed pattern, then factorised by Cholesky
  (dense LAPACK while ``S`` is small, SuperLU on a symmetric ordering otherwise).
- ``iterative_schur``: preconditioned conjugate gradients on ``S`` applied implicitly
  (``S x = F^T (F x - E V^-1 E^T F x) + Dc^2 x`` with sparse matrix-vector products), with the
  Schur-Jacobi preconditioner (the inverse of the C x C diagonal blocks of ``S``); Ceres' CG with its
  Nash-Sofer quadratic-model termination.

Every block operation is batched over observations, points or pairs: no Python loop per point or
per observation (only a loop over chunks of pairs, to keep temporaries in cache). This module is
the numpy implementation; :mod:`solvers.ba.schur_device` runs the same per-observation and per-pair
products on an OpenCL device (the default when the device has fp64).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
# scipy is imported in the functions that use it: a solve that never comes here (the device
# path on a GPU) does not pay its import (~0.4 s).

from ..linalg.blas_threads import single_threaded_blas
from ..linalg.cg import conjugate_gradients
from ..linalg import factorisation_limits as limits
from ..linalg.linear_solver import linear_solver

PAIR_CHUNK = 1 << 12


def inv3_sym(m):
    """Inverses of symmetric 3x3 matrices (n, 3, 3) by cofactors (what Eigen's 3x3 inverse does);
    a singular block gives inf/NaN, which the caller detects as a failed step."""
    a, b, c = m[:, 0, 0], m[:, 0, 1], m[:, 0, 2]
    d, e, f = m[:, 1, 1], m[:, 1, 2], m[:, 2, 2]
    return _inv3(a, b, c, d, e, f, np.empty_like(m))


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
def _inv3(a, b, c, d, e, f, out):
    A = d * f - e * e
    B = c * e - b * f
    C = b * e - c * d
    inv_det = 1.0 / (a * A + b * B + c * C)
    out[:, 0, 0] = A * inv_det
    out[:, 0, 1] = out[:, 1, 0] = B * inv_det
    out[:, 0, 2] = out[:, 2, 0] = C * inv_det
    out[:, 1, 1] = (a * f - c * c) * inv_det
    out[:, 1, 2] = out[:, 2, 1] = (b * c - a * e) * inv_det
    out[:, 2, 2] = (a * d - b * b) * inv_det
    return out


class Structure:
    """What depends only on which camera and point each observation involves: computed once per
    solve. Observations must be sorted by point."""

    def __init__(self, cam_idx, pt_idx, num_cameras, num_points, C=9, P=3, R=2):
        """``C`` parameters per camera, ``P`` per point and ``R`` residuals per observation: BAL's
        9, 3 and 2 by default; any sizes work (a COLMAP camera model's, a general problem's)."""
        import scipy.sparse as sp
        cam = np.ascontiguousarray(cam_idx, dtype=np.int64)
        pt = np.ascontiguousarray(pt_idx, dtype=np.int64)
        if pt.size and np.any(pt[1:] < pt[:-1]):
            raise ValueError("observations must be sorted by point index")
        n, nc, npt = cam.size, int(num_cameras), int(num_points)
        self.cam, self.pt, self.n, self.nc, self.npt = cam, pt, n, nc, npt
        self.C, self.P, self.R = C, P, R
        # Sums over the observations of each camera: a sparse (nc x n) matrix of ones.
        self.cam_sum = sp.csr_matrix((np.ones(n), (cam, np.arange(n))), shape=(nc, n))
        # Sums over the observations of each point: reduceat over the observed points' segments.
        counts = np.bincount(pt, minlength=npt)
        self.pt_counts = counts
        self.observed_pts = np.flatnonzero(counts)
        self.pt_starts = np.concatenate(([0], np.cumsum(counts)[:-1]))[self.observed_pts]
        self.all_points_observed = self.observed_pts.size == npt
        self._pairs = None
        self._diag_pairs = None
        # Fixed CSR patterns of F (R n x C nc) and E (R n x P npt): row (o, k) holds its C (P) entries.
        self.F_indices = (np.repeat(cam * C, R * C).reshape(n, R, C) + np.arange(C)).ravel().astype(np.int32 if C * nc < 2**31 else np.int64)
        self.F_indptr = np.arange(0, R * C * n + 1, C, dtype=np.int64)
        self.E_indices = (np.repeat(pt * P, R * P).reshape(n, R, P) + np.arange(P)).ravel().astype(np.int32 if P * npt < 2**31 else np.int64)
        self.E_indptr = np.arange(0, R * P * n + 1, P, dtype=np.int64)

    def point_sum(self, x):
        """Sum of per-observation rows ``x`` (n, ...) over each point's observations -> (npt, ...)."""
        if self.n == 0:
            return np.zeros((self.npt,) + x.shape[1:])
        s = np.add.reduceat(x, self.pt_starts, axis=0)
        if self.all_points_observed:
            return s
        out = np.zeros((self.npt,) + x.shape[1:])
        out[self.observed_pts] = s
        return out

    def camera_sum(self, x):
        """Sum of per-observation rows ``x`` (n, ...) over each camera's observations -> (nc, ...)."""
        flat = x.reshape(self.n, -1)
        return np.asarray(self.cam_sum @ flat).reshape((self.nc,) + x.shape[1:])

    def pairs(self):
        """Pairs (o1, o2) of observations of the same point whose C x C product lands in the upper
        block triangle of S (camera o1 <= camera o2; both orders when the cameras are equal),
        sorted by block; with the blocks' (row, col) cameras and each block's first pair."""
        if self._pairs is None:
            self._pairs = enumerate_pairs(self.cam, self.pt, self.pt_counts, self.nc, diagonal_only=False)
        return self._pairs

    def diag_pairs(self):
        """As :meth:`pairs`, only the pairs that land on diagonal blocks (the preconditioner's)."""
        if self._diag_pairs is None:
            self._diag_pairs = enumerate_pairs(self.cam, self.pt, self.pt_counts, self.nc, diagonal_only=True)
        return self._diag_pairs


@dataclasses.dataclass
class Pairs:
    o1: np.ndarray
    o2: np.ndarray
    block_row: np.ndarray   # camera of each block's rows
    block_col: np.ndarray   # camera of each block's columns
    chunks: list            # (start, stop, local segment starts, block ids) per chunk of pairs
    pattern: Optional["_Pattern"] = None    # the reduced matrix's CSC pattern, made at first use


def enumerate_pairs(cam, pt, counts, nc, diagonal_only):
    """The :class:`Pairs` of observations sorted by point (``pt``, with ``counts`` per point)
    whose blocks ``(cam[o1], cam[o2])`` lie in the upper block triangle (both orders on the
    diagonal), for ``nc`` cameras (or any keys standing for them)."""
    n = cam.size
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    k = counts[pt]                                  # observations of each observation's point
    o1 = np.repeat(np.arange(n), k)
    first = np.repeat(starts[pt], k)
    within = np.arange(o1.size) - np.repeat(np.cumsum(k) - k, k)
    o2 = first + within
    c1, c2 = cam[o1], cam[o2]
    keep = (c1 == c2) if diagonal_only else (c1 <= c2)
    o1, o2, c1, c2 = o1[keep], o2[keep], c1[keep], c2[keep]
    block = c1 * nc + c2
    order = np.argsort(block, kind="stable")
    o1, o2, block = o1[order], o2[order], block[order]
    seg = np.flatnonzero(np.concatenate(([True], block[1:] != block[:-1]))) if block.size else np.zeros(0, np.int64)
    ublocks = block[seg]
    chunks = []
    for s in range(0, o1.size, PAIR_CHUNK):
        e = min(o1.size, s + PAIR_CHUNK)
        lo, hi = np.searchsorted(seg, s, side="right") - 1, np.searchsorted(seg, e, side="left")
        local = np.maximum(seg[lo:hi], s) - s
        chunks.append((s, e, local, np.arange(lo, hi)))
    return Pairs(o1, o2, ublocks // nc, ublocks % nc, chunks)


def sum_pair_products(pairs: Pairs, Z, W):
    """``sum over pairs in each block of Z[o1] W[o2]^T`` -> (num_blocks, a, b) for Z (n, a, k)
    and W (n, b, k) (9 x 9 for BAL's cameras)."""
    out = np.zeros((pairs.block_row.size, Z.shape[1], W.shape[1]))
    for s, e, local, blocks in pairs.chunks:
        a, b = pairs.o1[s:e], pairs.o2[s:e]
        prod = np.matmul(Z[a], W[b].transpose(0, 2, 1))
        out[blocks] += np.add.reduceat(prod, local, axis=0)
    return out


def spd_block_inverses(blocks):
    """Inverses of symmetric positive definite blocks (n, k, k) through their Cholesky factors,
    ``L^-T L^-1``; pseudo-inverses of all of them where one block is not positive definite."""
    with np.errstate(all="ignore"):
        try:
            Li = np.linalg.inv(np.linalg.cholesky(blocks))
            return np.matmul(Li.transpose(0, 2, 1), Li)
        except np.linalg.LinAlgError:
            return np.linalg.pinv(blocks, hermitian=True)


def _gram(A, B):
    """``A[n]^T B[n]`` for R-row blocks A (n, R, a), B (n, R, b) -> (n, a, b)."""
    return np.matmul(A.transpose(0, 2, 1), B)


def inv_sym(m):
    """Inverses of symmetric blocks (n, k, k): by cofactors for 3x3 (:func:`inv3_sym`), by LU
    otherwise; a singular block gives inf/NaN, which the caller detects as a failed step."""
    if m.shape[1:] == (3, 3):
        return inv3_sym(m)
    with np.errstate(all="ignore"):
        try:
            return np.linalg.inv(m)
        except np.linalg.LinAlgError:   # numpy refuses the whole batch: fail the step
            return np.full_like(m, np.nan)


def jt_r(J, r):
    """``J[n]^T r[n]`` for R-row blocks J (n, R, k) and r (n, R) -> (n, k)."""
    out = J[:, 0, :] * r[:, 0, None]
    for i in range(1, J.shape[1]):      # unrolled over the few rows: faster than einsum here
        out += J[:, i, :] * r[:, i, None]
    return out


def row_squares(J):
    """``sum over the rows of J[n] ** 2`` for J (n, R, k) -> (n, k): the squared column norms of
    each observation's block (the Jacobi scaling's sums)."""
    out = J[:, 0] ** 2
    for i in range(1, J.shape[1]):
        out += J[:, i] ** 2
    return out


def j_x(J, x):
    """``J[n] x[n]`` for J (n, R, k) and x (n, k) -> (n, R)."""
    return np.einsum("nij,nj->ni", J, x)   # 3x faster than matmul for these shapes


class NormalEquations:
    """The blocks of ``J^T J`` and ``J^T f`` for one (scaled, corrected) Jacobian, kept across the
    linear solves of rejected steps (only ``D`` changes between them)."""

    def __init__(self, st: Structure, r, Jc, Jp):
        self.st, self.r, self.Jc, self.Jp = st, r, Jc, Jp
        # Batched matmul: numpy's einsum is slower for these small shapes.
        self.B = st.camera_sum(_gram(Jc, Jc))                               # (nc, C, C)
        self.V = st.point_sum(_gram(Jp, Jp))                                # (npt, P, P)
        self.W = _gram(Jc, Jp)                                              # (n, C, P) = Jc^T Jp
        self.gc = st.camera_sum(jt_r(Jc, r))                                # (nc, C)
        self.gp = st.point_sum(jt_r(Jp, r))                                 # (npt, P)
        self._z_cache = self._z_for = None

    def column_norms2(self):
        """Squared column norms of J: the diagonal of J^T J, cameras then points."""
        return np.concatenate([np.einsum("cii->ci", self.B).ravel(), np.einsum("pii->pi", self.V).ravel()])

    def v_inverse(self, Dp2):
        Vd = self.V.copy()
        k = np.arange(self.st.P)
        Vd[:, k, k] += Dp2
        return inv_sym(Vd)

    def back_substitute(self, Vinv, yc):
        t = self.gp - self._wty(yc)
        return (Vinv * t[:, None, :]).sum(axis=2)

    # The three products a solve needs; numpy here, OpenCL in solvers.ba.schur_device.
    def _z(self, Vinv):
        """``Z = W V^-1`` per observation (n, C, P), kept for the solve using this ``Vinv``."""
        if self._z_for is not Vinv:
            self._z_cache, self._z_for = np.matmul(self.W, Vinv[self.st.pt]), Vinv
        return self._z_cache

    def _pair_sums(self, which, Vinv):
        """``sum over the pairs of each block of Z[o1] W[o2]^T`` -> (num_blocks, C, C), for the
        pairs of all blocks (``which="all"``, :meth:`Structure.pairs`) or of the diagonal ones
        (``"diag"``, :meth:`Structure.diag_pairs`)."""
        pairs = self.st.pairs() if which == "all" else self.st.diag_pairs()
        return sum_pair_products(pairs, self._z(Vinv), self.W)

    def _rhs(self, Vinv):
        """Reduced right-hand side ``gc - W V^-1 gp`` (nc, C)."""
        Z, g = self._z(Vinv), self.gp[self.st.pt]
        Zg = Z[:, :, 0] * g[:, 0, None]
        for i in range(1, Z.shape[2]):      # unrolled over the point's parameters
            Zg += Z[:, :, i] * g[:, i, None]
        return self.gc - self.st.camera_sum(Zg)

    def _wty(self, yc):
        """``W^T yc`` summed per point (npt, P)."""
        y = yc[self.st.cam]
        W = self.W
        Wty = W[:, 0, :] * y[:, 0, None]             # unrolled over the camera's parameters
        for i in range(1, W.shape[1]):
            Wty += self.W[:, i, :] * y[:, i, None]
        return self.st.point_sum(Wty)

    def solve(self, D, method="sparse_schur", eta=0.1, max_iterations=500, r_tolerance=-1.0):
        """Solve ``(J^T J + diag(D)^2) y = J^T f``; returns :class:`LinearSolution`. ``eta`` and
        ``r_tolerance`` are CG's quadratic-model and residual tolerances (iterative_schur; the LM
        step uses Ceres' choice: ``eta``, no residual test)."""
        st = self.st
        D2 = np.asarray(D, dtype=np.float64) ** 2
        C, P = st.C, st.P
        Dc2, Dp2 = D2[:C * st.nc].reshape(st.nc, C), D2[C * st.nc:].reshape(st.npt, P)
        Vinv = self.v_inverse(Dp2)
        entry = linear_solver(method)
        yc, ok, its, msg = entry.host.solve(self, entry, Vinv, Dc2, eta, max_iterations, r_tolerance)
        if not ok:
            return LinearSolution(None, False, its, msg)
        yp = self.back_substitute(Vinv, yc)
        y = np.concatenate([yc.ravel(), yp.ravel()])
        if not np.all(np.isfinite(y)):
            return LinearSolution(None, False, its, "Linear solver failure. Failed to compute a finite step.")
        return LinearSolution(y, True, its, msg)

    # ------------------------------------------------------------------ sparse_schur
    def reduced_camera_system(self, Vinv, Dc2):
        """sparse_schur's reduced camera system in parts: ``(blocks, diag, rhs)``, the pairs' blocks
        of S (``-sum Z W^T`` per block of :meth:`Structure.pairs`), ``B + Dc^2`` (nc, C, C) and
        ``gc - W V^-1 gp`` (nc * C); :meth:`dense_reduced_matrix` puts S together."""
        diag = self.B.copy()
        k = np.arange(self.st.C)
        diag[:, k, k] += Dc2
        return -self._pair_sums("all", Vinv), diag, self._rhs(Vinv).ravel()

    def dense_reduced_matrix(self, blocks, diag):
        """S (C nc x C nc) from :meth:`reduced_camera_system`'s blocks and diagonal."""
        return dense_reduced_matrix(self.st.pairs(), self.st.nc, blocks, diag)

    def solve_explicit(self, Vinv, Dc2, dense: bool = False):
        """The reduced camera system assembled and factorised (``dense``: by LAPACK at any size)."""
        return solve_reduced(self.st.pairs(), self.st.nc, *self.reduced_camera_system(Vinv, Dc2), dense=dense)

    # ------------------------------------------------------------------ iterative_schur
    def pcg_operator(self, Vinv, Dc2):
        """``(x -> S x, b)``: the implicit Schur complement ``F^T (I - E V^-1 E^T) F + Dc^2`` and the
        reduced right-hand side ``F^T (f - E V^-1 E^T f)``, by sparse matrix-vector products."""
        import scipy.sparse as sp
        st = self.st
        n = st.n
        C, P, R = st.C, st.P, st.R
        F = sp.csr_matrix((self.Jc.ravel(), st.F_indices, st.F_indptr), shape=(R * n, C * st.nc))
        E = sp.csr_matrix((self.Jp.ravel(), st.E_indices, st.E_indptr), shape=(R * n, P * st.npt))
        Ft, Et = F.T, E.T  # CSC views: transposed products without a conversion
        Vi = sp.bsr_matrix((Vinv, np.arange(st.npt), np.arange(st.npt + 1)), shape=(P * st.npt, P * st.npt))
        Vi = Vi.tocsr()
        dc2 = Dc2.ravel()

        def apply_S(x):
            t = F @ x
            return Ft @ (t - E @ (Vi @ (Et @ t))) + dc2 * x

        # Reduced right-hand side F^T (f - E V^-1 E^T f).
        f = self.r.ravel()
        return apply_S, Ft @ (f - E @ (Vi @ (Et @ f)))

    def diagonal_pair_sums(self, Vinv):
        """The pairs' sums of S's diagonal blocks (nc, C, C); zero for unobserved cameras."""
        out = np.zeros((self.st.nc, self.st.C, self.st.C))
        out[self.st.diag_pairs().block_row] = self._pair_sums("diag", Vinv)
        return out

    def _schur_jacobi(self, Vinv, Dc2):
        """The Schur-Jacobi preconditioner: inverses of the diagonal C x C blocks of S (nc, C, C)."""
        Sd = self.B - self.diagonal_pair_sums(Vinv)
        k = np.arange(self.st.C)
        Sd[:, k, k] += Dc2
        return spd_block_inverses(Sd)

    def solve_pcg(self, Vinv, Dc2, eta, max_iterations, r_tolerance):
        """iterative_schur: the implicit Schur complement by preconditioned CG."""
        import scipy.sparse as sp
        st = self.st
        apply_S, b = self.pcg_operator(Vinv, Dc2)
        Pinv = self._schur_jacobi(Vinv, Dc2)
        C = st.C
        P = sp.bsr_matrix((Pinv, np.arange(st.nc), np.arange(st.nc + 1)), shape=(C * st.nc, C * st.nc)).tocsr()
        x, ok, its, msg = conjugate_gradients(apply_S, b, lambda v: P @ v, q_tolerance=eta,
                                              r_tolerance=r_tolerance, max_iterations=max_iterations)
        return (x.reshape(st.nc, C) if x is not None else None), ok, its, msg


def dense_reduced_matrix(pairs: Pairs, nc: int, blocks, diag):
    """S (C nc x C nc) from the upper-triangle pair blocks (``pairs``' block rows and columns)
    and the diagonal blocks ``diag`` (nc, C, C)."""
    C = diag.shape[1]
    S = np.zeros((nc, C, nc, C))
    ci = np.arange(nc)
    S[ci, :, ci, :] = diag
    off = pairs.block_row != pairs.block_col
    S[pairs.block_row, :, pairs.block_col, :] += blocks
    S[pairs.block_col[off], :, pairs.block_row[off], :] += blocks[off].transpose(0, 2, 1)
    return S.reshape(C * nc, C * nc)


def solve_reduced(pairs: Pairs, nc: int, blocks, diag, rhs, dense: bool = False):
    """Solve the reduced camera system ``S yc = rhs`` (S from ``pairs``' blocks and ``diag``,
    as :func:`dense_reduced_matrix`) -> ``(yc (nc, C), ok, iterations, message)``: dense
    Cholesky (LAPACK) where factorisation_limits.host_dense says (``dense``: always), else
    SuperLU's LDL^T with a symmetric ordering."""
    import scipy.linalg
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla
    if not np.all(np.isfinite(blocks)) or not np.all(np.isfinite(diag)) or not np.all(np.isfinite(rhs)):
        return None, False, 1, "Linear solver failure: non-finite reduced camera matrix."
    C = diag.shape[1]
    if limits.host_dense(C * nc, forced=dense):
        S = dense_reduced_matrix(pairs, nc, blocks, diag)
        try:
            with single_threaded_blas():
                factor = scipy.linalg.cho_factor(S, lower=False, check_finite=False)
                y = scipy.linalg.cho_solve(factor, rhs, check_finite=False)
        except np.linalg.LinAlgError:
            return None, False, 1, "Linear solver failure: the reduced camera matrix is not positive definite."
        return y.reshape(nc, C), True, 1, "Success."
    pat = _reduced_pattern(pairs, nc, C)
    blk = blocks.copy()
    blk[pat.diag_blocks] += diag[pat.diag_cams]
    full = np.concatenate([blk, diag[pat.lonely_cams], blk[pat.off].transpose(0, 2, 1)])
    S = sp.csc_matrix((full.ravel()[pat.perm], pat.indices, pat.indptr), shape=(C * nc, C * nc))
    try:
        lu = spla.splu(S, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                       options={"SymmetricMode": True})
    except RuntimeError as e:
        return None, False, 1, f"Linear solver failure: {e}"
    # With a symmetric ordering and no pivoting, U's diagonal holds the pivots of an LDL^T
    # factorisation: all positive iff S is positive definite (what a Cholesky would check).
    if not np.all(lu.U.diagonal() > 0):
        return None, False, 1, "Linear solver failure: the reduced camera matrix is not positive definite."
    return lu.solve(rhs).reshape(nc, C), True, 1, "Success."


@dataclasses.dataclass
class _Pattern:
    diag_blocks: np.ndarray     # pair blocks on the diagonal
    diag_cams: np.ndarray       # their cameras
    lonely_cams: np.ndarray     # cameras without a diagonal pair block (unobserved)
    off: np.ndarray             # off-diagonal pair blocks (mirrored below the diagonal)
    perm: np.ndarray            # CSC data order from the blocks' flattened entries
    indices: np.ndarray
    indptr: np.ndarray


def _reduced_pattern(pairs: Pairs, nc: int, C: int) -> _Pattern:
    """The CSC pattern of the reduced camera matrix, computed once per solve (cached on ``pairs``):
    afterwards every assembly is one gather of the blocks' entries."""
    pat = pairs.pattern
    if pat is None:
        is_diag = pairs.block_row == pairs.block_col
        diag_blocks = np.flatnonzero(is_diag)
        diag_cams = pairs.block_row[diag_blocks]
        lonely = np.setdiff1d(np.arange(nc), diag_cams)
        off = np.flatnonzero(~is_diag)
        rows = np.concatenate([pairs.block_row, lonely, pairs.block_col[off]])
        cols = np.concatenate([pairs.block_col, lonely, pairs.block_row[off]])
        r = (rows[:, None, None] * C + np.arange(C)[None, :, None]).repeat(C, axis=2).ravel()
        c = (cols[:, None, None] * C + np.arange(C)[None, None, :]).repeat(C, axis=1).ravel()
        order = np.lexsort((r, c))                     # column-major: CSC order
        indptr = np.concatenate(([0], np.cumsum(np.bincount(c, minlength=C * nc))))
        pat = _Pattern(diag_blocks, diag_cams, lonely, off, order, r[order].astype(np.int32), indptr.astype(np.int32))
        pairs.pattern = pat
    return pat


@dataclasses.dataclass
class LinearSolution:
    y: Optional[np.ndarray]
    ok: bool
    iterations: int
    message: str
