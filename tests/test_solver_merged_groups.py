"""solvers.general.merged_groups: a problem whose poses and intrinsics are always used together (a
camera per image, or a camera shared by several images, whose columns then have a copy per
image) solved by the device-resident bundle-adjustment core, with its constant rows and entries
held on the device. Reference: the general core on the host (scipy), the same problem, the same
options: the same iterations, CG steps and costs, the same solution, and the constant entries
untouched."""
import numpy as np
import pytest

import solvers
from solvers.general.merged_groups import merge_groups

from test_solver_problem import scene, three_group_problem


def per_image_problem(n_images, n_points, device=None, loss=None, unused_point=True, n_cameras=None):
    """A camera per image (or ``n_cameras`` shared in turn), the constants of three_group_problem
    (a constant pose, one coordinate of another, the principal point, a constant point), and a
    point nobody sees."""
    s = scene(seed=7, n_images=n_images, n_cameras=n_cameras or n_images, n_points=n_points)
    if unused_point:
        s["points"] = np.vstack([s["points"], [[0.5, -0.5, 4.0]]])
    return three_group_problem(s, with_prior=False, loss=loss, device=device)


def test_merge_takes_groups_used_together_only():
    m = merge_groups(per_image_problem(4, 6), "points")
    assert m is not None and m.block_sizes == [6, 4] and m.merged_name == "poses+intrinsics"
    np.testing.assert_array_equal(m.key_rows[0], np.arange(4))
    np.testing.assert_array_equal(m.key_rows[1], np.arange(4))
    free = np.ones((4, 10), bool)
    free[0, :6] = False                  # the constant pose
    free[2, 5] = False                   # one coordinate of another
    free[:, 6 + 1:6 + 3] = False         # the principal point
    np.testing.assert_array_equal(m.free, free)
    assert not m.free_points[5].any() and m.free_points[:5].all()
    # |x| leaves out what the general core's state leaves out: the constant pose, the constant
    # point and the unused one.
    p = m.original.groups
    want = np.sum(p["poses"].values[0] ** 2) + np.sum(p["points"].values[[5, 6]] ** 2)
    assert m.excluded_sq == pytest.approx(want, rel=1e-15)
    assert m.copies is None
    # A camera shared by two images: merged only with copies. A second residual kind over the
    # merged groups only (a prior on poses) joins the first as one tagged kind, its blocks each
    # observing a constant point of their own, dropped from the solution; with another loss, or
    # over the eliminated group too, the problem stays the general core's.
    shared = per_image_problem(4, 6, n_cameras=2)
    assert merge_groups(shared, "points") is None
    with_prior = three_group_problem(scene(n_images=4, n_cameras=4), with_prior=True)
    u = merge_groups(with_prior, "points")
    n_obs, n_pts = with_prior.residuals[0].num_blocks, with_prior.groups["points"].num_rows
    assert u is not None and u.problem.residuals[0].num_blocks == n_obs + 2
    points = u.problem.groups["points"]
    assert points.num_rows == n_pts + 2 and not u.free_points[n_pts:].any()
    tags = u.problem.residuals[0].data[:, 0]
    assert (tags[:n_obs] == 0).all() and (tags[n_obs:] == 1).all()
    solved = {u.merged_name: u.problem.groups[u.merged_name].values, "points": points.values}
    assert u.parameters(solved)["points"].shape == (n_pts, 3)
    assert merge_groups(three_group_problem(scene(n_images=4, n_cameras=4), loss="huber"), "points") is None
    m = merge_groups(shared, "points", shared=True)
    column, count = m.copies
    column, count = column.reshape(4, 10), count.reshape(4, 10)
    # Images 0 and 2 share camera 0, images 1 and 3 camera 1: their free intrinsics (f, k) are
    # one column each, with the first image's copy counted; the principal point is constant.
    assert (column[:, 7:9] == -1).all() and (column[0, :6] == -1).all()
    assert column[0, 6] == column[2, 6] and column[1, 9] == column[3, 9] and column[0, 6] != column[1, 6]
    assert count[:2].all() and not count[2:, 6:].any() and count[2:, :6].all()
    assert m.num_columns == np.unique(column[column >= 0]).size == 6 + 5 + 6 + 4
    p = shared.groups
    want = np.sum(p["poses"].values[0] ** 2) + np.sum(p["points"].values[[5, 6]] ** 2)
    assert m.excluded_sq == pytest.approx(want, rel=1e-15)


