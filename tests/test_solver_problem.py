"""solvers.Problem and solvers.solve: several groups per residual (poses, shared intrinsics,
points), constant rows and entries, two residual kinds, nothing eliminable, and BAL through the
Problem. References: complex-step derivatives of a numpy reprojection written from COLMAP's
formulas, scipy.optimize.least_squares, numpy's linear least squares, and bundle_adjust."""
import numpy as np
import pytest

import pyclad as pc
import solvers
from solvers.models import cameras
from solvers.linalg import factorisation_limits
from solvers.plan import GeneralCore
from solvers.general.sparse_state import SparseState

from bal_data import bal_file


# -- an independent numpy reprojection (complex-safe), from COLMAP's SIMPLE_RADIAL -----------

def rotate(w, X):
    """Rodrigues' formula, ``R(w) X``; w (n, 3), X (n, 3), complex-safe (no abs)."""
    theta = np.sqrt(np.sum(w * w, axis=1))[:, None]
    k = w / theta
    c, s = np.cos(theta), np.sin(theta)
    kx = np.cross(k, X)
    kd = np.sum(k * X, axis=1)[:, None]
    return X * c + kx * s + k * kd * (1 - c)


def simple_radial_residuals(poses, intr, points, img, cam, pt, observed):
    P = rotate(poses[img, :3], points[pt]) + poses[img, 3:]
    u, v = P[:, 0] / P[:, 2], P[:, 1] / P[:, 2]
    f, cx, cy, k = (intr[cam, i] for i in range(4))
    radial = k * (u * u + v * v)
    return np.stack([f * (u + u * radial) + cx - observed[:, 0], f * (v + v * radial) + cy - observed[:, 1]], 1)


def pose_prior(pose, centre):
    """A prior on the camera centre ``-R^T t``: centre - prior (3,)."""
    c = -pc.rotate_angle_axis(-pose[0:3], pose[3:6])
    return [c[0] - centre[0], c[1] - centre[1], c[2] - centre[2]]


def numpy_pose_prior(poses, rows, centres):
    return -rotate(-poses[rows, :3], poses[rows, 3:]) - centres


def scene(seed=0, n_images=5, n_cameras=2, n_points=40, noise=0.5):
    """A small scene: cameras on a circle looking at a cloud, every image sees every point."""
    rng = np.random.default_rng(seed)
    pts = rng.normal(0, 1.0, (n_points, 3))
    poses = np.zeros((n_images, 6))
    for i in range(n_images):
        a = 0.4 * (i - n_images / 2 + 0.25) / n_images     # never 0: the numpy rotation divides by the angle
        poses[i, :3] = [0.0, a, 0.0]
        poses[i, 3:] = [0.3 * i - 0.6, 0.1 * i, 6.0]
    intr = np.array([[500.0, 320.0, 240.0, 0.02], [450.0, 300.0, 250.0, -0.01]]
                    + [[480.0 + 10 * k, 310.0, 245.0, 0.01] for k in range(max(0, n_cameras - 2))])[:n_cameras]
    img = np.repeat(np.arange(n_images), n_points)
    pt = np.tile(np.arange(n_points), n_images)
    cam = img % n_cameras
    obs = simple_radial_residuals(poses, intr, pts, img, cam, pt, np.zeros((img.size, 2)))
    obs += rng.normal(0, noise, obs.shape)
    # The starting point: perturbed.
    poses0 = poses + rng.normal(0, [0.01, 0.01, 0.01, 0.05, 0.05, 0.05], poses.shape)
    intr0 = intr * (1 + rng.normal(0, [0.02, 0.0, 0.0, 0.1], intr.shape))
    pts0 = pts + rng.normal(0, 0.05, pts.shape)
    centres = -rotate(-poses[:, :3], poses[:, 3:]) + rng.normal(0, 0.05, (n_images, 3))
    return dict(poses=poses0, intr=intr0, points=pts0, img=img, cam=cam, pt=pt, obs=obs, centres=centres)


