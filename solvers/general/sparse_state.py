"""Levenberg-Marquardt's vectors and linear algebra on the host for any :class:`solvers.Problem`:
several residual kinds, several groups per residual, constant rows and entries, any block sizes.

It has the methods of :class:`solvers.ba.host_state.HostState`, so :class:`solvers.loop.lm.Minimizer`
drives it with Ceres' semantics unchanged. The Jacobian is a scipy CSR matrix over the tangent
columns, split as ``J = [F | E]`` with ``E`` the eliminated group's columns (block diagonal in
``E^T E``, since no residual block touches two of its rows).

- ``sparse_schur``: the reduced matrix ``S = F^T F + D_F^2 - F^T E V^-1 E^T F`` (``V = E^T E +
  D_E^2``, inverted block by block) is formed and factorised (CHOLMOD where installed, a dense
  LAPACK Cholesky while small, SuperLU otherwise); the eliminated step follows by
  back-substitution.
- ``iterative_schur``: CG on the same ``S``, preconditioned by the inverses of its diagonal blocks
  (one per row of every group: Ceres' SCHUR_JACOBI). With an fp64 OpenCL device ``S`` is not
  formed: the device applies it (:mod:`solvers.general.implicit_schur_device`).
- ``sparse_normal_cholesky`` (nothing eliminated): ``J^T J + D^2`` factorised as above.
"""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from ..linalg.cg import norm, conjugate_gradients
from ..linalg.linear_solver import linear_solver
from ..linalg.host_cholesky import (LABELS, MSG_NOT_FINITE, MSG_NOT_PD, NotPositiveDefinite, cholmod_cholesky,
                                    installed, lapack_cholesky, lapack_solve, superlu_ldlt)
from ..loop.step import LoopState, StepSolution
from ..linalg import factorisation_limits as limits
from ..ba.schur import spd_block_inverses


class _Kind:
    """Where one residual kind's Jacobian entries go: per block, the F columns of its free
    entries (from every non-eliminated slot; constant entries have none) and its E row."""

    def __init__(self, block, layout):
        n = block.num_blocks
        self.n, self.R = n, block.num_residuals
        self.f_slots, self.e_slot = [], None
        cols = []
        for j, g in enumerate(block.groups):
            gl = layout.by_name[g.name]
            if g.name == layout.eliminated:
                self.e_slot = j
                self.e_rank = gl.rank[block.columns[j]]
                self.e_free = gl.free
                continue
            if gl.t_size == 0:
                continue
            t = gl.tangent[block.columns[j]]                 # (n, size)
            used = np.flatnonzero((t >= 0).any(axis=0))       # columns free in some row
            cols.append(t[:, used])
            self.f_slots.append((j, used))
        if cols:
            c = np.concatenate(cols, axis=1)
            keep = c >= 0
            self.all_kept = bool(keep.all())
            self.f_cols_full, self.f_keep = c, keep
            per_block = keep.sum(axis=1)
            # Every residual row of a block has the same columns.
            self.keep = None if self.all_kept else np.repeat(keep[:, None, :], self.R, axis=1)
            per_row = np.repeat(c[:, None, :], self.R, axis=1)
            self.f_indices = (per_row.ravel() if self.all_kept else per_row[self.keep]).astype(np.int32)
            self.row_nnz = np.repeat(per_block, self.R)
        else:
            self.all_kept, self.keep = True, None
            self.f_cols_full = self.f_keep = None
            self.f_indices = np.zeros(0, np.int32)
            self.row_nnz = np.zeros(n * self.R, np.int64)

    def f_full(self, jacs):
        """(n, R, K): every non-eliminated slot's entries that are free in some row."""
        return np.concatenate([jacs[j][:, :, used] for j, used in self.f_slots], axis=2)

    def f_values(self, jacs, full=None):
        """The CSR values of F (constant entries left out)."""
        if not self.f_slots:
            return np.zeros(0)
        v = self.f_full(jacs) if full is None else full
        return v.ravel() if self.all_kept else v[self.keep]

    def e_values(self, jacs):
        """(n, R, kE) with inactive rows' entries zero."""
        v = jacs[self.e_slot][:, :, self.e_free]
        return v * (self.e_rank >= 0)[:, None, None]