def test_parameters_split_back():
    prob = per_image_problem(3, 5)
    m = merge_groups(prob, "points")
    solved = {"poses+intrinsics": np.arange(30, dtype=float).reshape(3, 10), "points": prob.groups["points"].values}
    out = m.parameters(solved)
    np.testing.assert_array_equal(out["poses"], np.arange(30).reshape(3, 10)[:, :6])
    np.testing.assert_array_equal(out["intrinsics"], np.arange(30).reshape(3, 10)[:, 6:])


@pytest.mark.oclgrind
@pytest.mark.parametrize("linear_solver,cameras", [("sparse_schur", "per-image"), ("iterative_schur", "per-image"),
                                                   ("sparse_schur", "two shared"), ("sparse_schur", "one shared")])
def test_merged_solve_equals_the_general_core(device, linear_solver, cameras):
    if not device.info.fp64:
        pytest.skip("sparse_schur on the device needs fp64; the general core serves this device")
    tiny = device.info.is_simulator
    n_images, n_points, its = (3, 8, 3) if tiny else (6, 40, 20)
    n_cameras = {"per-image": None, "two shared": 2, "one shared": 1}[cameras]
    kw = dict(linear_solver=linear_solver, max_iterations=its, handle_sigint=False)
    prob = per_image_problem(n_images, n_points, device=device, loss="huber", n_cameras=n_cameras)
    before = {k: g.values.copy() for k, g in prob.groups.items()}
    a = solvers.solve(prob, **kw)
    b = solvers.solve(prob, device_resident=False, **kw)
    assert (a.core, a.state) == ("bundle-adjustment", "device")
    assert (b.core, b.state) == ("general", "host")
    assert ("summed from the keys'" in a.linear_solver_detail) == (n_cameras is not None)
    assert len(a.history) == len(b.history) >= 3
    for x, y in zip(a.history, b.history):
        assert x.linear_solver_iterations == y.linear_solver_iterations
        assert x.step_is_successful == y.step_is_successful
        # CG's rounding differs (the sums run in another order) and grows over iterations of
        # 20-30 CG steps; the factorised steps agree throughout.
        rel = 1e-8 if linear_solver == "sparse_schur" or x.iteration < 3 else 1e-3
        for field in ("cost", "gradient_max_norm", "step_norm", "trust_region_radius"):
            assert getattr(x, field) == pytest.approx(getattr(y, field), rel=rel, abs=1e-12), field
    assert a.termination_type == b.termination_type
    assert a.final_cost == pytest.approx(b.final_cost, rel=1e-9)
    tol = 1e-9 if linear_solver == "sparse_schur" else 1e-5
    for k in before:
        np.testing.assert_allclose(a.parameters[k], b.parameters[k], rtol=tol, atol=tol)
    # The constant entries and the unused point are the given values, bit for bit.
    np.testing.assert_array_equal(a.parameters["poses"][0], before["poses"][0])
    assert a.parameters["poses"][2, 5] == before["poses"][2, 5]
    np.testing.assert_array_equal(a.parameters["intrinsics"][:, 1:3], before["intrinsics"][:, 1:3])
    np.testing.assert_array_equal(a.parameters["points"][[5, -1]], before["points"][[5, -1]])
    assert not np.array_equal(a.parameters["poses"][1], before["poses"][1])
    # The report counts the original problem's blocks and parameters, as the general core does.
    for field in ("num_parameter_blocks", "num_parameters", "num_parameter_blocks_reduced",
                  "num_parameters_reduced", "num_effective_parameters", "num_residuals", "schur_structure"):
        assert getattr(a, field) == getattr(b, field), field


def test_what_the_merge_does_not_serve_goes_to_the_general_core(device, tmp_path):
    """A checkpoint, device_resident=False, the numpy Schur backend, and a shared camera with
    iterative_schur (CG over the keys' columns would not be Ceres' CG): the general core."""
    prob = per_image_problem(3, 8, device=device)
    for kw in (dict(device_resident=False), dict(schur_backend="numpy"),
               dict(checkpoint=str(tmp_path / "ck.npz"))):
        r = solvers.solve(prob, max_iterations=2, handle_sigint=False, **kw)
        assert r.core == "general"
    r = solvers.solve(per_image_problem(3, 8, device=device, n_cameras=1), linear_solver="iterative_schur",
                      max_iterations=2, handle_sigint=False)
    assert r.core == "general"


