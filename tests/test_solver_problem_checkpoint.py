"""checkpoint= and resume= on a general problem (solvers.Problem on the general core):
every group's table at the best state, written atomically; a resumed solve reaches the
uninterrupted one's cost; checkpoints of other problems are refused."""
import os

import numpy as np
import pytest

import solvers
from solvers.loop.checkpoint import PROBLEM_FORMAT, ProblemCheckpoint, load_checkpoint, structure_fingerprint

from test_solver_problem import scene, three_group_problem

KW = dict(linear_solver="sparse_schur", handle_sigint=False, function_tolerance=1e-12,
          gradient_tolerance=1e-14, parameter_tolerance=1e-14)


def numpy_problem(seed=2):
    """The three-group SIMPLE_RADIAL scene (poses, shared intrinsics, points; constant rows,
    columns and one entry; a second residual kind), evaluated in numpy on the host."""
    prob = three_group_problem(scene(seed))
    prob.backend = "numpy"
    return prob


def test_the_checkpoint_holds_every_groups_table_at_the_best_state(tmp_path):
    prob = numpy_problem()
    path = tmp_path / "ck.npz"
    r = solvers.solve(prob, max_iterations=4, checkpoint=str(path), **KW)
    assert r.core == "general" and r.checkpoint_iteration == 4
    ck = load_checkpoint(path)
    assert isinstance(ck, ProblemCheckpoint) and ck.iteration == 4 and ck.finished
    assert ck.termination_type == r.termination_type
    assert ck.cost == pytest.approx(r.final_cost, rel=1e-12)
    assert set(ck.tables) == {"poses", "intrinsics", "points"}
    for name, table in r.parameters.items():
        np.testing.assert_array_equal(ck.tables[name], table)
    # The constant parts are the problem's own, untouched.
    np.testing.assert_array_equal(ck.tables["poses"][0], prob.groups["poses"].values[0])
    np.testing.assert_array_equal(ck.tables["intrinsics"][:, 1:3], prob.groups["intrinsics"].values[:, 1:3])
    with np.load(path) as z:
        assert str(z["format"]) == PROBLEM_FORMAT and "group:points" in z.files
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".pyclad-tmp")]     # no temporary left


def test_a_resumed_solve_reaches_the_uninterrupted_cost(tmp_path):
    """Stopped after 3 iterations (as a kill would leave it), then resumed from its checkpoint:
    the resumed solve starts from the checkpoint's cost, counts on from its iteration, and ends
    where the uninterrupted solve ends."""
    full = solvers.solve(numpy_problem(), max_iterations=30, **KW)
    path = tmp_path / "ck.npz"
    first = solvers.solve(numpy_problem(), max_iterations=3, checkpoint=str(path), **KW)
    ck = load_checkpoint(path)
    assert ck.iteration == 3 and ck.cost == pytest.approx(first.final_cost, rel=1e-12)
    resumed = solvers.solve(numpy_problem(), max_iterations=27, resume=str(path), checkpoint=str(path), **KW)
    assert resumed.resumed_iteration == 3
    assert resumed.initial_cost == pytest.approx(ck.cost, rel=1e-10)
    assert resumed.final_cost == pytest.approx(full.final_cost, rel=1e-8)
    assert load_checkpoint(path).iteration == 3 + resumed.iterations
    for name in ("poses", "intrinsics", "points"):
        np.testing.assert_allclose(resumed.parameters[name], full.parameters[name], rtol=1e-5, atol=1e-7)