def three_group_problem(s, with_prior=True, loss=None, device=None):
    prob = solvers.Problem(device=device)
    prob.add_parameter_block("poses", s["poses"])
    prob.add_parameter_block("intrinsics", s["intr"])
    prob.add_parameter_block("points", s["points"])
    model = cameras.get("SIMPLE_RADIAL")
    prob.add_residual_block(model.residual, ["poses", "intrinsics", "points"], index=(s["img"], s["cam"], s["pt"]),
                            data=s["obs"], loss=loss, name="reprojection")
    if with_prior:
        rows = np.array([1, 3])
        prob.add_residual_block(pose_prior, ["poses"], index=(rows,), data=s["centres"][rows], name="prior")
    prob.set_constant("poses", rows=[0])
    prob.set_constant("intrinsics", columns=[1, 2])     # the principal point, as COLMAP's default
    prob.set_constant("points", rows=[5])
    prob.set_constant("poses", rows=[2], columns=[5])   # one coordinate of one pose (a gauge's kind)
    return prob


def _least_squares(*args, **kwargs):
    # (imported here: other test files take this file's scenes, and scipy.optimize imports
    # scipy.linalg, which tests/test_imports.py checks a solve does not need)
    import scipy.optimize
    return scipy.optimize.least_squares(*args, **kwargs)


def numpy_residuals(prob, values):
    s = prob
    r = [simple_radial_residuals(values["poses"], values["intrinsics"], values["points"],
                                 *(s.residuals[0].index[:, j] for j in range(3)), s.residuals[0].data).ravel()]
    if len(s.residuals) > 1:
        rows = s.residuals[1].index[:, 0]
        r.append(numpy_pose_prior(values["poses"], rows, s.residuals[1].data).ravel())
    return np.concatenate(r)


def tangent_functions(prob, core):
    """Residuals as a function of the tangent vector (numpy, complex-safe), for references."""
    lay = core.layout
    x0 = lay.x0(prob)

    def values_at(t):
        x = x0.astype(t.dtype) if np.iscomplexobj(t) else x0.copy()
        x[lay.t_in_x] = t
        out = {}
        for name, g in prob.groups.items():
            v = g.values.astype(x.dtype)
            gl = lay.by_name[name]
            v[gl.rows] = x[gl.x_offset:gl.x_offset + gl.x_size].reshape(-1, gl.size)
            out[name] = v
        return out

    return x0[lay.t_in_x], values_at


def complex_step_jacobian(prob, values_at, t0, h=1e-30):
    ref = np.empty((numpy_residuals(prob, values_at(t0)).size, t0.size))
    for c in range(t0.size):
        t = t0.astype(complex)
        t[c] += 1j * h
        ref[:, c] = numpy_residuals(prob, values_at(t)).imag / h
    return ref


