"""Levenberg-Marquardt end to end: Ceres' trajectory and final costs on the real BAL problems,
the hard cases (points behind cameras, NaN mid-solve, few observations, gauge freedom, Ctrl-C),
the camera models and the command line."""
import importlib.util
import json
import os
import pathlib
import signal

import numpy as np
import pytest

import solvers
from solvers.bal.__main__ import main as cli_main

from bal_data import bal_file
from reference_snavely import ReferenceSnavelyModel

HERE = pathlib.Path(__file__).resolve().parent
CERES = HERE / "data" / "ceres_bal_reference.json"


def bal(name):
    return solvers.read_bal(bal_file(name))


def ceres_reference():
    if not CERES.exists():
        pytest.fail(f"{CERES} is missing (made by benchmarks/ceres_peer.py reference)")
    return json.loads(CERES.read_text())


@pytest.mark.slow
def test_dubrovnik_follows_ceres_documented_trajectory(device):
    """Ceres' documentation prints this run (problem-16-22106-pre, default options): every cost to
    its 7 printed digits, the same step and radius sequence, termination by function tolerance."""
    result = solvers.bundle_adjust(bal("problem-16-22106-pre"), device=device, handle_sigint=False)
    documented = [(4.185660e+06, 1.09e+08, 1.00e+04), (1.062590e+05, 8.99e+06, 3.00e+04),
                  (4.992817e+04, 8.32e+06, 3.09e+04), (1.899774e+04, 1.60e+06, 9.26e+04),
                  (1.808729e+04, 3.97e+05, 2.78e+05), (1.803399e+04, 1.48e+04, 8.33e+05),
                  (1.803390e+04, 6.35e+01, 2.50e+06)]
    assert len(result.history) == len(documented)
    for it, (cost, grad, radius) in zip(result.history, documented):
        assert float(f"{it.cost:.6e}") == cost
        assert float(f"{it.gradient_max_norm:.2e}") == grad
        assert float(f"{it.trust_region_radius:.2e}") == radius
        assert it.step_is_successful
    assert result.termination_type == "CONVERGENCE"
    assert result.message.startswith("Function tolerance reached. |cost_change|/cost: 1.7697")


CASES = [(solver, name) for solver in ("sparse_schur", "iterative_schur")
         for name in ("problem-49-7776-pre", "problem-73-11032-pre", "problem-21-11315-pre",
                      "problem-39-18060-pre", "problem-16-22106-pre")]


@pytest.mark.slow
@pytest.mark.parametrize("solver,name", CASES, ids=[f"{s}-{n}" for s, n in CASES])
def test_bal_final_cost_within_one_percent_of_ceres(device, solver, name):
    ref = ceres_reference()[solver][name]
    problem = bal(name)
    result = solvers.bundle_adjust(problem, linear_solver=solver, device=device, handle_sigint=False)
    assert result.initial_cost == pytest.approx(ref["initial_cost"], rel=1e-9)
    assert result.usable
    assert abs(result.final_cost - ref["final_cost"]) <= 0.01 * ref["final_cost"], \
        (result.final_cost, ref["final_cost"], result.message)
    # The returned state has the reported cost (independent evaluation).
    r = ReferenceSnavelyModel(problem.camera_index, problem.point_index, problem.observations).residuals(
        result.cameras, result.points)
    assert 0.5 * np.sum(r * r) == pytest.approx(result.final_cost, rel=1e-9)
    assert result.times["total"] > 0 and result.times["jacobian_evaluation"] > 0


def test_pyclad_model_and_reference_model_agree(device):
    p = solvers.synthetic_problem(10, 300, 3, seed=7)
    a = solvers.bundle_adjust(p, device=device, handle_sigint=False)
    b = solvers.bundle_adjust(p, model=ReferenceSnavelyModel, handle_sigint=False)
    assert [h.step_is_successful for h in a.history] == [h.step_is_successful for h in b.history]
    np.testing.assert_allclose([h.cost for h in a.history], [h.cost for h in b.history], rtol=1e-9)
    np.testing.assert_allclose(a.points, b.points, rtol=1e-6, atol=1e-9)
    # A model instance built on the problem's own observation order works too.
    inst = ReferenceSnavelyModel(p.camera_index, p.point_index, p.observations)
    c = solvers.bundle_adjust(p, model=inst, handle_sigint=False)
    np.testing.assert_allclose([h.cost for h in c.history], [h.cost for h in b.history], rtol=1e-12)


def test_float32_jacobians_still_converge(device):
    if not device.info.fp64:
        pytest.fail("device without fp64 in this test run")  # float64 reference solve below needs it
    p = solvers.synthetic_problem(10, 300, 3, seed=8)
    a = solvers.bundle_adjust(p, device=device, handle_sigint=False)
    b = solvers.bundle_adjust(p, device=device, dtype=np.float32, handle_sigint=False)
    assert b.usable and b.dtype == "float32"
    assert b.final_cost == pytest.approx(a.final_cost, rel=1e-3)