def _index(indptr):
    """A CSR indptr as int32 where its entries fit, else int64."""
    return indptr.astype(np.int32 if indptr[-1] < 2 ** 31 else np.int64)


class SparseState(LoopState):
    """See the module docstring; same methods and results as ``HostState``."""

    where = "host"

    def __init__(self, evaluator, options, x0, runtime=None):
        self.ev, self.o = evaluator, options
        self.layout = lay = evaluator.layout
        self.kinds = [_Kind(b, lay) for b in evaluator.problem.residuals]
        self.nf = lay.num_f
        e = lay.by_name.get(lay.eliminated) if lay.eliminated else None
        self.ne_rows = e.rows.size if e is not None else 0
        self.ke = e.free.size if e is not None else 0
        self.ne = self.ne_rows * self.ke
        # CSR structure of F (rows: every kind's residuals in turn) and of E.
        # 32-bit index arrays where the entries allow: scipy gives a matrix the wider of its two
        # index types, so an int64 indptr beside int32 indices would copy the indices at every
        # Jacobian (29 ms at 144,000 observations).
        self.f_indptr = _index(np.concatenate([[0], np.cumsum(np.concatenate([k.row_nnz for k in self.kinds]))]))
        self.f_indices = np.concatenate([k.f_indices for k in self.kinds])
        self.m = sum(k.n * k.R for k in self.kinds)
        if self.ne:
            e_ind, e_ptr, offs = [], [np.zeros(1, np.int64)], 0
            for k in self.kinds:
                per = self.ke if k.e_slot is not None else 0
                if per:
                    rank = np.maximum(k.e_rank, 0)
                    c = rank[:, None] * self.ke + np.arange(self.ke)[None, :]
                    e_ind.append(np.repeat(c[:, None, :], k.R, axis=1).ravel())
                e_ptr.append(offs + per * np.arange(1, k.n * k.R + 1, dtype=np.int64))
                offs += k.n * k.R * per
                # Sums over each eliminated row's observations.
                if per:
                    ok = k.e_rank >= 0
                    k.e_sum = sp.csr_matrix((np.ones(int(ok.sum())), (k.e_rank[ok], np.flatnonzero(ok))),
                                            shape=(self.ne_rows, k.n))
            self.e_indices = np.concatenate(e_ind).astype(np.int32) if e_ind else np.zeros(0, np.int32)
            self.e_indptr = _index(np.concatenate(e_ptr))
        # One kind touches the eliminated group: its reduction by pairs of observations, on
        # the OpenCL device where the reduced matrix is dense (solvers.general.pair_schur_device), else
        # on the host (solvers.general.pair_schur) while its index fits in memory, else scipy's sparse
        # products.
        self.pair = None
        self._blocks = None         # _block_of_column's answer, made at its first use
        with_e = [i for i, k in enumerate(self.kinds) if self.ne and k.e_slot is not None]
        if len(with_e) == 1 and self.kinds[with_e[0]].f_slots:
            from .pair_schur import PairSchur, TooLarge
            i = with_e[0]
            args = (self.kinds[i], evaluator.problem.residuals[i], self.nf, self.ne_rows)
            if runtime is not None and linear_solver(options.linear_solver).iterative:
                # CG on S applied implicitly, never formed (solvers.general.implicit_schur_device).
                from .implicit_schur_device import DeviceImplicitSchur, NoImplicitSchur
                try:
                    self.pair = DeviceImplicitSchur(*args, runtime, self._group_blocks(), *self._block_of_column())
                except NoImplicitSchur:
                    pass
            if runtime is not None and self.pair is None:
                from .pair_schur_device import DevicePairSchur, NoDevicePairSchur
                try:
                    self.pair = DevicePairSchur(*args, runtime, mixed=options.mixed_precision_solves)
                except NoDevicePairSchur:
                    pass
            if self.pair is None:
                try:
                    self.pair = PairSchur(*args)
                except TooLarge:
                    pass
            self.pair_kind = i
        self.implicit = self.pair is not None and self.pair.implicit
        # The device reduction holds F^T F of its kind's rows: the host's is of the others.
        self.rest_rows = None
        if self.pair is not None and self.pair.covers_rows:
            offset = sum(k.n * k.R for k in self.kinds[:self.pair_kind])
            keep = np.ones(self.m, bool)
            keep[self.pair.covered_rows(offset)] = False
            self.rest_rows = np.flatnonzero(keep)
        self.x = np.array(x0, dtype=np.float64)
        self.best_x = self.x.copy()
        self.linear_solver_time = 0.0
        self.diagonal = None
        self._symbolic = None
        self.factorised_with = ""

    # -- evaluation at x ---------------------------------------------------------------------
    def evaluate_jacobian(self, first: bool):
        res = self.ev.evaluate(self.x)
        if res is None:
            return None
        cost, kinds = res
        t0 = time.perf_counter()
        self.r = np.concatenate([r.ravel() for r, _ in kinds]) if kinds else np.zeros(0)
        full = [k.f_full(j) if k.f_slots else None for k, (_, j) in zip(self.kinds, kinds)]
        self.F = sp.csr_matrix((np.concatenate([k.f_values(j, f) for k, (_, j), f in zip(self.kinds, kinds, full)]),
                                self.f_indices, self.f_indptr), shape=(self.m, self.nf))
        col2 = np.bincount(self.f_indices, weights=self.F.data ** 2, minlength=self.nf)[:self.nf]
        gf = self.F.T @ self.r
        if self.ne:
            ke = self.ke
            E_blocks = [k.e_values(j) if k.e_slot is not None else None for k, (_, j) in zip(self.kinds, kinds)]
            self.E = sp.csr_matrix((np.concatenate([b.ravel() for b in E_blocks if b is not None]),
                                    self.e_indices, self.e_indptr), shape=(self.m, self.ne))
            V = np.zeros((self.ne_rows, ke * ke))
            ge = np.zeros((self.ne_rows, ke))
            for k, b, (r, _) in zip(self.kinds, E_blocks, kinds):
                if b is None:
                    continue
                # E_o^T E_o summed over the residual rows by broadcasting: numpy's matmul of
                # many tiny matrices costs 3x more.
                outer = b[:, 0, :, None] * b[:, 0, None, :]
                for row in range(1, b.shape[1]):
                    outer += b[:, row, :, None] * b[:, row, None, :]
                V += k.e_sum @ outer.reshape(k.n, ke * ke)
                ge += k.e_sum @ np.einsum("nrk,nr->nk", b, r)
            self.V = V.reshape(-1, ke, ke)
            if self.pair is not None:
                i = self.pair_kind
                # Constant entries' Jacobian columns stay: their rows and columns of the
                # products land nowhere (solvers.general.pair_schur, solvers.general.pair_schur_device).
                if self.implicit:
                    self.pair.prepare(full[i], E_blocks[i], kinds[i][0])
                else:
                    self.pair.prepare(full[i], E_blocks[i])
            else:
                self.W = (self.F.T @ self.E).tocsr()
            col2 = np.concatenate([col2, np.einsum("pii->pi", self.V).ravel()])
            g = np.concatenate([gf, ge.ravel()])
            self.ge = ge.ravel()
        else:
            g = gf
        # F^T F; with the device reduction only of the rows it does not hold (other kinds,
        # observations of constant eliminated rows): its keys' matrix has the rest.
        if self.rest_rows is None:
            self.FtF = (self.F.T @ self.F).tocsr()
        elif self.rest_rows.size:
            F = self.F[self.rest_rows]
            self.FtF = (F.T @ F).tocsr()
            self.gf_rest = F.T @ self.r[self.rest_rows]
        else:
            self.FtF = sp.csr_matrix((self.nf, self.nf))
            self.gf_rest = np.zeros(self.nf)
        self.gf = gf
        self.col2 = col2
        if first:
            self.scale = 1.0 / (1.0 + np.sqrt(col2)) if self.o.jacobi_scaling else np.ones(col2.size)
        self.linear_solver_time += time.perf_counter() - t0
        # Ceres' gradient norms, |x - Plus(x, -g)|, over the tangent entries.
        xt = self.x[self.layout.t_in_x]
        projected = xt - (xt + (-g))
        gmax = float(np.max(np.abs(projected))) if projected.size else 0.0
        return cost, gmax, norm(projected)

    # -- the step ----------------------------------------------------------------------------
    def solve_step(self, radius: float, reuse_diagonal: bool) -> StepSolution:
        """As :meth:`solvers.ba.host_state.HostState.solve_step`: ``(J^T J + (D / scale)^2) u = J^T f``
        with ``D = sqrt(diagonal / radius)``, the step ``-u``, and the model cost change."""
        o, scale = self.o, self.scale
        t0 = time.perf_counter()
        try:
            if not reuse_diagonal:
                self.diagonal = np.clip(self.col2 * scale * scale, o.min_lm_diagonal, o.max_lm_diagonal)
            d2 = self.diagonal / radius / (scale * scale)
            u, ok, its, msg = self._solve(d2)
        finally:
            self.linear_solver_time += time.perf_counter() - t0
        if not ok:
            return StepSolution(False, its, msg)
        if not np.all(np.isfinite(u)):
            return StepSolution(False, its, "Linear solver failure. Failed to compute a finite step.")
        self.delta_t = -u
        m = self.F @ self.delta_t[:self.nf]
        if self.ne:
            m = m + self.E @ self.delta_t[self.nf:]
        mcc = float(-np.sum(m * (self.r + m / 2.0)))
        return StepSolution(True, its, msg, mcc)

    def _solve(self, d2):
        nf = self.nf
        if not self.ne:
            A = self.FtF + sp.diags(d2)
            y, ok, msg = self._factor_solve(A, self.gf)
            return y, ok, 1, msg
        ke = self.ke
        Vd = self.V.copy()
        Vd[:, np.arange(ke), np.arange(ke)] += d2[nf:].reshape(-1, ke)
        with np.errstate(all="ignore"):
            try:
                Vinv = np.linalg.inv(Vd)
            except np.linalg.LinAlgError:
                Vinv = np.linalg.pinv(Vd, hermitian=True)
        if self.implicit:
            return self._solve_implicit(d2, Vinv)
        iterative = linear_solver(self.o.linear_solver).iterative
        if self.pair is not None and self.pair.factors and not iterative:
            # S assembled, factorised and solved on the device (solvers.general.pair_schur_device).
            self.pair.enqueue_keys(Vinv)
            b = self.gf - self.pair.w_times(None, self.ge.reshape(-1, ke))
            yf, ok, msg = self.pair.factor_solve(self.FtF, d2[:nf], b)
            self.factorised_with = f"dense Cholesky on {self.pair.rt.info.name}{self.pair.factor_note}"
            its = 1
        else:
            if self.pair is not None:
                S, ZV = self.pair.reduced_matrix(Vinv, self.FtF, d2[:nf])
                b = self.gf - self.pair.w_times(ZV, self.ge.reshape(-1, ke))
            else:
                Vi = sp.bsr_matrix((Vinv, np.arange(self.ne_rows), np.arange(self.ne_rows + 1)),
                                   shape=(self.ne, self.ne)).tocsr()
                S = (self.FtF - (self.W @ Vi) @ self.W.T + sp.diags(d2[:nf])).tocsr()
                b = self.gf - self.W @ (Vi @ self.ge)
            if iterative:
                yf, ok, its, msg = self._pcg(S, b)
            else:
                yf, ok, msg = self._factor_solve(S, b)
                its = 1
        if not ok:
            return None, False, its, msg
        if self.pair is not None:
            t = self.ge.reshape(-1, ke) - self.pair.wt_times(yf)
            ye = np.einsum("pij,pj->pi", Vinv, t).ravel()
        else:
            ye = Vi @ (self.ge - self.W.T @ yf)
        return np.concatenate([yf, ye]), True, its, msg

    def _factor_solve(self, A, b):
        """Solve the symmetric positive definite ``A y = b``: ``(y, ok, message)``."""
        n = A.shape[0]
        if n == 0:
            return np.zeros(0), True, "Success."
        dense = isinstance(A, np.ndarray)
        if not np.all(np.isfinite(A if dense else A.data)) or not np.all(np.isfinite(b)):
            return None, False, MSG_NOT_FINITE
        try:
            if dense or limits.host_dense(n, forced=linear_solver(self.o.linear_solver).dense):
                name = "lapack"
                c = lapack_cholesky(A if dense else A.toarray(), overwrite=dense)
                y = lapack_solve(c, b)
            elif installed("cholmod"):
                name = "cholmod"
                A = A.tocsc()
                A.sort_indices()
                # The symbolic analysis is kept while the pattern stays (it can lose exact zeros).
                key = (A.indptr.tobytes(), A.indices.tobytes())
                factor = self._symbolic[1] if self._symbolic is not None and self._symbolic[0] == key else None
                factor = cholmod_cholesky(A, factor)
                self._symbolic = (key, factor)
                y = factor.solve_A(b)
            else:
                name = "superlu"
                y = superlu_ldlt(A.tocsc()).solve(b)
        except NotPositiveDefinite:
            return None, False, MSG_NOT_PD
        self.factorised_with = LABELS[name]
        return y, True, "Success."

    def _pcg(self, S, b):
        """CG on ``S`` (scipy sparse, or dense from the device reduction) with the inverses of its
        diagonal blocks (one per active row of each group, over that row's free entries)."""
        blocks = self._diagonal_blocks_dense(S) if isinstance(S, np.ndarray) else self._diagonal_blocks_sparse(S)
        return conjugate_gradients(S.dot, b, self._preconditioner(blocks).dot, q_tolerance=self.o.eta,
                                   max_iterations=self.o.max_linear_solver_iterations)

    def _solve_implicit(self, d2, Vinv):
        """iterative_schur with ``S y`` from the device (solvers.general.implicit_schur_device): CG on the
        host, ``S`` never formed. The rows the device does not hold add ``FtF`` (theirs) and
        ``gf_rest``."""
        nf, pair, FtF = self.nf, self.pair, self.FtF
        dF = d2[:nf]
        b = self.gf_rest + pair.reduced_residuals(Vinv)
        flat = pair.jacobi_blocks(Vinv)
        blocks = []
        for (T, D), off in zip(self._diagonal_blocks_sparse(FtF), pair.offsets):
            rows, k = T.shape
            D = D + flat[off:off + rows * k * k].reshape(rows, k, k)
            rr, ii = np.nonzero(T >= 0)
            D[rr, ii, ii] += dF[T[rr, ii]]
            blocks.append((T, D))

        def product(y):
            return pair.product(Vinv, y) + FtF @ y + dF * y

        yf, ok, its, msg = conjugate_gradients(product, b, self._preconditioner(blocks).dot,
                                               q_tolerance=self.o.eta,
                                               max_iterations=self.o.max_linear_solver_iterations)
        if not ok:
            return None, False, its, msg
        ye = pair.back_substitute(Vinv, self.ge.reshape(-1, self.ke), yf).ravel()
        return np.concatenate([yf, ye]), True, its, msg

    def _preconditioner(self, blocks):
        """The block-diagonal inverse of ``[(T, D)]`` (per group: tangent indices and diagonal
        blocks) as a CSR matrix over the F columns."""
        pr, pc, pv = [], [], []
        for T, D in blocks:
            inv = spd_block_inverses(D)
            both = (T[:, :, None] >= 0) & (T[:, None, :] >= 0)
            rr, ii, jj = np.nonzero(both)
            pr.append(T[rr, ii])
            pc.append(T[rr, jj])
            pv.append(inv[rr, ii, jj])
        if not pr:
            return sp.csr_matrix((self.nf, self.nf))
        return sp.csr_matrix((np.concatenate(pv), (np.concatenate(pr), np.concatenate(pc))), shape=(self.nf, self.nf))

    def _group_blocks(self):
        """``[(T, base)]`` per non-eliminated group with free entries: its active rows' tangent
        indices (rows, size), -1 at constant entries, and its first diagonal block's number."""
        out, base = [], 0
        for T in self._group_tangents():
            out.append((T, base))
            base += T.shape[0]
        return out

    def _group_tangents(self):
        """Per non-eliminated group with free entries: its active rows' tangent indices
        (rows, size), -1 at constant entries."""
        return [g.tangent[g.rows] for g in self.layout.groups
                if g.name != self.layout.eliminated and g.t_size]

    def _diagonal_blocks_dense(self, S):
        """``[(T, D)]`` per group: the diagonal blocks ``D`` (rows, size, size) of a dense ``S``
        over each active row's entries ``T`` (constant entries: identity there)."""
        out = []
        for T in self._group_tangents():
            k = T.shape[1]
            t = np.maximum(T, 0)
            D = S[t[:, :, None], t[:, None, :]]
            both = (T[:, :, None] >= 0) & (T[:, None, :] >= 0)
            D = np.where(both, D, 0.0)
            D[:, np.arange(k), np.arange(k)] += T < 0
            out.append((T, D))
        return out

    def _diagonal_blocks_sparse(self, S):
        """As :meth:`_diagonal_blocks_dense` for a scipy sparse ``S``."""
        C = S.tocoo()
        blk, pos = self._block_of_column()
        same = blk[C.row] == blk[C.col]
        r, c, v = C.row[same], C.col[same], C.data[same]
        out = []
        for T, base in self._group_blocks():
            rows, k = T.shape
            inside = (blk[r] >= base) & (blk[r] < base + rows)
            D = np.zeros((rows, k, k))
            D[:, np.arange(k), np.arange(k)] += T < 0          # constant entries: identity there
            np.add.at(D, (blk[r[inside]] - base, pos[r[inside]], pos[c[inside]]), v[inside])
            out.append((T, D))
        return out

    def _block_of_column(self):
        """For every F column: its diagonal block (one per active row of each group, numbered
        over the groups in turn, :meth:`_group_blocks`) and its entry's position in the row."""
        if self._blocks is None:
            blk, pos = np.zeros(self.nf, np.int64), np.zeros(self.nf, np.int64)
            for T, base in self._group_blocks():
                rr, jj = np.nonzero(T >= 0)
                blk[T[rr, jj]] = base + rr
                pos[T[rr, jj]] = jj
            self._blocks = (blk, pos)
        return self._blocks

    # -- the candidate -----------------------------------------------------------------------
    def evaluate_candidate(self):
        self.candidate_x = self.x + self.layout.tangent_to_x(self.delta_t)
        return self.ev.cost(self.candidate_x), norm(self.x - self.candidate_x)

    def accept(self):
        self.x = self.candidate_x

    @property
    def x_norm(self) -> float:
        return norm(self.x)

    def remember_best(self):
        self.best_x = self.x.copy()

    def best(self, final: bool = True) -> np.ndarray:
        return self.best_x

    def kernel_time(self):
        return None             # the device's work is not profiled per kernel here

    def transfers(self) -> dict:
        return {}

    def close(self):
        """The solve is over (the Minimizer calls this last): the device reduction's kernel
        objects go back to their pools."""
        if self.pair is not None:
            self.pair.close()

    @property
    def linear_solver_detail(self) -> str:
        n = self.nf
        what = "Reduced matrix" if self.ne else "Normal equations"
        reduced_on = f"; W V^-1 W^T from the {self.pair.description}" \
            if self.pair is not None and self.pair.description else ""
        if self.implicit:
            return f"{what}: {n} x {n}, not formed: CG with Schur-Jacobi preconditioner on the host, S y from the {self.pair.description}"
        if linear_solver(self.o.linear_solver).iterative:
            return f"{what}: {n} x {n}, CG with block-Jacobi preconditioner on the host{reduced_on}"
        where = "" if " on " in self.factorised_with else " on the host"
        return f"{what}: {n} x {n}, {self.factorised_with or 'not factorised'}{where}{reduced_on}"
