"""Levenberg-Marquardt's vectors and per-iteration arithmetic on the host (numpy): the reference
implementation. :class:`solvers.ba.lm_device.DeviceState` does the same on an OpenCL device, and the
tests compare the two; :class:`solvers.loop.lm.Minimizer` drives either through the same methods.

The state holds the current parameters ``x``, the Jacobi scaling, the normal equations of the
last accepted point, the last step and its candidate point, and the best point seen.
"""
from __future__ import annotations

import time


import numpy as np

from ..linalg.cg import norm
from ..linalg.linear_solver import linear_solver
from ..loop.step import LoopState, StepSolution

from .schur import NormalEquations, Structure, j_x, row_squares


class HostState(LoopState):
    """numpy arrays; the Schur complement's products on the OpenCL device ``runtime`` when one is
    given (:class:`solvers.ba.schur_device.ClStructure`)."""

    where = "host"

    def __init__(self, evaluator, options, x0, runtime=None):
        self.ev, self.o = evaluator, options
        # The blocks' sizes are the evaluator's: BAL's 9 and 3, a COLMAP camera model's, a general
        # problem's (what the model returns per observation).
        self.st = Structure(evaluator.cam, evaluator.pt, evaluator.nc, evaluator.npt,
                            evaluator.C, evaluator.P, evaluator.R)
        self.cl_structure = None
        if runtime is not None:
            from .schur_device import ClStructure
            self.cl_structure = ClStructure(self.st, runtime)
        self.x = np.array(x0, dtype=np.float64)
        self.best_x = self.x.copy()
        self.linear_solver_time = 0.0
        self.diagonal = None

    # -- evaluation at x ---------------------------------------------------------------------
    def evaluate_jacobian(self, first: bool):
        """Residuals and Jacobians at ``x``, their normal equations and (``first``) the Jacobi
        scaling; ``(cost, gradient max norm, gradient norm)`` or None when the evaluation failed."""
        res = self.ev.evaluate(self.x)
        if res is None:
            return None
        cost, r, jc, jp = res
        st = self.st
        if first:
            if self.o.jacobi_scaling:
                col2 = np.concatenate([st.camera_sum(row_squares(jc)).ravel(),
                                       st.point_sum(row_squares(jp)).ravel()])
                self.scale = 1.0 / (1.0 + np.sqrt(col2))
            else:
                self.scale = np.ones(self.x.size)
        t0 = time.perf_counter()
        if self.cl_structure is not None:
            from .schur_device import NormalEquationsCL
            self.neq = NormalEquationsCL(st, r, jc, jp, self.cl_structure)
        else:
            self.neq = NormalEquations(st, r, jc, jp)
        self.linear_solver_time += time.perf_counter() - t0
        # The gradient (of the unscaled problem); its norms as Ceres measures them, |x - Plus(x, -g)|.
        g = np.concatenate([self.neq.gc.ravel(), self.neq.gp.ravel()])
        projected = self.x - (self.x + (-g))
        gmax = float(np.max(np.abs(projected))) if projected.size else 0.0
        return cost, gmax, norm(projected)

    # -- the step ----------------------------------------------------------------------------
    def solve_step(self, radius: float, reuse_diagonal: bool) -> StepSolution:
        """Ceres' LevenbergMarquardtStrategy step: solve ``(Js^T Js + D^2) y = Js^T f`` for the
        Jacobi-scaled ``Js = J diag(scale)`` with ``D = sqrt(diagonal / radius)``, then the step,
        the candidate point and the model cost change ``-(J step) . (f + J step / 2)``.

        The normal equations hold the unscaled blocks: with ``y = u / scale`` the system is
        ``(J^T J + (D / scale)^2) u = J^T f``, the same solution without scaling every Jacobian
        entry (and, for CG with the Schur-Jacobi preconditioner, the same iterates: PCG is
        invariant under a diagonal change of variables that its preconditioner shares)."""
        o, neq, scale = self.o, self.neq, self.scale
        t0 = time.perf_counter()
        if not reuse_diagonal:
            # diag(Js^T Js) = scale^2 diag(J^T J)
            self.diagonal = np.clip(neq.column_norms2() * scale * scale, o.min_lm_diagonal, o.max_lm_diagonal)
        D = np.sqrt(self.diagonal / radius)
        sol = neq.solve(D / scale, o.linear_solver, eta=o.eta, max_iterations=o.max_linear_solver_iterations)
        self.linear_solver_time += time.perf_counter() - t0
        if not sol.ok:
            return StepSolution(False, sol.iterations, sol.message)
        step = -(sol.y / scale)                     # in the scaled variables
        self.delta = step * scale                   # undo the Jacobian column scaling
        m = self._model_residuals(self.delta)       # = Js step
        mcc = float(-np.sum(m * (neq.r + m / 2.0)))
        return StepSolution(True, sol.iterations, sol.message, mcc)

    def _model_residuals(self, delta):
        """``J delta`` per observation (n, R)."""
        st = self.st
        ncC = st.C * st.nc
        sc, sp = delta[:ncC].reshape(-1, st.C), delta[ncC:].reshape(-1, st.P)
        return j_x(self.neq.Jc, sc[st.cam]) + j_x(self.neq.Jp, sp[st.pt])

    def evaluate_candidate(self):
        """``(cost or None, step norm)`` at the candidate ``x + delta``."""
        self.candidate_x = self.x + self.delta
        return self.ev.cost(self.candidate_x), norm(self.x - self.candidate_x)

    def accept(self):
        """The candidate becomes ``x``."""
        self.x = self.candidate_x

    @property
    def x_norm(self) -> float:
        return norm(self.x)

    def remember_best(self):
        self.best_x = self.x.copy()

    def best(self, final: bool = True) -> np.ndarray:
        """The best parameters seen (host array, cameras then points; not to be modified).
        ``final`` is for :class:`solvers.ba.lm_device.DeviceState`'s accounting of transfers."""
        return self.best_x

    def kernel_time(self):
        return None             # no device kernels to profile

    def close(self):
        pass                    # nothing held beyond host arrays

    def transfers(self) -> dict:
        return {}

    @property
    def linear_solver_detail(self) -> str:
        """A factorising linear solver's: S's size and how solvers.ba.schur factorises it."""
        entry = linear_solver(self.o.linear_solver)
        if entry.iterative:
            return ""
        from ..linalg import factorisation_limits as limits
        n = self.st.C * self.ev.nc
        how = "dense Cholesky (LAPACK)" if limits.host_dense(n, forced=entry.dense) else "sparse LDL^T (SuperLU)"
        return f"Reduced camera matrix: {n} x {n}, {how} on the host"
