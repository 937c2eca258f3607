"""The Schur complement's reduction ``W V^-1 W^T`` of the general core by pairs of observations,
blocked as Ceres' SCHUR solvers block it, instead of by scipy's scalar sparse products.

It serves problems where one residual kind touches the eliminated group (a COLMAP
reconstruction: poses, intrinsics and points). Observations are keyed by the tuple of their
non-eliminated rows (for COLMAP: the image, which fixes the camera); every pair of observations
of one eliminated row adds ``Z_o1 V_p^-1 Z_o2^T`` (``Z_o = F_o^T E_o``, K x K with K the kind's
non-eliminated entries) to the block of their two keys. The pairs are enumerated and grouped by
block once (:func:`solvers.ba.schur.enumerate_pairs`); per solve the products are batched matrix
products summed per block (:func:`solvers.ba.schur.sum_pair_products`), and the blocks land in the
reduced matrix through an index computed once.
"""
from __future__ import annotations

import numpy as np
# scipy is imported in the functions that use it: a solve that never comes here (the device
# path on a GPU) does not pay its import (~0.4 s).

from ..linalg import factorisation_limits as limits
from ..ba import ordering
from ..ba.schur import enumerate_pairs, sum_pair_products


# The block-to-matrix index costs about 40 bytes per entry of every block: above this many
# entries the general core keeps scipy's products (PairSchur raises TooLarge).
MAX_BLOCK_ENTRIES = 1 << 26


class TooLarge(MemoryError):
    """The pairs' blocks would need more index memory than :data:`MAX_BLOCK_ENTRIES` allows."""


class PairReduction:
    """What :class:`solvers.general.sparse_state.SparseState` asks of every Schur reduction of one
    residual kind (:class:`PairSchur` on the host, ``DevicePairSchur`` and ``DeviceImplicitSchur``
    on the device), with the host's answers; a device reduction declares its own."""

    implicit = False        # S is applied, never formed (the state's CG calls apply())
    factors = False         # S is factorised where it is reduced (factor_solve())
    covers_rows = False     # it holds F^T F of its kind's rows (covered_rows() names them)
    description = ""        # for the report: where the reduction runs

    def close(self):
        """The solve is over: device resources go back (nothing to give back on the host)."""


class PairSchur(PairReduction):
    """``W V^-1 W^T``, ``W V^-1 g_E`` and ``W^T y`` for one residual kind ``kind``
    (a :class:`solvers.general.sparse_state._Kind` with an eliminated slot)."""

    def __init__(self, kind, block, nf: int, ne_rows: int):
        C = kind.f_cols_full                         # (n, K) tangent columns, -1 where constant
        self.obs, e, key, key_cols = observation_keys(kind, block, ne_rows)
        nk = key_cols.shape[0]
        self.e = e
        self.nf, self.ne_rows = nf, ne_rows
        self.cols = C[self.obs]                      # (m, K)
        self.cols_or_pad = np.where(self.cols >= 0, self.cols, nf)    # -1 -> a zero pad entry
        counts = np.bincount(e, minlength=ne_rows)
        self.pairs = enumerate_pairs(key, e, counts, nk, diagonal_only=False)
        K = C.shape[1]
        if self.pairs.block_row.size * K * K * 2 > MAX_BLOCK_ENTRIES:
            raise TooLarge(f"{self.pairs.block_row.size} blocks of {K} x {K}")
        # Where every block's entries go in the reduced matrix (upper blocks, and the strictly
        # upper ones mirrored), summed where keys share columns (shared intrinsics).
        br, bc = self.pairs.block_row, self.pairs.block_col
        rows = np.repeat(key_cols[br][:, :, None], K, axis=2)       # (nb, K, K)
        cols = np.repeat(key_cols[bc][:, None, :], K, axis=1)
        src = np.arange(br.size * K * K).reshape(br.size, K, K)
        off = br != bc
        r = np.concatenate([rows.ravel(), cols[off].ravel()])
        c = np.concatenate([cols.ravel(), rows[off].ravel()])
        s = np.concatenate([src.ravel(), src[off].ravel()])
        keep = (r >= 0) & (c >= 0)
        r, c, self.src = r[keep], c[keep], s[keep]
        lin = r.astype(np.int64) * nf + c
        # Where the reduced matrix is (nearly) dense, as in most reconstructions whose images
        # share points widely, it is assembled and factorised dense.
        self.dense = nf <= limits.DENSE_FILL_MAX and lin.size >= limits.DENSE_FILL * nf * nf
        if self.dense:
            self.lin = lin
            return
        uniq_lin, self.slot = unique_inverse(lin, nf * nf)
        ur, uc = uniq_lin // nf, uniq_lin % nf
        self.indices = uc.astype(np.int32)
        self.indptr = np.concatenate([[0], np.cumsum(np.bincount(ur, minlength=nf))]).astype(np.int64)
        self.nnz = uniq_lin.size

    def prepare(self, F_full, E):
        """Per Jacobian: ``Z_o = F_o^T E_o`` from the kind's (n, R, K) and (n, R, kE) blocks."""
        self.Z = np.einsum("nrk,nre->nke", F_full[self.obs], E[self.obs])

    def reduction(self, Vinv):
        """``(W V^-1 W^T, ZV)`` for the blocks ``Vinv`` (ne_rows, kE, kE): a CSR matrix, or a
        dense (nf, nf) array where :attr:`dense`."""
        import scipy.sparse as sp
        ZV = np.matmul(self.Z, Vinv[self.e])
        blocks = sum_pair_products(self.pairs, ZV, self.Z)
        if self.dense:
            flat = np.bincount(self.lin, weights=blocks.ravel()[self.src], minlength=self.nf * self.nf)
            return flat.reshape(self.nf, self.nf), ZV
        data = np.bincount(self.slot, weights=blocks.ravel()[self.src], minlength=self.nnz)
        return sp.csr_matrix((data, self.indices, self.indptr), shape=(self.nf, self.nf)), ZV

    def reduced_matrix(self, Vinv, FtF, d2):
        """``(S, ZV)``: ``S = FtF + diag(d2) - W V^-1 W^T`` (dense where :attr:`dense`, else CSR)
        for the sparse ``FtF`` (nf x nf) and the diagonal ``d2`` (nf)."""
        import scipy.sparse as sp
        red, ZV = self.reduction(Vinv)
        if self.dense:
            S = FtF.toarray()
            S -= red
            S[np.arange(self.nf), np.arange(self.nf)] += d2
            return S, ZV
        return (FtF - red + sp.diags(d2)).tocsr(), ZV

    def w_times(self, ZV, u):
        """``W V^-1 u`` for a per-row vector ``u`` (ne_rows, kE) -> (nf,)."""
        t = np.einsum("nke,ne->nk", ZV, u[self.e])
        return np.bincount(self.cols_or_pad.ravel(), weights=t.ravel(), minlength=self.nf + 1)[:self.nf]

    def wt_times(self, y):
        """``W^T y`` per eliminated row (ne_rows, kE) for an F vector ``y`` (nf,)."""
        yp = np.append(y, 0.0)[self.cols_or_pad]                  # (m, K)
        t = np.einsum("nke,nk->ne", self.Z, yp)
        out = np.zeros((self.ne_rows, t.shape[1]))
        for k in range(t.shape[1]):
            out[:, k] = np.bincount(self.e, weights=t[:, k], minlength=self.ne_rows)
        return out


