"""The Schur-complement linear solvers and CG against dense numpy solves of the same system."""
import numpy as np
import pytest

import solvers
from solvers.linalg import factorisation_limits
from solvers.ba.schur import NormalEquations, Structure, conjugate_gradients

from reference_snavely import ReferenceSnavelyModel
from small_systems import dense_solution, sized_system, small_system


@pytest.mark.parametrize("dense_max", [10 ** 9, 0], ids=["dense-cholesky", "superlu"])
def test_sparse_schur_matches_dense_solve(monkeypatch, dense_max):
    monkeypatch.setattr(factorisation_limits, "HOST_DENSE_MAX", dense_max)
    st, r, jc, jp = small_system()
    neq = NormalEquations(st, r, jc, jp)
    rng = np.random.default_rng(1)
    D = rng.uniform(0.01, 1.0, 9 * st.nc + 3 * st.npt)
    want, J = dense_solution(st, r, jc, jp, D)
    np.testing.assert_allclose(neq.column_norms2(), np.sum(J * J, axis=0), rtol=1e-12)
    sol = neq.solve(D, "sparse_schur")
    assert sol.ok and sol.iterations == 1
    np.testing.assert_allclose(sol.y, want, rtol=1e-7, atol=1e-9 * np.abs(want).max())


def test_iterative_schur_matches_dense_solve():
    st, r, jc, jp = small_system(seed=3)
    neq = NormalEquations(st, r, jc, jp)
    D = np.full(9 * st.nc + 3 * st.npt, 0.3)
    want, _ = dense_solution(st, r, jc, jp, D)
    sol = neq.solve(D, "iterative_schur", eta=-np.inf, r_tolerance=1e-13, max_iterations=1000)
    assert sol.ok and 1 <= sol.iterations <= 1000
    np.testing.assert_allclose(sol.y, want, rtol=1e-6, atol=1e-8 * np.abs(want).max())
    # A loose forcing tolerance stops early (Nash-Sofer test) with an approximate step.
    loose = neq.solve(D, "iterative_schur", eta=0.5)
    assert loose.ok and loose.iterations < sol.iterations


def test_schur_jacobi_preconditioner_is_the_inverse_block_diagonal():
    """With a single camera S is one 9x9 block: preconditioned CG converges in one iteration."""
    p = solvers.synthetic_problem(2, 30, 2, seed=4)
    keep = p.camera_index == 0
    ci, pi, obs = p.camera_index[keep], p.point_index[keep], p.observations[keep]
    order = np.argsort(pi, kind="stable")
    ci, pi, obs = ci[order], pi[order], obs[order]
    r, jc, jp = ReferenceSnavelyModel(ci, pi, obs).residuals_and_jacobians(p.cameras[:1], p.points)
    st = Structure(ci, pi, 1, p.num_points)
    neq = NormalEquations(st, r, jc, jp)
    D = np.full(9 + 3 * p.num_points, 0.5)
    sol = neq.solve(D, "iterative_schur", eta=-np.inf, r_tolerance=1e-12)
    want, _ = dense_solution(st, r, jc, jp, D)
    assert sol.iterations <= 2
    np.testing.assert_allclose(sol.y, want, rtol=1e-7, atol=1e-9 * np.abs(want).max())


def test_conjugate_gradients_against_numpy():
    rng = np.random.default_rng(0)
    M = rng.standard_normal((40, 40))
    A = M @ M.T + 40 * np.eye(40)
    b = rng.standard_normal(40)
    x, ok, its, msg = conjugate_gradients(lambda v: A @ v, b, lambda v: v / np.diag(A), q_tolerance=-np.inf, r_tolerance=1e-13,
                                          max_iterations=200)
    assert ok
    np.testing.assert_allclose(x, np.linalg.solve(A, b), rtol=1e-9)
    x, ok, its, msg = conjugate_gradients(lambda v: A @ v, np.zeros(40))
    assert ok and its == 0 and not x.any()
    # Indefinite: CG stops, reports it, and returns its last iterate (Ceres: NO_CONVERGENCE).
    x, ok, its, msg = conjugate_gradients(lambda v: -v, b)
    assert "indefinite" in msg and its == 1
    x, ok, its, msg = conjugate_gradients(lambda v: A @ v, b, q_tolerance=-1, max_iterations=3)
    assert ok and its == 3 and "Maximum" in msg


def test_singular_system_is_a_failure_not_a_crash():
    st, r, jc, jp = small_system()
    neq = NormalEquations(st, r, jc, jp)
    D = np.zeros(9 * st.nc + 3 * st.npt)          # unobserved camera and point: singular
    for method in ("sparse_schur", "iterative_schur"):
        sol = neq.solve(D, method)
        assert not sol.ok and sol.y is None and sol.message
    with pytest.raises(ValueError, match="linear_solver"):
        neq.solve(D + 1, "dense_qr")


def test_structure_requires_point_order():
    with pytest.raises(ValueError, match="sorted by point"):
        Structure(np.array([0, 1]), np.array([1, 0]), 2, 2)


SIZES = [(10, 3, 2), (6, 1, 3), (7, 4, 2), (9, 3, 4)]


@pytest.mark.parametrize("C,P,R", SIZES, ids=[f"C{c}-P{p}-R{r}" for c, p, r in SIZES])
@pytest.mark.parametrize("method", ["sparse_schur", "dense_schur", "iterative_schur"])
def test_host_reference_takes_any_block_sizes(monkeypatch, C, P, R, method):
    """The host reference (numpy) for blocks other than BAL's 9 / 3 / 2 (a COLMAP camera with its
    intrinsics, an inverse-depth point, three residuals per observation) against the dense solve
    of the whole Jacobian, with the factorising solvers on both routes (LAPACK and SuperLU)."""
    st, r, jc, jp = sized_system(C, P, R, seed=C + P + R)
    neq = NormalEquations(st, r, jc, jp)
    D = np.random.default_rng(2).uniform(0.05, 1.0, C * st.nc + P * st.npt)
    want, J = dense_solution(st, r, jc, jp, D)
    np.testing.assert_allclose(neq.column_norms2(), np.sum(J * J, axis=0), rtol=1e-12)
    tol = dict(eta=-np.inf, r_tolerance=1e-13, max_iterations=2000) if method == "iterative_schur" else {}
    sol = neq.solve(D, method, **tol)
    assert sol.ok, sol.message
    np.testing.assert_allclose(sol.y, want, rtol=1e-7, atol=1e-9 * np.abs(want).max())
    if method == "sparse_schur":
        from solvers.ba.schur import solve_reduced
        Vinv = neq.v_inverse(D[C * st.nc:].reshape(-1, P) ** 2)
        blocks, diag, rhs = neq.reduced_camera_system(Vinv, D[:C * st.nc].reshape(-1, C) ** 2)
        monkeypatch.setattr(factorisation_limits, "HOST_DENSE_MAX", 0)    # SuperLU at any size
        yc, ok, _, msg = solve_reduced(st.pairs(), st.nc, blocks, diag, rhs, dense=False)
        assert ok and msg == "Success."
        with_superlu = np.concatenate([yc.ravel(), neq.back_substitute(Vinv, yc).ravel()])
        np.testing.assert_allclose(with_superlu, want, rtol=1e-7, atol=1e-9 * np.abs(want).max())
