"""Host factorisations of a symmetric positive definite block matrix given by its nonzero C x C
blocks (a <= b, as :class:`solvers.linalg.schur_reduced_device.ReducedPattern` lists them): the reduced camera
matrix when the device does not factorise it itself.

- ``cholmod``: CHOLMOD's supernodal Cholesky (scikit-sparse, built against SuiteSparse; what
  Ceres uses): the fill-reducing ordering and symbolic analysis once per pattern, a numeric
  factorisation per matrix.
- ``cholespy``: the CHOLMOD that the cholespy wheel ships, analysed anew for every matrix (its
  interface keeps no symbolic factor).
- ``superlu``: scipy's SuperLU on a symmetric ordering without pivoting; always installed.
- ``lapack``: a dense Cholesky (LAPACK on one thread, see :mod:`solvers.linalg.blas_threads`) of the
  scattered blocks, what :mod:`solvers.ba.schur` does up to its ``DENSE_MAX`` unknowns.

On the BAL reduced camera matrices (144-657 unknowns, 70-100 % of the blocks nonzero) CHOLMOD was
the fastest sparse factorisation at every size, 1.4-4x faster than SuperLU and 2-4x faster than
cholespy, and the dense LAPACK Cholesky faster than all three (README, "sparse_schur on the
device"). :data:`SPARSE_PREFERENCE` is that order; SuperLU is only the fallback where neither
CHOLMOD nor cholespy is installed.
"""
from __future__ import annotations

import contextlib
import importlib.util

import numpy as np
# scipy is imported in the functions that use it: a solve that never comes here (the device
# path on a GPU) does not pay its import (~0.4 s).

from .blas_threads import single_threaded_blas

SPARSE_PREFERENCE = ("cholmod", "cholespy", "superlu")
LABELS = {"cholmod": "sparse Cholesky (CHOLMOD)", "cholespy": "sparse Cholesky (cholespy)",
          "superlu": "sparse LDL^T (SuperLU)", "lapack": "dense Cholesky (LAPACK)"}
_MODULES = {"cholmod": "sksparse.cholmod", "cholespy": "cholespy", "superlu": "scipy.sparse.linalg",
            "lapack": "scipy.linalg"}


# The general core's failures of a factorisation, on the host or on the device (its messages).
MSG_NOT_FINITE = "Linear solver failure: non-finite matrix."
MSG_NOT_PD = "Linear solver failure: the matrix is not positive definite."


class NotPositiveDefinite(ArithmeticError):
    """The matrix is not (numerically) positive definite."""


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(_MODULES[name]) is not None
    except ImportError:
        return False


def best_sparse() -> str:
    """The fastest sparse factoriser installed here."""
    return next(name for name in SPARSE_PREFERENCE if installed(name))


# Up to this many unknowns a dense Cholesky is fastest on one BLAS thread; above, on every core.
SINGLE_THREAD_MAX = 1000


def lapack_cholesky(M, overwrite: bool = False, single_thread=None):
    """LAPACK's Cholesky of the dense symmetric ``M`` (``scipy.linalg.cho_factor`` form, for
    ``cho_solve``); raises :class:`NotPositiveDefinite`. ``single_thread``: small matrices factorise
    fastest on one BLAS thread (:mod:`solvers.linalg.blas_threads`), large ones on every core; None
    decides by size (:data:`SINGLE_THREAD_MAX`)."""
    import scipy.linalg
    if single_thread is None:
        single_thread = M.shape[0] <= SINGLE_THREAD_MAX
    try:
        with single_threaded_blas() if single_thread else contextlib.nullcontext():
            return scipy.linalg.cho_factor(M, lower=True, overwrite_a=overwrite, check_finite=False)
    except np.linalg.LinAlgError as e:
        raise NotPositiveDefinite(str(e)) from None


def lapack_solve(factor, b, single_thread: bool = False):
    """``M^-1 b`` from :func:`lapack_cholesky`'s ``factor`` of ``M`` (LAPACK's triangular solves).
    scipy.linalg is imported here, at the first host factorisation, so that paths that factorise
    on the device never load it (0.03 s on top of scipy.sparse's import on a 2-core CPU)."""
    import scipy.linalg
    with single_threaded_blas() if single_thread else contextlib.nullcontext():
        return scipy.linalg.cho_solve(factor, np.asarray(b, dtype=np.float64), check_finite=False)


def cholmod_cholesky(A, factor=None):
    """CHOLMOD's supernodal Cholesky of the symmetric CSC matrix ``A`` (it reads the lower
    triangle), into ``factor`` (the symbolic analysis of ``A``'s pattern; made when None);
    returns the factor (``solve_A``); raises :class:`NotPositiveDefinite`."""
    from sksparse.cholmod import CholmodNotPositiveDefiniteError, analyze
    if factor is None:
        factor = analyze(A, mode="supernodal")
    try:
        factor.cholesky_inplace(A)
    except CholmodNotPositiveDefiniteError as e:
        raise NotPositiveDefinite(str(e)) from None
    return factor


def superlu_ldlt(A):
    """SuperLU of the symmetric CSC matrix ``A`` on a symmetric ordering without pivoting, an
    LDL^T in effect (``solve``); raises :class:`NotPositiveDefinite`."""
    import scipy.sparse.linalg as spla
    try:
        lu = spla.splu(A, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0, options={"SymmetricMode": True})
    except RuntimeError as e:
        raise NotPositiveDefinite(str(e)) from None
    # With a symmetric ordering and no pivoting U's diagonal holds LDL^T's pivots: all positive
    # iff the matrix is positive definite (solvers/ba/schur.py's test).
    if not np.all(lu.U.diagonal() > 0):
        raise NotPositiveDefinite("a pivot is not positive")
    return lu