def observation_keys(kind, block, ne_rows: int):
    """The kind's observations of active eliminated rows and their keys, which both pair
    reductions group by: ``(obs, e, key, key_cols)``, the observations (positions in the kind)
    sorted by eliminated row ``e`` (stable), each one's key numbered from 0 (the tuple of its
    non-eliminated rows; for COLMAP: the image), and each key's problem columns (nk, K), -1
    where constant."""
    obs = np.flatnonzero(kind.e_rank >= 0)
    e = kind.e_rank[obs]
    order = ordering.stable_order(e, ne_rows)
    obs, e = obs[order], e[order]
    # One integer per observation for the tuple of its rows, while the combinations fit one.
    tuple_id = np.zeros(block.num_blocks, np.int64)
    span = 1
    for j, _ in kind.f_slots:
        rows = block.groups[j].num_rows
        if span * rows >= 2 ** 62:
            tuple_id = np.unique(kind.f_cols_full, axis=0, return_inverse=True)[1].ravel()
            span = block.num_blocks
            break
        tuple_id = tuple_id * rows + block.columns[j]
        span *= rows
    uniq, key = unique_inverse(tuple_id[obs], span)
    key = key.astype(np.int64)
    first = np.zeros(uniq.size, np.int64)
    first[key[::-1]] = np.arange(key.size)[::-1]       # an observation of each key
    return obs, e, key, kind.f_cols_full[obs[first]]


def sum_copies(copy_of, values, nf: int) -> np.ndarray:
    """Per problem column (nf), the sum of ``values`` over its copies among the keys' columns
    (``copy_of``: each key column's problem column, -1 for a constant entry)."""
    keep = copy_of >= 0
    return np.bincount(copy_of[keep], weights=np.ravel(values)[keep], minlength=nf)[:nf]


def unique_inverse(lin, bound):
    """``np.unique(lin, return_inverse=True)`` for values in ``[0, bound)`` (the inverse as int32
    or int64): by a marker array (no sort) while ``bound`` is small enough, absolutely and next to
    the number of values, else by numpy's sort."""
    lin = np.asarray(lin)
    if bound <= 1 << 28 and bound <= 64 * max(1, lin.size):
        mark = np.zeros(bound, np.bool_)
        mark[lin] = True
        uniq = np.flatnonzero(mark)
        del mark
        rank = np.zeros(bound, np.int32)
        rank[uniq] = np.arange(uniq.size, dtype=np.int32)
        return uniq, rank[lin]
    uniq, inv = np.unique(lin, return_inverse=True)
    return uniq, inv.ravel()
