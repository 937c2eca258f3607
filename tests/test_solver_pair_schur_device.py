"""solvers.general.pair_schur_device: the general core's W V^-1 W^T, W V^-1 u and W^T y on the OpenCL
device, against dense products of the Jacobian's F and E columns (numpy), on a problem with a
shared camera, constant rows and entries, a constant point and a second residual kind; and
solves with it against solves with the host's reduction."""
import numpy as np
import pytest
import scipy.linalg

import solvers
from solvers.general import pair_schur, pair_schur_device
from solvers.linalg import factorisation_limits
from solvers.general.pair_schur_device import DevicePairSchur
from solvers.plan import GeneralCore
from solvers.general.sparse_state import SparseState

from test_solver_problem import scene, three_group_problem


def jacobian_state(prob, runtime):
    opts = solvers.Options()
    core = GeneralCore(prob, "points", opts)
    st = SparseState(core.evaluator, opts, core.x0(), runtime=runtime)
    st.evaluate_jacobian(first=True)
    return st


@pytest.mark.oclgrind
@pytest.mark.parametrize("n_cameras", [1, 2])
def test_products_equal_dense_references(device, n_cameras):
    """One camera shared by every image, or two: every product against F and E made dense."""
    if not device.info.fp64:
        pytest.skip("the device reduction needs fp64; the host's serves this device")
    s = scene(seed=4, n_images=4, n_cameras=n_cameras, n_points=7)
    st = jacobian_state(three_group_problem(s, device=device), device)
    assert isinstance(st.pair, DevicePairSchur)
    F, E = st.F.toarray(), st.E.toarray()
    W = F.T @ E                                      # every kind's rows; the prior's E is zero
    Vinv = np.linalg.inv(st.V + np.eye(st.ke))
    WVi = W @ scipy.linalg.block_diag(*Vinv)
    red, zv = st.pair.reduction(Vinv)
    ref = WVi @ W.T
    scale = np.abs(ref).max()
    np.testing.assert_allclose(red, ref, rtol=1e-12, atol=1e-13 * scale)
    rng = np.random.default_rng(0)
    u = rng.normal(size=(st.ne_rows, st.ke))
    np.testing.assert_allclose(st.pair.w_times(zv, u), WVi @ u.ravel(), rtol=1e-12,
                               atol=1e-13 * np.abs(WVi).max() * np.abs(u).sum())
    y = rng.normal(size=st.nf)
    np.testing.assert_allclose(st.pair.wt_times(y).ravel(), W.T @ y, rtol=1e-12,
                               atol=1e-13 * np.abs(W).max() * np.abs(y).sum())
    # S = F^T F + diag(d2) - W V^-1 W^T for the host's factorisation, and assembled, factorised
    # and solved on the device.
    d2 = rng.uniform(1.0, 2.0, st.nf)
    S, _ = st.pair.reduced_matrix(Vinv, st.FtF, d2)
    np.testing.assert_allclose(S, F.T @ F + np.diag(d2) - ref, rtol=1e-12, atol=1e-13 * scale)
    b = rng.normal(size=st.nf)
    st.pair.enqueue_keys(Vinv)
    x, ok, message = st.pair.factor_solve(st.FtF, d2, b)
    assert ok, message
    np.testing.assert_allclose(x, np.linalg.solve(F.T @ F + np.diag(d2) - ref, b), rtol=1e-9)
    st.close()


@pytest.mark.parametrize("linear_solver,factor,mixed", [("sparse_schur", False, False), ("sparse_schur", True, False),
                                                        ("sparse_schur", True, True)])
def test_solves_equal_the_host_reduction(device, monkeypatch, linear_solver, factor, mixed):
    """The device's reduction, with S factorised on the host (LAPACK: CPUs) or on the device
    (the dense Cholesky: GPUs; ``mixed``: in float32, refined in float64), against the host's
    reduction."""
    if not device.info.fp64:
        pytest.skip("the device reduction needs fp64")
    monkeypatch.setattr(pair_schur_device, "factors_on_device", lambda runtime: factor)
    s = scene(seed=3, n_images=6, n_cameras=1)
    # (device_resident=False: the general core, whose reduction this is; by default its prior
    # kind would join the reprojections on the device-resident core, solvers.general.merged_groups.)
    kw = dict(linear_solver=linear_solver, max_iterations=10, handle_sigint=False, device_resident=False)
    a = solvers.solve(three_group_problem(s, device=device), mixed_precision_solves=mixed, **kw)
    b = solvers.solve(three_group_problem(s, device=device), schur_backend="numpy", **kw)
    assert "keys'" in a.linear_solver_detail and "keys'" not in b.linear_solver_detail
    assert ("dense Cholesky on " + device.info.name in a.linear_solver_detail) == factor
    assert ("(float32, refined in float64)" in a.linear_solver_detail) == mixed
    assert len(a.history) == len(b.history) > 2
    for x, y in zip(a.history, b.history):
        assert x.cost == pytest.approx(y.cost, rel=1e-10)
    for name in a.parameters:
        np.testing.assert_allclose(a.parameters[name], b.parameters[name], rtol=1e-8, atol=1e-10)


def test_sparse_reduced_matrices_stay_on_the_host(device, monkeypatch):
    """Below the dense fill the host's CSR reduction serves (the device's is dense only)."""
    monkeypatch.setattr(factorisation_limits, "DENSE_FILL", 2.0)
    st = jacobian_state(three_group_problem(scene(seed=3), device=device), device)
    assert type(st.pair) is pair_schur.PairSchur
