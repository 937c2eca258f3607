"""solvers.general.implicit_schur_device: the general core's iterative_schur with S applied on the OpenCL
device and never formed. Its products, right-hand side, back-substitution and Schur-Jacobi blocks
against F and E made dense (numpy), on a problem with shared intrinsics, constant rows and
entries, a constant point and a second residual kind; and solves with it against solves with
the host's reduction."""
import numpy as np
import pytest
import scipy.linalg

import solvers
from solvers.general.implicit_schur_device import DeviceImplicitSchur
from solvers.plan import GeneralCore
from solvers.general.sparse_state import SparseState

from test_solver_problem import scene, three_group_problem


def iterative_state(prob, runtime):
    opts = solvers.Options(linear_solver="iterative_schur")
    core = GeneralCore(prob, "points", opts)
    st = SparseState(core.evaluator, opts, core.x0(), runtime=runtime)
    st.evaluate_jacobian(first=True)
    return st


@pytest.mark.oclgrind
@pytest.mark.parametrize("n_images,n_cameras", [(4, 1), (4, 2), (4, 3), (4, 4)])
def test_products_equal_dense_references(device, n_images, n_cameras):
    """A camera shared by every image, by two, by two beside cameras of one image each, or one
    per image (no row shared by two keys)."""
    if not device.info.fp64:
        pytest.skip("the device products need fp64; the host's reduction serves this device")
    s = scene(seed=4, n_images=n_images, n_cameras=n_cameras, n_points=7)
    st = iterative_state(three_group_problem(s, device=device), device)
    pair = st.pair
    assert isinstance(pair, DeviceImplicitSchur)
    assert (pair.shared_cols.size > 0) == (n_cameras < n_images)
    F, E, r = st.F.toarray(), st.E.toarray(), st.r
    W = F.T @ E                                      # every kind's rows; the prior's E is zero
    Vinv = np.linalg.inv(st.V + np.eye(st.ke))
    WVi = W @ scipy.linalg.block_diag(*Vinv)
    S = F.T @ F - WVi @ W.T
    rng = np.random.default_rng(0)
    y = rng.normal(size=st.nf)
    scale = np.abs(S).max() * np.abs(y).sum()
    # The device's part plus the rows it does not hold (the prior, the constant point's).
    np.testing.assert_allclose(pair.product(Vinv, y) + st.FtF @ y, S @ y, rtol=1e-12, atol=1e-13 * scale)
    ge = E.T @ r
    b = F.T @ r - WVi @ ge
    np.testing.assert_allclose(st.gf_rest + pair.reduced_residuals(Vinv), b, rtol=1e-12,
                               atol=1e-13 * np.abs(F).max() * np.abs(r).sum() * max(1.0, np.abs(WVi).max()))
    ye = scipy.linalg.block_diag(*Vinv) @ (ge - W.T @ y)
    np.testing.assert_allclose(pair.back_substitute(Vinv, ge.reshape(-1, st.ke), y).ravel(), ye,
                               rtol=1e-11, atol=1e-12 * np.abs(ye).max())
    # Schur-Jacobi: S's diagonal blocks, one per active row of each group (identity at its
    # constant entries).
    flat = pair.jacobi_blocks(Vinv)
    got = [(T, D + flat[off:off + D.size].reshape(D.shape))
           for (T, D), off in zip(st._diagonal_blocks_sparse(st.FtF), pair.offsets)]
    want = st._diagonal_blocks_dense(S)
    assert len(got) == len(want) == 2                 # poses, intrinsics
    for (T1, D1), (T2, D2) in zip(got, want):
        np.testing.assert_array_equal(T1, T2)
        np.testing.assert_allclose(D1, D2, rtol=1e-12, atol=1e-13 * np.abs(S).max())
    st.close()


@pytest.mark.parametrize("n_cameras", [1, 2])
def test_solves_equal_the_host_reduction(device, n_cameras):
    """iterative_schur with the device's products against the host's formed S: the same
    iterations, CG steps and costs."""
    if not device.info.fp64:
        pytest.skip("the device products need fp64")
    s = scene(seed=3, n_images=6, n_cameras=n_cameras)
    kw = dict(linear_solver="iterative_schur", max_iterations=10, handle_sigint=False)
    a = solvers.solve(three_group_problem(s, device=device), **kw)
    b = solvers.solve(three_group_problem(s, device=device), schur_backend="numpy", **kw)
    assert "not formed" in a.linear_solver_detail and "implicit products" in a.linear_solver_detail
    assert "implicit" not in b.linear_solver_detail
    assert len(a.history) == len(b.history) > 2
    # CG stops early (eta = 0.1), so its step follows S y's rounding, which the device sums in
    # another order than the host's formed S.
    for x, y in zip(a.history, b.history):
        assert x.cost == pytest.approx(y.cost, rel=1e-8)
        assert x.linear_solver_iterations == y.linear_solver_iterations
    for name in a.parameters:
        np.testing.assert_allclose(a.parameters[name], b.parameters[name], rtol=1e-6, atol=1e-8)


def test_a_problem_too_large_for_the_device_stays_on_the_host(device, monkeypatch):
    """A device without room for the products: they refuse it before allocating anything, and
    the solve goes on without them (the keys' matrix here)."""
    if not device.info.fp64:
        pytest.skip("the device products need fp64")
    import dataclasses

    from solvers.general.implicit_schur_device import NoImplicitSchur
    s = scene(seed=3, n_images=6, n_cameras=1)
    st = iterative_state(three_group_problem(s, device=device), device)
    kind, block = st.kinds[st.pair_kind], st.ev.problem.residuals[st.pair_kind]
    st.close()
    monkeypatch.setattr(device, "info", dataclasses.replace(device.info, global_mem_bytes=1 << 16))
    with pytest.raises(NoImplicitSchur, match="GiB for the device products"):
        DeviceImplicitSchur(kind, block, st.nf, st.ne_rows, device, st._group_blocks(), *st._block_of_column())
    r = solvers.solve(three_group_problem(s, device=device), linear_solver="iterative_schur",
                      max_iterations=5, handle_sigint=False)
    assert "implicit" not in r.linear_solver_detail and "keys'" in r.linear_solver_detail and r.usable