def test_constant_values_come_from_the_problem_not_the_checkpoint(tmp_path):
    """Constant entries changed after the checkpoint was written keep the problem's values:
    a constant column and a single constant entry, both in rows that take steps."""
    path = tmp_path / "ck.npz"
    solvers.solve(numpy_problem(), max_iterations=2, checkpoint=str(path), **KW)
    prob = numpy_problem()
    prob.groups["intrinsics"].values[0, 1] += 3.0           # the principal point's x: a constant column
    prob.groups["poses"].values[2, 5] += 0.25               # one constant entry of pose 2
    r = solvers.solve(prob, max_iterations=1, resume=str(path), **KW)
    assert r.parameters["intrinsics"][0, 1] == prob.groups["intrinsics"].values[0, 1]
    assert r.parameters["poses"][2, 5] == prob.groups["poses"].values[2, 5]
    assert load_checkpoint(path).tables["intrinsics"][0, 1] != prob.groups["intrinsics"].values[0, 1]


def test_checkpoints_of_other_problems_are_refused(tmp_path):
    path = tmp_path / "ck.npz"
    solvers.solve(numpy_problem(), max_iterations=1, checkpoint=str(path), **KW)
    other = three_group_problem(scene(2), with_prior=False)     # another residual kind set
    other.backend = "numpy"
    with pytest.raises(solvers.CheckpointError, match="another problem"):
        solvers.solve(other, resume=str(path), **KW)
    smaller = three_group_problem(scene(2, n_points=30))
    with pytest.raises(solvers.CheckpointError, match="written for groups"):
        solvers.solve(smaller, resume=str(path), **KW)
    # A bundle adjustment's checkpoint for a general problem, and the other way round.
    bal = solvers.synthetic_problem(4, 20, 3, seed=1)
    bal_path = tmp_path / "bal.npz"
    solvers.bundle_adjust(bal, max_iterations=1, checkpoint=str(bal_path), handle_sigint=False,
                          device_resident=False, schur_backend="numpy", backend="numpy")
    with pytest.raises(solvers.CheckpointError, match="general core"):
        solvers.solve(numpy_problem(), resume=str(bal_path), **KW)
    with pytest.raises(solvers.CheckpointError, match="general problem"):
        solvers.bundle_adjust(bal, resume=str(path), handle_sigint=False, backend="numpy")


def test_the_fingerprint_follows_structure_not_values():
    a, b = numpy_problem(), numpy_problem()
    b.groups["points"].values[:] += 1.0                     # values: what a solve changes
    assert structure_fingerprint(a) == structure_fingerprint(b)
    b.set_constant("points", rows=[7])                       # what is constant: structure
    assert structure_fingerprint(a) != structure_fingerprint(b)


def test_the_bundle_adjustment_core_checkpoints_cameras_of_any_size(device, tmp_path):
    """A 10-parameter PINHOLE camera per image (pose and intrinsics in one row) runs the
    bundle-adjustment core; its checkpoint keeps the rows' widths and resumes the same cost."""
    if not device.info.fp64:
        pytest.skip("the device has no fp64")
    from solvers.models import cameras
    s = scene(seed=4, n_cameras=1)
    model = cameras.get("PINHOLE")
    cams = np.hstack([s["poses"], np.tile([500.0, 505.0, 320.0, 240.0], (s["poses"].shape[0], 1))])

    def build():
        prob = solvers.Problem(device=device)
        prob.add_parameter_block("cameras", cams)
        prob.add_parameter_block("points", s["points"])
        prob.add_residual_block(lambda c, p, o: model.residual(c[0:6], c[6:10], p, o), ["cameras", "points"],
                                index=(s["img"], s["pt"]), data=s["obs"])
        return prob
    path = tmp_path / "ba.npz"
    r = solvers.solve(build(), max_iterations=2, checkpoint=str(path), **KW)
    assert r.core == "bundle-adjustment"
    ck = load_checkpoint(path)
    assert ck.cameras.shape == (cams.shape[0], 10) and ck.points.shape == s["points"].shape
    np.testing.assert_array_equal(ck.cameras, r.parameters["cameras"])
    resumed = solvers.solve(build(), max_iterations=1, resume=str(path), **KW)
    assert resumed.initial_cost == pytest.approx(r.final_cost, rel=1e-9)
