"""Bundle adjustment split over devices and MPI ranks (solvers.split.partitioned: the host reference
path, and solvers.split.partitioned_device: every part's state on its device): the split solve against
the one-device solve (the same iterations; final cost to 1e-9 relative) on real BAL problems and a
synthetic one, on two real PoCL devices and two real MPI ranks (Open MPI's mpirun); every kernel
of a split on Oclgrind; a failing rank; bad arguments."""
import json
import sys
import textwrap

import numpy as np
import pytest

import solvers
from solvers.split.parts import point_ranges

from bal_data import bal_file
from mpi_ranks import run_ranks
from pocl_pair import run_on_two_devices


def _run_mpi(script: str, n: int = 2, timeout: int = 600):
    return run_ranks(["-n", str(n), sys.executable, "-W", "ignore", "-c", script], timeout)


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_point_ranges_cover_the_points_with_balanced_observations(parts):
    p = solvers.synthetic_problem(5, 1000, 4, seed=3)
    ranges = point_ranges(p.point_index, p.num_points, parts)
    assert ranges[0][0] == 0 and ranges[-1][1] == p.num_points and len(ranges) == parts
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(parts - 1))
    counts = [np.count_nonzero((p.point_index >= a) & (p.point_index < b)) for a, b in ranges]
    assert max(counts) - min(counts) <= 2 * np.bincount(p.point_index).max()


@pytest.mark.parametrize("layout", ["camera_major", "shuffled"])
@pytest.mark.parametrize("parts", [1, 3])
def test_part_evaluators_hold_each_ranges_observations_as_a_mask_and_sort_would(layout, parts):
    # A part's observations are sliced from the whole problem's point order; the reference here
    # masks the range in file order and sorts stably with numpy, as the specification says.
    from solvers.ba.evaluator import Evaluator
    from solvers.models.loss import Loss
    from solvers.split.parts import part_evaluators
    from solvers.ba.observation_index import ObservationIndex

    p = solvers.synthetic_problem(6, 300, 3, seed=5)
    ci, pi, obs = p.camera_index, p.point_index, p.observations
    if layout == "shuffled":
        perm = np.random.default_rng(1).permutation(ci.size)
        ci, pi, obs = ci[perm], pi[perm], obs[perm]
    whole = Evaluator(ObservationIndex(ci, pi, obs, p.num_cameras, p.num_points, "whole"), Loss(), model=_RecordModel)
    ranges = point_ranges(pi, p.num_points, parts)

    def make(sub, runtime, camera_order):
        return Evaluator(sub, Loss(), model=_RecordModel, camera_order=camera_order)
    evs = part_evaluators(make, whole, [None] * parts, ranges)
    assert [(lo, hi) for _, _, lo, hi in evs] == ranges
    for ev, _, lo, hi in evs:
        keep = (pi >= lo) & (pi < hi)
        order = np.argsort(pi[keep], kind="stable")
        want_cam, want_pt, want_obs = ci[keep][order], pi[keep][order] - lo, obs[keep][order]
        np.testing.assert_array_equal(ev.model.cam, want_cam)
        np.testing.assert_array_equal(ev.model.pt, want_pt)
        np.testing.assert_array_equal(ev.model.obs, want_obs)
        assert (ev.nc, ev.npt) == (p.num_cameras, hi - lo)
        np.testing.assert_array_equal(ev.camera_order(), np.argsort(want_cam, kind="stable"))


class _RecordModel:
    """A model that only keeps what it was built from (the part evaluators' inputs)."""
    sizes = (9, 3)

    def __init__(self, cam, pt, obs, dtype=None, device=None):
        self.cam, self.pt, self.obs = np.asarray(cam), np.asarray(pt), np.asarray(obs)


def _same_solve(single, split, rtol=1e-9):
    """The same iterations (accepted and rejected steps), the final cost to rtol."""
    assert split["iterations"] == single["iterations"]
    assert split["successful"] == single["successful"]
    assert abs(split["final_cost"] - single["final_cost"]) <= rtol * single["final_cost"]
    np.testing.assert_allclose(split["costs"], single["costs"], rtol=1e-7)


SUMMARY = """
def summary(r):
    return {"iterations": len(r.history), "successful": r.num_successful_steps,
            "final_cost": r.final_cost, "costs": [h.cost for h in r.history], "state": r.state,
            "termination": r.termination_type, "bytes": r.transfers.get("reduced_bytes", 0)}
"""