def test_jacobian_columns_against_the_complex_step(device):
    s = scene()
    prob = three_group_problem(s, device=device)
    opts = solvers.Options()
    core = GeneralCore(prob, "points", opts)
    st = SparseState(core.evaluator, opts, core.x0())
    st.evaluate_jacobian(first=True)
    J = np.hstack([st.F.toarray(), st.E.toarray()])
    t0, values_at = tangent_functions(prob, core)
    # Constant rows and entries have no column: 4 free poses x 6 less one entry, 2 cameras x 2
    # (f, k), 39 points x 3.
    assert J.shape == (2 * s["img"].size + 6, 4 * 6 - 1 + 2 * 2 + 39 * 3)
    ref = complex_step_jacobian(prob, values_at, t0)
    np.testing.assert_allclose(J, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())
    # And the residuals themselves.
    np.testing.assert_allclose(st.r, numpy_residuals(prob, values_at(t0)), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("linear_solver", ["sparse_schur", "iterative_schur", "sparse_normal_cholesky"])
def test_three_groups_two_kinds_against_scipy_least_squares(device, linear_solver):
    s = scene(seed=2)
    prob = three_group_problem(s, device=device)
    r = solvers.solve(prob, linear_solver=linear_solver, max_iterations=100, function_tolerance=1e-12,
                      gradient_tolerance=1e-12, parameter_tolerance=1e-12, handle_sigint=False,
                      **({"eta": 1e-6} if linear_solver == "iterative_schur" else {}))
    # sparse_schur: the prior kind joins the reprojections as one tagged kind on the device-resident
    # core (solvers.general.merged_groups); the general core below, with device_resident=False.
    assert r.core == ("bundle-adjustment" if linear_solver == "sparse_schur" else "general") and r.usable
    assert r.eliminated == (None if linear_solver == "sparse_normal_cholesky" else "points")
    core = GeneralCore(prob, "points", solvers.Options())
    t0, values_at = tangent_functions(prob, core)
    ref = _least_squares(lambda t: numpy_residuals(prob, values_at(t)), t0, method="lm",
                                       jac=lambda t: complex_step_jacobian(prob, values_at, t),
                                       xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=5000)
    ref_cost = 0.5 * np.sum(ref.fun ** 2)
    assert r.final_cost == pytest.approx(ref_cost, rel=1e-10)
    if linear_solver == "sparse_schur":
        g = solvers.solve(prob, linear_solver=linear_solver, max_iterations=100, function_tolerance=1e-12,
                          gradient_tolerance=1e-12, parameter_tolerance=1e-12, handle_sigint=False,
                          device_resident=False)
        assert g.core == "general" and g.final_cost == pytest.approx(ref_cost, rel=1e-10)
    ours = numpy_residuals(prob, r.parameters)
    assert 0.5 * np.sum(ours ** 2) == pytest.approx(r.final_cost, rel=1e-12)
    ref_values = values_at(ref.x)
    for name in ("poses", "intrinsics", "points"):
        np.testing.assert_allclose(r.parameters[name], ref_values[name], rtol=1e-5, atol=1e-6)
    # Constant rows and entries are exactly as given.
    assert np.array_equal(r.parameters["poses"][0], s["poses"][0])
    assert np.array_equal(r.parameters["intrinsics"][:, 1:3], s["intr"][:, 1:3])
    assert np.array_equal(r.parameters["points"][5], s["points"][5])
    assert r.parameters["poses"][2, 5] == s["poses"][2, 5] and np.all(r.parameters["poses"][2, :5] != s["poses"][2, :5])
    # The problem keeps its starting values.
    assert np.array_equal(prob.groups["points"].values, s["points"])
    report = r.full_report()
    assert "Effective parameters" in report and "reprojection, prior" in report


def test_robust_loss_on_one_kind_matches_scipy(device):
    s = scene(seed=3)
    s["obs"][::17] += 40.0                    # outliers
    prob = three_group_problem(s, with_prior=False, loss="huber", device=device)
    r = solvers.solve(prob, max_iterations=100, function_tolerance=1e-14, gradient_tolerance=1e-14,
                      parameter_tolerance=1e-14, handle_sigint=False)
    core = GeneralCore(prob, "points", solvers.Options())
    t0, values_at = tangent_functions(prob, core)
    ref = _least_squares(lambda t: numpy_residuals(prob, values_at(t)), t0, loss="huber",
                                       jac=lambda t: complex_step_jacobian(prob, values_at, t),
                                       f_scale=1.0, xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=1000)
    # scipy's huber is on each residual entry; Ceres' (and ours) on each block's squared norm:
    # compare our cost with our loss at both minimisers instead.
    def cost(values):
        res = numpy_residuals(prob, values).reshape(-1, 2)
        return prob.residuals[0].loss.cost(np.sum(res ** 2, axis=1))
    assert r.final_cost == pytest.approx(cost(r.parameters), rel=1e-12)
    assert r.final_cost <= cost(values_at(ref.x)) * (1 + 1e-9)


def test_nothing_eliminable_uses_sparse_normal_cholesky_and_solves_a_linear_problem(device):
    """A chain x_{i+1} - x_i = d_i with a prior on x_0: every residual touches two rows of the one
    group, so nothing can be eliminated; linear, so LM converges to numpy's lstsq solution."""
    rng = np.random.default_rng(3)
    n = 30
    d = rng.normal(1.0, 0.1, (n - 1, 2))
    prob = solvers.Problem(device=device)
    prob.add_parameter_block("x", np.zeros((n, 2)))
    prob.add_residual_block(lambda a, b, dd: [b[0] - a[0] - dd[0], b[1] - a[1] - dd[1]], ["x", "x"],
                            index=(np.arange(n - 1), np.arange(1, n)), data=d, name="chain")
    prob.add_residual_block(lambda a: [a[0] - 1.0, a[1] + 2.0], ["x"], index=(np.array([0]),), name="anchor")
    out = []
    r = solvers.solve(prob, linear_solver="sparse_schur", verbose=True, handle_sigint=False,
                      out=_Lines(out), function_tolerance=1e-14, gradient_tolerance=1e-14)
    assert r.eliminated is None and r.options.linear_solver == "sparse_normal_cholesky"
    assert any("falls back to sparse_normal_cholesky" in line for line in out)
    A = np.zeros((2 * (n - 1) + 2, 2 * n))
    b = np.zeros(A.shape[0])
    for i in range(n - 1):
        for k in range(2):
            A[2 * i + k, 2 * (i + 1) + k], A[2 * i + k, 2 * i + k], b[2 * i + k] = 1, -1, d[i, k]
    A[-2, 0], A[-1, 1], b[-2], b[-1] = 1, 1, 1.0, -2.0
    ref = np.linalg.lstsq(A, b, rcond=None)[0].reshape(n, 2)
    np.testing.assert_allclose(r.parameters["x"], ref, atol=1e-8)


class _Lines:
    def __init__(self, out):
        self.out = out

    def write(self, text):
        self.out.extend(t for t in text.splitlines() if t)

    def flush(self):
        pass


def test_eliminate_auto_picks_the_largest_eliminable_group():
    s = scene()
    prob = three_group_problem(s)
    assert prob.eliminable() == ["poses", "intrinsics", "points"] or "points" in prob.eliminable()
    assert prob.choose_eliminated("auto") == "points"
    with pytest.raises(ValueError, match="cannot be eliminated"):
        q = solvers.Problem()
        q.add_parameter_block("x", np.zeros((3, 1)))
        q.add_residual_block(lambda a, b: [a[0] - b[0]], ["x", "x"], index=([0, 1], [1, 2]))
        q.choose_eliminated("x")


def test_bal_through_problem_equals_bundle_adjust_and_the_general_core(device):
    """The BAL problem as a Problem: the bundle-adjustment core gives bundle_adjust's iterations
    bit for bit; the general core (forced by a constant third group) the same to rounding."""
    p = solvers.read_bal(bal_file("problem-49-7776-pre"))
    a = solvers.bundle_adjust(p, device=device, handle_sigint=False, max_iterations=6)
    from solvers.models.snavely import snavely_residual
    prob = solvers.Problem(device=device, backend="codegen")
    prob.add_parameter_block("cameras", p.cameras)
    prob.add_parameter_block("points", p.points)
    prob.add_residual_block(snavely_residual, ["cameras", "points"], index=(p.camera_index, p.point_index),
                            data=p.observations)
    b = solvers.solve(prob, max_iterations=6, handle_sigint=False)
    assert b.core == "bundle-adjustment" and b.state == a.state
    assert [h.cost for h in b.history] == [h.cost for h in a.history]
    assert np.array_equal(b.parameters["cameras"], a.cameras)

    def with_dummy(cam, pt, dummy, obs):
        r = snavely_residual(cam, pt, obs)
        return [r[0] + 0.0 * dummy[0], r[1]]
    g = solvers.Problem(device=device, backend="codegen")
    g.add_parameter_block("cameras", p.cameras)
    g.add_parameter_block("points", p.points)
    g.add_parameter_block("dummy", np.zeros((1, 1)))
    g.set_constant("dummy")
    g.add_residual_block(with_dummy, ["cameras", "points", "dummy"],
                         index=(p.camera_index, p.point_index, np.zeros(p.num_observations, int)), data=p.observations)
    c = solvers.solve(g, max_iterations=6, handle_sigint=False, device_resident=False)
    assert c.core == "general" and len(c.history) == len(a.history)
    for x, y in zip(c.history, a.history):
        assert x.cost == pytest.approx(y.cost, rel=1e-9)
        assert x.step_is_successful == y.step_is_successful
    # Left to itself, the constant group merges into the cameras' rows (solvers.general.merged_groups,
    # a shared column of no step) where the device takes sparse_schur.
    d = solvers.solve(g, max_iterations=6, handle_sigint=False)
    assert d.core == ("bundle-adjustment" if a.state == "device" else "general")
    for x, y in zip(d.history, a.history):
        assert x.cost == pytest.approx(y.cost, rel=1e-9)


def test_device_resident_core_for_other_block_sizes(device):
    """A PINHOLE camera per image (pose and intrinsics in one 10-parameter row) and points: the
    bundle-adjustment core runs it on the device, and it equals the general core."""
    if not device.info.fp64:
        pytest.skip("the device has no fp64")
    s = scene(seed=4, n_cameras=1)
    model = cameras.get("PINHOLE")

    def per_image(cam, point, obs):
        return model.residual(cam[0:6], cam[6:10], point, obs)
    intr = np.array([500.0, 505.0, 320.0, 240.0])
    cams = np.hstack([s["poses"], np.tile(intr, (s["poses"].shape[0], 1))])
    obs = s["obs"]

    def build(dummy):
        prob = solvers.Problem(device=device)
        prob.add_parameter_block("cameras", cams)
        prob.add_parameter_block("points", s["points"])
        if dummy:
            prob.add_parameter_block("dummy", np.zeros((1, 1)))
            prob.set_constant("dummy")
            prob.add_residual_block(lambda c, p, d, o: per_image(c, p, o), ["cameras", "points", "dummy"],
                                    index=(s["img"], s["pt"], np.zeros(s["img"].size, int)), data=obs)
        else:
            prob.add_residual_block(per_image, ["cameras", "points"], index=(s["img"], s["pt"]), data=obs)
        return prob
    a = solvers.solve(build(False), max_iterations=8, handle_sigint=False)
    b = solvers.solve(build(True), max_iterations=8, handle_sigint=False, device_resident=False)
    assert a.core == "bundle-adjustment" and b.core == "general"
    if not device.info.is_simulator:
        assert a.state == "device"
    assert "2,3,10" in a.full_report()
    assert len(a.history) == len(b.history)
    for x, y in zip(a.history, b.history):
        assert x.cost == pytest.approx(y.cost, rel=1e-8)
    # The host reference of the bundle-adjustment core takes these 10 / 3 blocks too, with both
    # linear solvers (split over devices: tests/test_solver_partitioned.py).
    for kw in (dict(), dict(linear_solver="iterative_schur")):
        h = solvers.solve(build(False), max_iterations=8, handle_sigint=False, device_resident=False, **kw)
        assert h.core == "bundle-adjustment" and h.state == "host", kw
        ref = a if "linear_solver" not in kw else solvers.solve(build(False), max_iterations=8, handle_sigint=False,
                                                                 **kw)
        assert len(h.history) == len(ref.history), kw
        for x, y in zip(h.history, ref.history):
            assert x.cost == pytest.approx(y.cost, rel=1e-9), kw


def test_bad_input_names_the_argument():
    prob = solvers.Problem()
    prob.add_parameter_block("x", np.zeros((3, 2)))
    with pytest.raises(ValueError, match="exists already"):
        prob.add_parameter_block("x", np.zeros((1, 2)))
    with pytest.raises(ValueError, match=r"values\[1, 0\] is nan"):
        prob.add_parameter_block("y", np.array([[0.0], [np.nan]]))
    with pytest.raises(KeyError, match="not a parameter group"):
        prob.add_residual_block(lambda a: [a[0]], ["nope"], index=([0],))
    with pytest.raises(IndexError, match=r"index\[0\]\[1\] = 3 is not a row of 'x'"):
        prob.add_residual_block(lambda a: [a[0]], ["x"], index=([0, 3],))
    with pytest.raises(ValueError, match="2 row-index arrays for 1 groups"):
        prob.add_residual_block(lambda a: [a[0]], ["x"], index=([0], [1]))
    with pytest.raises(ValueError, match="data must be"):
        prob.add_residual_block(lambda a, d: [a[0] - d[0]], ["x"], index=([0, 1],), data=np.zeros((3, 1)))
    with pytest.raises(IndexError, match="columns"):
        prob.set_constant("x", columns=[2])
    with pytest.raises(ValueError, match="no residual blocks"):
        solvers.solve(prob)
    prob.add_residual_block(lambda a: [a[0] - 1.0, a[1]], ["x"], index=([0, 1, 2],))
    with pytest.raises(TypeError, match="unknown option"):
        solvers.solve(prob, max_iteration=3)


def test_rows_no_residual_uses_are_held():
    prob = solvers.Problem()
    prob.add_parameter_block("x", np.array([[5.0], [7.0], [9.0]]))
    prob.add_residual_block(lambda a: [a[0] - 1.0], ["x"], index=([0, 2],))
    r = solvers.solve(prob, handle_sigint=False)
    np.testing.assert_allclose(r.parameters["x"][:, 0], [1.0, 7.0, 1.0], atol=1e-9)
    assert r.parameters["x"][1, 0] == 7.0
    assert r.num_parameter_blocks_reduced == 2


def test_bundle_adjust_shares_but_never_changes_the_bal_arrays(device):
    p = solvers.synthetic_problem(8, 200, 4, seed=5)
    before = [a.copy() for a in (p.cameras, p.points, p.observations, p.camera_index, p.point_index)]
    r = solvers.bundle_adjust(p, device=device, handle_sigint=False, max_iterations=3)
    assert r.final_cost < r.initial_cost
    for a, b in zip((p.cameras, p.points, p.observations, p.camera_index, p.point_index), before):
        assert np.array_equal(a, b)
    assert not np.shares_memory(r.cameras, p.cameras)


@pytest.mark.parametrize("dense", [True, False])
def test_pair_reduction_equals_scipy_products(device, monkeypatch, dense):
    """The reduction by pairs of observations (dense or sparse reduced matrix) and scipy's
    sparse products (used when the pairs' index would not fit) give the same iterations."""
    from solvers.general import pair_schur
    s = scene(seed=3)
    if not dense:
        monkeypatch.setattr(factorisation_limits, "DENSE_FILL", 2.0)
    # The host's reductions (schur_backend="numpy"; the device's: test_solver_pair_schur_device).
    kw = dict(max_iterations=10, handle_sigint=False, schur_backend="numpy")
    a = solvers.solve(three_group_problem(s, device=device), **kw)
    monkeypatch.setattr(pair_schur, "MAX_BLOCK_ENTRIES", 0)
    b = solvers.solve(three_group_problem(s, device=device), **kw)
    assert len(a.history) == len(b.history)
    for x, y in zip(a.history, b.history):
        assert x.cost == pytest.approx(y.cost, rel=1e-10)


def test_the_device_is_resolved_once_per_solve(monkeypatch):
    """The planning step resolves the device (clkernels.get_runtime of the problem's name or
    None) once; every model, evaluator, core and state after it gets that runtime. Counted at the
    only place a resolution by name happens: the lookup of get_runtime's cache."""
    import clkernels.runtime as runtime

    class Counting(dict):
        lookups = 0

        def get(self, key, default=None):
            Counting.lookups += 1
            return super().get(key, default)
    monkeypatch.setattr(runtime, "_selected", Counting(runtime._selected))
    p = solvers.synthetic_problem(6, 60, 3, seed=1)
    s = scene(seed=2)
    solves = {
        "bundle_adjust": lambda: solvers.bundle_adjust(p, max_iterations=2, verbose=False),
        "host reference": lambda: solvers.bundle_adjust(p, max_iterations=2, verbose=False, device_resident=False),
        "iterative_schur": lambda: solvers.bundle_adjust(p, max_iterations=2, verbose=False,
                                                         linear_solver="iterative_schur"),
        "general core": lambda: solvers.solve(three_group_problem(s), max_iterations=2, handle_sigint=False),
    }
    for name, run in solves.items():
        Counting.lookups = 0
        result = run()
        assert result.num_successful_steps >= 1, name
        assert Counting.lookups == 1, f"{name}: the device was looked up {Counting.lookups} times"