class _BlockEntries:
    """Where each entry of the blocks goes in the full matrix: the lower triangle only
    (``lower``) or both, in CSC order (columns, then rows), with the blocks' flat index."""

    def __init__(self, block_row, block_col, nc, C, lower):
        a = np.asarray(block_row, dtype=np.int64)
        b = np.asarray(block_col, dtype=np.int64)
        i, shape = np.arange(C), (a.size, C, C)
        # Entry (i, j) of block (a, b) is S[C a + i, C b + j]; an off-diagonal block's mirror is
        # S[C b + j, C a + i].
        rows = np.broadcast_to(C * a[:, None, None] + i[None, :, None], shape)
        cols = np.broadcast_to(C * b[:, None, None] + i[None, None, :], shape)
        src = np.arange(a.size * C * C).reshape(shape)
        keep_mirror = np.broadcast_to((a != b)[:, None, None], shape)
        # The lower triangle: the off-diagonal blocks' mirrors and the diagonal blocks' lower half.
        keep_direct = ~keep_mirror & (rows >= cols) if lower else np.ones(shape, bool)
        r = np.concatenate([rows[keep_direct], cols[keep_mirror]])
        c = np.concatenate([cols[keep_direct], rows[keep_mirror]])
        s = np.concatenate([src[keep_direct], src[keep_mirror]])
        order = np.lexsort((r, c))
        self.n = C * int(nc)
        self.rows, self.cols, self.source = r[order], c[order], s[order]

    def values(self, blocks):
        return np.asarray(blocks, dtype=np.float64).reshape(-1)[self.source]


class _SparseFactoriser(_BlockEntries):
    def __init__(self, block_row, block_col, nc, C, lower):
        super().__init__(block_row, block_col, nc, C, lower)
        self.indices = self.rows.astype(np.int32)
        self.indptr = np.concatenate(([0], np.cumsum(np.bincount(self.cols, minlength=self.n)))).astype(np.int32)
        self._S = None

    def matrix(self, blocks):
        """The CSC matrix of these blocks (the same object every call, its data replaced)."""
        import scipy.sparse as sp
        data = self.values(blocks)
        if self._S is None:
            self._S = sp.csc_matrix((data, self.indices, self.indptr), shape=(self.n, self.n))
        else:
            self._S.data[:] = data
        return self._S


class Cholmod(_SparseFactoriser):
    name = "cholmod"

    def __init__(self, block_row, block_col, nc, C):
        super().__init__(block_row, block_col, nc, C, lower=True)   # CHOLMOD reads the lower triangle
        self._factor = None

    def factor(self, blocks):
        self._factor = cholmod_cholesky(self.matrix(blocks), self._factor)

    def solve(self, rhs):
        return self._factor.solve_A(np.asarray(rhs, dtype=np.float64))


class Cholespy(_SparseFactoriser):
    name = "cholespy"

    def __init__(self, block_row, block_col, nc, C):
        super().__init__(block_row, block_col, nc, C, lower=False)
        self._solver = None

    def factor(self, blocks):
        import cholespy
        S = self.matrix(blocks)
        try:
            self._solver = cholespy.CholeskySolverD(self.n, self.indptr, self.indices, S.data,
                                                    cholespy.MatrixType.CSC)
        except (ValueError, RuntimeError) as e:
            raise NotPositiveDefinite(str(e)) from None

    def solve(self, rhs):
        b = np.ascontiguousarray(rhs, dtype=np.float64)
        x = np.empty_like(b)
        self._solver.solve(b, x)
        return x


class SuperLU(_SparseFactoriser):
    name = "superlu"

    def __init__(self, block_row, block_col, nc, C):
        super().__init__(block_row, block_col, nc, C, lower=False)
        self._lu = None

    def factor(self, blocks):
        self._lu = superlu_ldlt(self.matrix(blocks))

    def solve(self, rhs):
        return self._lu.solve(np.asarray(rhs, dtype=np.float64))


class Lapack(_BlockEntries):
    name = "lapack"

    def __init__(self, block_row, block_col, nc, C):
        super().__init__(block_row, block_col, nc, C, lower=True)
        self._flat = self.rows * self.n + self.cols
        self._S = np.zeros((self.n, self.n))
        self._factor = None

    def factor(self, blocks):
        self._S.ravel()[self._flat] = self.values(blocks)
        self._factor = lapack_cholesky(self._S)

    def solve(self, rhs):
        return lapack_solve(self._factor, rhs, single_thread=True)


_CLASSES = {"cholmod": Cholmod, "cholespy": Cholespy, "superlu": SuperLU, "lapack": Lapack}


def make_factoriser(block_row, block_col, nc, C=9, name="sparse"):
    """A factoriser of this block pattern: ``factor(blocks)`` (raises :class:`NotPositiveDefinite`),
    then ``solve(rhs)``. ``name``: one of :data:`LABELS`, or "sparse" for :func:`best_sparse`."""
    if name == "sparse":
        name = best_sparse()
    if name not in _CLASSES:
        raise ValueError(f"unknown host factoriser {name!r}; one of {tuple(_CLASSES)}")
    return _CLASSES[name](block_row, block_col, nc, C)