@pytest.mark.slow
@pytest.mark.parametrize("name,linear_solver,loss", [
    ("problem-49-7776-pre", "sparse_schur", None),
    ("problem-21-11315-pre", "iterative_schur", "huber"),
    (None, "sparse_schur", "cauchy"),           # synthetic
])
def test_two_devices_solve_as_one(name, linear_solver, loss):
    path = str(bal_file(name)) if name else None
    out = run_on_two_devices(SUMMARY + textwrap.dedent(f"""
        import json, solvers
        p = solvers.read_bal({path!r}) if {path!r} else solvers.synthetic_problem(12, 800, 5, seed=4)
        kw = dict(linear_solver={linear_solver!r}, loss={loss!r}, max_iterations=8)
        one = solvers.bundle_adjust(p, device=pair[0], device_resident=False, **kw)
        reference = solvers.bundle_adjust(p, device=pair[0], **kw)   # the default: device-resident
        two = solvers.bundle_adjust(p, devices=pair, **kw)
        two_host = solvers.bundle_adjust(p, devices=pair, device_resident=False, **kw)
        print(json.dumps({{"one": summary(one), "reference": summary(reference), "two": summary(two),
                          "two_host": summary(two_host),
                          "points": float(abs(two.points - one.points).max() / abs(one.points).max()), "detail": two.linear_solver_detail}}))
    """))
    # iterative_schur keeps the parts on their devices; sparse_schur sums S on the host
    state = "partitioned-device" if linear_solver == "iterative_schur" else "partitioned"
    assert out["two"]["state"] == state and "2 devices" in out["detail"]
    _same_solve(out["one"], out["two"])
    _same_solve(out["reference"], out["two"])
    assert out["two_host"]["state"] == "partitioned"          # the reference path, asked for
    _same_solve(out["one"], out["two_host"])
    assert out["points"] < 1e-6       # (relative to the largest coordinate)
    assert out["two"]["bytes"] > 0


def test_two_devices_split_other_block_sizes():
    """A camera of 10 parameters (BAL's 9 and an offset of the first residual): the split's host
    reference (the parts' reduced matrices summed) and the parts on their devices solve it as the
    one-device host reference and the device-resident core do."""
    out = run_on_two_devices(SUMMARY + textwrap.dedent("""
        import json, numpy as np, solvers
        from solvers.models.snavely import snavely_residual
        p = solvers.synthetic_problem(10, 300, 4, seed=6)

        def offset(c, x, o):
            r = snavely_residual(c[0:9], x, o)
            return [r[0] + c[9], r[1]]

        def build(device):
            prob = solvers.Problem(device=device)
            prob.add_parameter_block("cameras", np.hstack([p.cameras, np.full((p.num_cameras, 1), 0.5)]))
            prob.add_parameter_block("points", p.points)
            prob.add_residual_block(offset, ["cameras", "points"], index=(p.camera_index, p.point_index),
                                    data=p.observations)
            return prob
        out = {}
        for ls in ("sparse_schur", "iterative_schur"):
            kw = dict(linear_solver=ls, max_iterations=8, handle_sigint=False)
            out[ls] = {"one": summary(solvers.solve(build(pair[0]), device_resident=False, **kw)),
                       "device": summary(solvers.solve(build(pair[0]), **kw)),
                       "two": summary(solvers.solve(build(pair[0]), devices=pair, **kw)),
                       "two_host": summary(solvers.solve(build(pair[0]), devices=pair, device_resident=False, **kw))}
        print(json.dumps(out))
    """))
    for ls, runs in out.items():
        assert runs["one"]["state"] == "host" and runs["two_host"]["state"] == "partitioned", ls
        assert runs["two"]["state"] == ("partitioned" if ls == "sparse_schur" else "partitioned-device"), ls
        assert runs["one"]["iterations"] >= 3
        for other in ("device", "two", "two_host"):
            _same_solve(runs["one"], runs[other])