def test_a_sparse_camera_graph_with_a_shared_camera_stays_sparse_on_a_cpu(device):
    """A chain of 180 images with one camera, each point seen by two neighbours: 1,078 columns,
    a banded reduced matrix. On a CPU device (LAPACK's dense Cholesky on the host) the merge is
    not taken and the general core factorises it sparse; on a GPU the device factorises it
    densely."""
    if not device.info.fp64 or device.info.is_simulator:
        pytest.skip("the device-resident core needs fp64; a chain is no tiny shape")
    n_images, per = 180, 6
    rng = np.random.default_rng(3)
    poses = np.zeros((n_images, 6))
    poses[:, 1] = 0.01
    poses[:, 3] = -0.5 * np.arange(n_images)
    poses[:, 5] = 5.0
    points = np.column_stack([0.5 * np.repeat(np.arange(n_images), per) / 1.0 + rng.normal(0, 0.3, n_images * per),
                              rng.normal(0, 1, n_images * per), rng.normal(0, 1, n_images * per)])
    img = np.concatenate([np.repeat(np.arange(n_images), per), np.minimum(np.repeat(np.arange(n_images), per) + 1,
                                                                           n_images - 1)])
    pt = np.concatenate([np.arange(n_images * per)] * 2)
    keep = ~((img == n_images - 1) & (pt >= (n_images - 1) * per) & (np.arange(img.size) >= n_images * per))
    img, pt = img[keep], pt[keep]
    prob = solvers.Problem(device=device)
    prob.add_parameter_block("poses", poses)
    prob.add_parameter_block("intrinsics", np.array([[500.0, 320.0, 240.0, 0.0]]))
    prob.add_parameter_block("points", points)
    from solvers.models import cameras
    prob.add_residual_block(cameras.get("SIMPLE_RADIAL").residual, ["poses", "intrinsics", "points"],
                            index=(img, np.zeros_like(img), pt), data=rng.normal(320, 50, (img.size, 2)))
    prob.set_constant("poses", rows=[0])
    prob.set_constant("intrinsics", columns=[1, 2])
    m = merge_groups(prob, "points", shared=True)
    assert m.num_columns == (n_images - 1) * 6 + 2 > 1000
    r = solvers.solve(prob, max_iterations=1, handle_sigint=False)
    assert r.core == ("general" if device.info.is_cpu else "bundle-adjustment")


@pytest.mark.oclgrind
def test_a_shared_camera_solves_in_mixed_precision_as_in_float64(device, monkeypatch):
    """The keys' matrix summed into the shared camera's columns and factorised on the device,
    in float32 refined in float64 (solvers.linalg.mixed_cholesky_device) and in float64: the same
    steps (the device factorises here whatever its kind)."""
    if not device.info.fp64:
        pytest.skip("sparse_schur on the device needs fp64")
    from solvers.linalg import factorisation_limits
    monkeypatch.setattr(factorisation_limits, "DEVICE_DENSE_MAX_CPU", 10 ** 6)
    n_images, n_points, its = (3, 8, 3) if device.info.is_simulator else (6, 40, 20)
    prob = per_image_problem(n_images, n_points, device=device, loss="huber", n_cameras=1)
    kw = dict(linear_solver="sparse_schur", max_iterations=its, handle_sigint=False)
    a = solvers.solve(prob, mixed_precision_solves=True, **kw)
    b = solvers.solve(prob, **kw)
    assert a.state == b.state == "device"
    assert "summed from the keys'" in a.linear_solver_detail
    assert "(float32, refined in float64)" in a.linear_solver_detail
    assert "float32" not in b.linear_solver_detail
    assert [x.step_is_successful for x in a.history] == [y.step_is_successful for y in b.history]
    np.testing.assert_allclose([x.cost for x in a.history], [y.cost for y in b.history], rtol=1e-10)
    for k in a.parameters:
        np.testing.assert_allclose(a.parameters[k], b.parameters[k], rtol=1e-9, atol=1e-9)