def test_result_fields_and_history(device):
    p = solvers.synthetic_problem(8, 200, 3, seed=9)
    seen = []
    r = solvers.bundle_adjust(p, device=device, callback=seen.append, handle_sigint=False)
    assert seen == r.history and seen[0].iteration == 0
    assert r.history[0].cost == r.initial_cost and r.final_cost <= r.initial_cost
    assert r.iterations == len(r.history) - 1
    assert r.num_successful_steps + r.num_unsuccessful_steps == len(r.history)
    t = r.times
    # The minimizer's time: the state's setup (setup less the preprocessor), then the iterations.
    assert t["jacobian_evaluation"] + t["linear_solver"] + t["residual_evaluation"] + t["other"] + \
        (t["setup"] - t["preprocessor"]) == pytest.approx(t["minimizer"], rel=1e-6)
    assert t["preprocessor"] < t["setup"] < t["total"] and "Setup" in r.full_report()
    report = r.full_report()
    for word in ("Initial", "Final", "Termination:", "SPARSE_SCHUR", "Jacobian & residual evaluation"):
        assert word in report
    line = r.history[1].log_line()
    assert len(line.split()) == 10 and solvers.LOG_HEADER.split()[0] == "iter"
    with pytest.raises(TypeError, match="unknown option"):
        solvers.bundle_adjust(p, device=device, trust_region_strategy="dogleg")
    with pytest.raises(ValueError, match="linear_solver"):
        solvers.bundle_adjust(p, device=device, linear_solver="dense_qr")


def test_max_iterations_and_tolerances(device):
    p = solvers.synthetic_problem(8, 200, 3, seed=10)
    r = solvers.bundle_adjust(p, device=device, max_iterations=1, handle_sigint=False)
    assert r.termination_type == "NO_CONVERGENCE" and r.iterations == 1
    assert "Maximum number of iterations reached" in r.message
    r = solvers.bundle_adjust(p, device=device, gradient_tolerance=1e30, handle_sigint=False)
    assert r.termination_type == "CONVERGENCE" and r.iterations == 0 and "Gradient tolerance" in r.message
    r = solvers.bundle_adjust(p, device=device, parameter_tolerance=1.0, handle_sigint=False)
    assert r.termination_type == "CONVERGENCE" and "Parameter tolerance" in r.message


def test_points_behind_cameras_in_the_initial_guess(device):
    p = solvers.synthetic_problem(8, 200, 3, seed=11)
    pts = p.points.copy()
    pts[:10] *= -4.0          # some points thrown far out, behind the cameras that see them
    q = p.with_parameters(p.cameras, pts)
    r = solvers.bundle_adjust(q, device=device, handle_sigint=False)
    assert r.usable and np.all(np.isfinite(r.cameras)) and np.all(np.isfinite(r.points))
    assert r.final_cost < r.initial_cost


class NaNSometimes:
    """Wraps a model; chosen calls return NaN residuals (or Jacobians) as a failing model would."""

    def __init__(self, inner, nan_residual_calls=(), nan_jacobian_calls=()):
        self.inner, self.n_obs = inner, len(inner.observations)
        self.nan_residual_calls, self.nan_jacobian_calls = set(nan_residual_calls), set(nan_jacobian_calls)
        self.residual_calls = self.jacobian_calls = 0

    def residuals(self, cams, pts):
        r = self.inner.residuals(cams, pts)
        self.residual_calls += 1
        if self.residual_calls in self.nan_residual_calls:
            r = r.copy()
            r[3, 1] = np.nan
        return r

    def residuals_and_jacobians(self, cams, pts):
        r, jc, jp = self.inner.residuals_and_jacobians(cams, pts)
        self.jacobian_calls += 1
        if self.jacobian_calls in self.nan_jacobian_calls:
            jp = jp.copy()
            jp[0, 0, 0] = np.inf
        return r, jc, jp


def test_nan_mid_solve_rejects_the_step():
    p = solvers.synthetic_problem(8, 200, 3, seed=12)
    ref = ReferenceSnavelyModel(p.camera_index, p.point_index, p.observations)
    clean = solvers.bundle_adjust(p, model=ref, handle_sigint=False)
    model = NaNSometimes(ref, nan_residual_calls=(1, 2))
    r = solvers.bundle_adjust(p, model=model, handle_sigint=False)
    assert not r.history[1].step_is_successful and not r.history[2].step_is_successful
    assert r.history[1].cost == np.finfo(np.float64).max       # Ceres: a failed evaluation costs DBL_MAX
    assert r.usable and np.all(np.isfinite(r.points))
    assert r.final_cost == pytest.approx(clean.final_cost, rel=1e-6)