@pytest.mark.slow
def test_two_devices_solve_in_float32():
    """float32 storage on both parts (sums in float64). The products are summed in another order
    (per part, then over the parts), which float32's CG vectors amplify, so the trajectories part
    from the one-device float32 solve's after a few iterations: both end where float64 does, to
    float32's accuracy (as the one-device float32 tests hold it)."""
    path = str(bal_file("problem-49-7776-pre"))
    out = run_on_two_devices(SUMMARY + textwrap.dedent(f"""
        import json, numpy as np, solvers
        p = solvers.read_bal({path!r})
        kw = dict(linear_solver="iterative_schur", max_iterations=6)
        f64 = solvers.bundle_adjust(p, device=pair[0], **kw)
        one = solvers.bundle_adjust(p, device=pair[0], dtype=np.float32, **kw)
        two = solvers.bundle_adjust(p, devices=pair, dtype=np.float32, **kw)
        print(json.dumps({{"f64": summary(f64), "one": summary(one), "two": summary(two)}}))
    """))
    assert out["one"]["state"] == "device" and out["two"]["state"] == "partitioned-device"
    assert out["two"]["iterations"] == out["f64"]["iterations"]
    for r in (out["one"], out["two"]):
        assert abs(r["final_cost"] - out["f64"]["final_cost"]) <= 1e-3 * out["f64"]["final_cost"]
    assert out["two"]["final_cost"] < 0.02 * out["two"]["costs"][0]


@pytest.mark.parametrize("cap", [3, 12])
def test_a_split_cg_stops_as_the_devices_cg(device, cap):
    """The split CG (one iteration at a time, products summed over the parts) ends where the
    one-device CG does: at its iteration cap (3), and past a residual reset (every 10)."""
    if not device.info.fp64:
        pytest.skip("float64 bundle adjustment needs fp64")
    p = solvers.synthetic_problem(12, 800, 5, seed=4)
    kw = dict(linear_solver="iterative_schur", max_iterations=6, eta=1e-6, max_linear_solver_iterations=cap,
              handle_sigint=False)
    one = solvers.bundle_adjust(p, device=device, **kw)
    split = solvers.bundle_adjust(p, devices=[device], **kw)
    assert split.state == "partitioned-device"
    its = [h.linear_solver_iterations for h in split.history]
    assert its == [h.linear_solver_iterations for h in one.history] and max(its) == cap
    assert abs(split.final_cost - one.final_cost) <= 1e-9 * one.final_cost


@pytest.mark.oclgrind
def test_a_split_on_its_devices_tiny_problem(device, keep_on_simulator):
    """Every kernel of a part (solvers.split.partitioned_device) on a tiny problem, Oclgrind too (which
    must report nothing): a split over a list of one device solves as the device-resident solve."""
    if not device.info.fp64:
        pytest.skip("float64 bundle adjustment needs fp64")
    from test_solver_lm_device import assert_same_solve
    p = solvers.synthetic_problem(4, 12, 3, seed=9)
    kw = dict(linear_solver="iterative_schur", max_iterations=2, loss="huber", handle_sigint=False)
    one = solvers.bundle_adjust(p, device=device, device_resident=True, **kw)
    split = solvers.bundle_adjust(p, devices=[device], device_resident=True, **kw)
    assert one.state == "device" and split.state == "partitioned-device"
    assert_same_solve(one, split)


@pytest.mark.slow
@pytest.mark.parametrize("linear_solver", ["sparse_schur", "iterative_schur"])
def test_two_mpi_ranks_solve_as_one(linear_solver, tmp_path):
    path = str(bal_file("problem-49-7776-pre"))
    single = solvers.bundle_adjust(solvers.read_bal(path), linear_solver=linear_solver, max_iterations=6,
                                   device_resident=False)
    run = _run_mpi(SUMMARY + textwrap.dedent(f"""
        import json, solvers
        from mpi4py import MPI
        p = solvers.read_bal({path!r})
        r = solvers.bundle_adjust(p, linear_solver={linear_solver!r}, max_iterations=6, comm=MPI.COMM_WORLD)
        s = summary(r)
        s["rank"], s["points_sum"] = MPI.COMM_WORLD.Get_rank(), float(r.points.sum())
        # a file per rank: the ranks' prints can interleave within a line of the shared stdout
        with open({str(tmp_path)!r} + f"/rank{{s['rank']}}.json", "w") as f:
            json.dump(s, f)
    """))
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(s["rank"] for s in ranks) == [0, 1]
    state = "partitioned-device" if linear_solver == "iterative_schur" else "partitioned"
    assert all(s["state"] == state for s in ranks)
    want = {"iterations": len(single.history), "successful": single.num_successful_steps,
            "final_cost": single.final_cost, "costs": [h.cost for h in single.history]}
    for s in ranks:        # every rank ends with the whole solution
        _same_solve(want, s)
        assert abs(s["points_sum"] - single.points.sum()) < 1e-6 * abs(single.points).sum()
    assert ranks[0]["points_sum"] == ranks[1]["points_sum"]


