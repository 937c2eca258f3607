"""Preconditioned conjugate gradients with Ceres' termination tests (for ``iterative_schur``)."""
from __future__ import annotations

import numpy as np


def _dot(a, b) -> float:
    """Inner product without BLAS (whose ddot may start threads that wait on busy cores)."""
    return float(np.einsum("i,i->", a, b))


def norm(a) -> float:
    return _dot(a, a) ** 0.5


def conjugate_gradients(A, b, M=None, q_tolerance=0.1, r_tolerance=-1.0, min_iterations=0,
                        max_iterations=500, residual_reset_period=10):
    """Preconditioned CG from ``x = 0`` as Ceres' ``ConjugateGradientsSolver``: terminates when
    ``i (Q_i - Q_{i-1}) / Q_i < q_tolerance`` with ``Q(x) = x^T A x - 2 b^T x`` (Nash and Sofer), or
    ``|r| <= r_tolerance |b|``, or after ``max_iterations``. Returns ``(x, ok, iterations, message)``;
    ``ok`` is False on a numerical failure (x is then None)."""
    x = np.zeros_like(b)
    norm_b = norm(b)
    if norm_b == 0.0:
        return x, True, 0, "Convergence. |b| = 0."
    tol_r = r_tolerance * norm_b
    r = b.copy()
    if min_iterations == 0 and norm(r) <= tol_r:
        return x, True, 0, "Convergence. |r| <= tol_r."
    rho = 1.0
    Q0 = -_dot(x, b + r)
    p = None
    it = 1
    while True:
        z = M(r) if M is not None else r.copy()
        last_rho, rho = rho, _dot(r, z)
        if rho == 0.0 or not np.isfinite(rho):
            return None, False, it, f"Numerical failure. rho = r'z = {rho:e}."
        if it == 1:
            p = z
        else:
            beta = rho / last_rho
            if beta == 0.0 or not np.isfinite(beta):
                return None, False, it, f"Numerical failure. beta = rho_n / rho_(n-1) = {beta:e}."
            p = z + beta * p
        q = A(p)
        pq = _dot(p, q)
        if pq <= 0 or np.isinf(pq):
            return x, True, it, f"Matrix is indefinite, no more progress can be made. p'q = {pq:e}."
        alpha = rho / pq
        if not np.isfinite(alpha):
            return None, False, it, f"Numerical failure. alpha = rho / pq = {alpha:e}."
        x = x + alpha * p
        if it % residual_reset_period == 0:
            r = b - A(x)
        else:
            r = r - alpha * q
        Q1 = -_dot(x, b + r)
        zeta = it * (Q1 - Q0) / Q1
        if zeta < q_tolerance and it >= min_iterations:
            return x, True, it, f"Iteration: {it} Convergence: zeta = {zeta:e} < {q_tolerance:e}."
        Q0 = Q1
        if norm(r) <= tol_r and it >= min_iterations:
            return x, True, it, "Convergence. |r| <= tol_r."
        if it >= max_iterations:
            return x, True, it, "Maximum number of iterations reached."
        it += 1