def test_nan_jacobian_at_an_accepted_point_ends_with_a_clear_failure():
    p = solvers.synthetic_problem(8, 200, 3, seed=13)
    ref = ReferenceSnavelyModel(p.camera_index, p.point_index, p.observations)
    r = solvers.bundle_adjust(p, model=NaNSometimes(ref, nan_jacobian_calls=(3,)), handle_sigint=False)
    assert r.termination_type == "FAILURE" and "Residual and Jacobian evaluation failed" in r.message
    assert np.all(np.isfinite(r.cameras)) and np.all(np.isfinite(r.points))
    assert r.final_cost == r.history[-1].cost < r.initial_cost     # the best state evaluated


def test_nan_at_the_start_is_a_failure_with_the_input_returned():
    q = solvers.synthetic_problem(8, 200, 3, seed=14)
    ref = ReferenceSnavelyModel(q.camera_index, q.point_index, q.observations)
    r = solvers.bundle_adjust(q, model=NaNSometimes(ref, nan_jacobian_calls=(1,)), handle_sigint=False)
    assert r.termination_type == "FAILURE" and "evaluation failed" in r.message
    np.testing.assert_array_equal(r.points, q.points)
    np.testing.assert_array_equal(r.cameras, q.cameras)
    assert not np.isnan(r.final_cost)


def test_few_observations_unobserved_blocks_and_gauge_freedom(device):
    p = solvers.synthetic_problem(6, 60, 2, seed=15)   # 2 views per point: weakly constrained
    ci = np.concatenate([p.camera_index, [0]])
    pi = np.concatenate([p.point_index, [60]])           # a point seen once
    obs = np.concatenate([p.observations, [[5.0, -3.0]]])
    pts = np.concatenate([p.points, [[0.2, 0.1, 0.3]], [[1.0, 1.0, 1.0]]])   # and one never seen
    cams = np.concatenate([p.cameras, p.cameras[:1]])                           # a camera seeing nothing
    q = solvers.BALProblem(cams, pts, ci, pi, obs)
    for solver in ("sparse_schur", "iterative_schur"):
        r = solvers.bundle_adjust(q, linear_solver=solver, device=device, handle_sigint=False)
        assert r.usable and np.all(np.isfinite(r.points)) and np.all(np.isfinite(r.cameras))
        assert r.final_cost < r.initial_cost
        np.testing.assert_array_equal(r.points[61], pts[61])      # nothing moves what nothing sees
        np.testing.assert_array_equal(r.cameras[6], cams[6])


def test_stop_flag_and_ctrl_c_keep_the_best_state(device):
    p = solvers.synthetic_problem(8, 200, 3, seed=16)
    stop = solvers.StopFlag()
    r = solvers.bundle_adjust(p, device=device, stop=stop,
                              callback=lambda it: stop.set() if it.iteration == 1 else None)
    assert r.termination_type == "USER_SUCCESS" and r.iterations == 1 and "Ctrl-C" in r.message
    assert r.final_cost == r.history[1].cost

    def interrupt(it):
        if it.iteration == 1:
            os.kill(os.getpid(), signal.SIGINT)     # a real Ctrl-C, delivered mid-solve
    before = signal.getsignal(signal.SIGINT)
    r = solvers.bundle_adjust(p, device=device, callback=interrupt)
    assert r.termination_type == "USER_SUCCESS" and r.iterations == 1
    assert signal.getsignal(signal.SIGINT) is before


def test_command_line_synthetic_and_file(tmp_path, capsys, device):
    assert cli_main(["-q"]) == 0
    out = capsys.readouterr().out
    assert "synthetic" in out and "Solver Summary" in out and "Termination:" in out
    p = solvers.synthetic_problem(6, 80, 3, seed=17)
    src = tmp_path / "p.txt"
    solvers.write_bal(p, src)
    rc = cli_main([str(src), "--iterations", "3", "--linear-solver", "iterative_schur", "--loss", "huber",
                   "--out", str(tmp_path / "o.txt.bz2"), "--ply", str(tmp_path / "o.ply")])
    out = capsys.readouterr().out
    assert rc == 0 and "iter      cost      cost_change  |gradient|" in out
    assert "ITERATIVE_SCHUR" in out and "HUBER(1)" in out
    q = solvers.read_bal(tmp_path / "o.txt.bz2")
    assert q.num_observations == p.num_observations and not np.array_equal(q.points, p.points)
    assert (tmp_path / "o.ply").read_text().startswith("ply")
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2\n")
    assert cli_main([str(bad)]) == 2
    assert "bad header" in capsys.readouterr().err
    if importlib.util.find_spec("matplotlib") is not None:
        assert cli_main([str(src), "-q", "--plot", str(tmp_path / "c.png")]) == 0
        assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    else:
        with pytest.raises(SystemExit, match="matplotlib"):
            cli_main([str(src), "-q", "--plot", str(tmp_path / "c.png")])