@pytest.mark.slow
def test_the_cli_under_mpirun_prints_once_and_writes_on_rank_0(tmp_path):
    out = tmp_path / "solved.txt"
    run = run_ranks(["-n", "2", sys.executable, "-W", "ignore", "-m", "solvers.bal",
                     "--synthetic", "10,500,4", "--iterations", "5", "--mpi", "--out", str(out)], 600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("Solver Summary") == 1 and "MPI: 2 ranks" in run.stdout
    assert "Points split over 2 MPI ranks" in run.stdout
    # (split, the command line solves by iterative_schur)
    single = solvers.bundle_adjust(solvers.synthetic_problem(10, 500, 4, seed=0), max_iterations=5,
                                   linear_solver="iterative_schur")
    written = solvers.read_bal(str(out))
    np.testing.assert_allclose(written.points, single.points, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_a_colmap_reconstruction_on_two_devices(tmp_path):
    """A COLMAP problem with a camera per image (merged pose and intrinsics rows, the gauge and
    the principal points held constant on the devices) split over two devices: the one-device
    solve's iterations and parameters; images that share a camera are refused by name."""
    from test_solver_colmap_problem import synthetic
    _, path = synthetic(tmp_path, n_images=12, per_image_cameras=True)
    _, shared = synthetic(tmp_path / "shared", n_images=8) if (tmp_path / "shared").mkdir() is None else None
    out = run_on_two_devices(SUMMARY + textwrap.dedent(f"""
        import json, numpy as np, solvers
        from solvers import colmap
        def problem(path):
            return colmap.problem_from_reconstruction(colmap.read_model(path), device=pair[0])
        kw = dict(linear_solver="iterative_schur", max_iterations=10, handle_sigint=False)
        one = solvers.solve(problem({path!r}), **kw)
        two = solvers.solve(problem({path!r}), devices=pair, **kw)
        diff = {{k: float(np.abs(one.parameters[k] - two.parameters[k]).max() / np.abs(one.parameters[k]).max())
                for k in one.parameters}}
        try:
            solvers.solve(problem({shared!r}), devices=pair, linear_solver="sparse_schur", max_iterations=2)
            refused = ""
        except ValueError as e:
            refused = str(e)
        print(json.dumps({{"one": summary(one), "two": summary(two), "diff": diff, "refused": refused,
                          "effective": [one.num_effective_parameters, two.num_effective_parameters]}}))
    """))
    assert out["one"]["state"] == "device" and out["two"]["state"] == "partitioned-device"
    _same_solve(out["one"], out["two"])
    assert max(out["diff"].values()) < 1e-9
    assert out["effective"][0] == out["effective"][1]
    assert "here images share a camera" in out["refused"]


def _colmap_under_mpirun(model, *extra, n=2):
    return run_ranks(["-n", str(n), sys.executable, "-W", "ignore", "-m", "solvers.colmap", model, "--mpi", *extra],
                     600)


@pytest.mark.slow
def test_the_colmap_cli_under_mpirun(tmp_path):
    """A COLMAP reconstruction with a camera per image over 2 ranks: one log, the model written
    by rank 0, equal to the one-process solve's (iterative_schur, the split's default)."""
    from solvers import colmap
    from test_solver_colmap_problem import synthetic
    _, path = synthetic(tmp_path, n_images=12, per_image_cameras=True)
    out = tmp_path / "refined"
    run = _colmap_under_mpirun(path, "--out", str(out), "--iterations", "10")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("Solver Summary") == 1 and "MPI: 2 ranks" in run.stdout
    assert "Points split over 2 MPI ranks" in run.stdout
    rec = colmap.read_model(path)
    single = solvers.solve(colmap.problem_from_reconstruction(rec), linear_solver="iterative_schur",
                           max_iterations=10, handle_sigint=False)
    assert single.state == "device"
    colmap.update_reconstruction(rec, single)
    written = colmap.read_model(str(out))
    np.testing.assert_allclose(written.point_xyz, rec.point_xyz, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.concatenate(written.camera_params), np.concatenate(rec.camera_params), rtol=1e-6)
    np.testing.assert_allclose(written.image_qvec, rec.image_qvec, atol=1e-7)


@pytest.mark.slow
def test_the_colmap_cli_refuses_a_split_of_a_shared_camera(tmp_path):
    """Images that share a camera: every rank ends with the reason, none waits."""
    from test_solver_colmap_problem import synthetic
    _, path = synthetic(tmp_path, n_images=8, per_image_cameras=False)
    run = _colmap_under_mpirun(path, "--iterations", "3")
    assert run.returncode == 2
    assert "this problem runs on one device" in run.stderr


@pytest.mark.slow
@pytest.mark.parametrize("module,state,linear_solver", [
    ("partitioned", "PartitionedState", "sparse_schur"),
    ("partitioned_device", "PartitionedDeviceState", "iterative_schur")])
def test_a_failing_rank_ends_every_rank_with_a_message(module, state, linear_solver):
    run = _run_mpi(textwrap.dedent(f"""
        from mpi4py import MPI
        import solvers.split.{module} as part
        from solvers.bal.__main__ import main
        if MPI.COMM_WORLD.Get_rank() == 1:
            calls = []
            original = part.{state}.solve_step
            def failing(self, *a, **k):
                calls.append(1)
                if len(calls) == 2:
                    raise RuntimeError("device lost (injected)")
                return original(self, *a, **k)
            part.{state}.solve_step = failing
        main(["--synthetic", "10,300,4", "--iterations", "10", "--mpi", "--linear-solver", "{linear_solver}"])
    """), timeout=120)
    assert run.returncode != 0
    assert "MPI rank 1 of 2 failed (RuntimeError: device lost (injected)); ending every rank" in run.stderr


def test_bad_arguments_are_named():
    p = solvers.synthetic_problem(5, 100, 3, seed=1)
    with pytest.raises(ValueError, match="devices must be a list of devices or 'all'"):
        solvers.bundle_adjust(p, devices="both", max_iterations=1)
    with pytest.raises(TypeError, match="comm must be an mpi4py communicator"):
        solvers.bundle_adjust(p, comm=object(), max_iterations=1)
    with pytest.raises(ValueError, match="device_resident=True, but a split sparse_schur sums the parts' "
                                         "reduced camera matrices on the host"):
        solvers.bundle_adjust(p, devices="all", device_resident=True, max_iterations=1)
    with pytest.raises(ValueError, match="point_ranges|at least 1"):
        point_ranges(p.point_index, p.num_points, 0)
    # a problem that is not a bundle adjustment runs on one device
    prob = solvers.Problem()
    prob.add_parameter_block("x", np.ones((1, 2)))
    prob.add_residual_block(lambda x: [x[0] - 1.0, x[1] - 2.0], ["x"], index=(np.array([0]),))
    with pytest.raises(ValueError, match="split a bundle-adjustment problem"):
        solvers.solve(prob, devices="all")


def test_solve_of_a_bundle_adjustment_problem_takes_devices(device):
    """solvers.solve on a Problem of cameras, points and the Snavely residual, split over a list
    of one device: the same solve as the host reference (the split code with one part)."""
    if not device.info.fp64:
        pytest.skip("float64 bundle adjustment needs fp64")
    from solvers.models.snavely import snavely_residual
    p = solvers.synthetic_problem(8, 300, 4, seed=2)

    def problem():
        prob = solvers.Problem(device=device)
        prob.add_parameter_block("cameras", p.cameras)
        prob.add_parameter_block("points", p.points)
        prob.add_residual_block(snavely_residual, ["cameras", "points"], index=(p.camera_index, p.point_index),
                                data=p.observations)
        return prob
    one = solvers.solve(problem(), max_iterations=6, device_resident=False)
    split = solvers.solve(problem(), max_iterations=6, devices=[device])
    assert split.state == "partitioned" and one.state == "host"
    assert len(split.history) == len(one.history)
    assert abs(split.final_cost - one.final_cost) <= 1e-9 * one.final_cost
    np.testing.assert_allclose(split.parameters["points"], one.parameters["points"], rtol=1e-6, atol=1e-8)
