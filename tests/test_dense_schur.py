"""dense_schur (Ceres' DENSE_SCHUR: the reduced camera matrix factorised dense, by Cholesky, at any
size), added as one entry of the linear-solver registry: it solves as sparse_schur does, to 1e-9
relative in every iteration's cost and the final cost, on every core and path: the BAL problems
(device-resident and host reference), a COLMAP model, a general three-group problem, a split over
two devices, and both command lines.

Where sparse_schur factorises dense anyway (every shared BAL problem has at most 73 cameras: 657
unknowns), the two must agree; the comparisons that matter are those where sparse_schur takes a
sparse factorisation (a synthetic problem of 130 cameras; lowered size limits for the COLMAP and
general problems), and the report shows that the routes differ there."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import solvers
from solvers.linalg import factorisation_limits

from bal_data import bal_file
from pocl_pair import ROOT, run_on_two_devices

RTOL = 1e-9
SPARSE = ("SuperLU", "CHOLMOD", "cholespy", "sparse")


def assert_same_solve(dense, sparse):
    assert len(dense.history) == len(sparse.history)
    assert dense.num_successful_steps == sparse.num_successful_steps
    np.testing.assert_allclose([h.cost for h in dense.history], [h.cost for h in sparse.history], rtol=RTOL)
    assert abs(dense.final_cost - sparse.final_cost) <= RTOL * sparse.final_cost


def test_it_is_a_registered_schur_method():
    from solvers.linalg.linear_solver import SCHUR_METHODS, linear_solver
    assert "dense_schur" in solvers.LINEAR_SOLVERS and "dense_schur" in SCHUR_METHODS
    entry = linear_solver("dense_schur")
    assert entry.dense and not entry.iterative and entry.dtypes == (np.float64,)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["problem-16-22106-pre", "problem-21-11315-pre", "problem-39-18060-pre",
                                  "problem-49-7776-pre", "problem-73-11032-pre"])
def test_the_bal_problems_solve_as_with_sparse_schur(name):
    p = solvers.read_bal(str(bal_file(name)))
    kw = dict(max_iterations=10, handle_sigint=False)
    assert_same_solve(solvers.bundle_adjust(p, linear_solver="dense_schur", **kw),
                      solvers.bundle_adjust(p, linear_solver="sparse_schur", **kw))


@pytest.mark.slow
@pytest.mark.parametrize("device_resident", [None, False])
def test_where_sparse_schur_factorises_sparse_dense_schur_factorises_dense(device_resident):
    # 130 cameras: 1170 unknowns, past the size where sparse_schur's host factorisation is dense.
    p = solvers.synthetic_problem(130, 3000, 5, seed=1)
    kw = dict(max_iterations=8, handle_sigint=False, device_resident=device_resident)
    dense = solvers.bundle_adjust(p, linear_solver="dense_schur", **kw)
    sparse = solvers.bundle_adjust(p, linear_solver="sparse_schur", **kw)
    assert dense.state == sparse.state == ("host" if device_resident is False else "device")
    assert "dense Cholesky" in dense.linear_solver_detail, dense.linear_solver_detail
    assert any(s in sparse.linear_solver_detail for s in SPARSE), sparse.linear_solver_detail
    assert_same_solve(dense, sparse)
    assert "DENSE_SCHUR" in dense.full_report()


@pytest.fixture
def sparse_by_default(monkeypatch):
    """Size limits under which sparse_schur factorises these small problems sparse."""
    monkeypatch.setattr(factorisation_limits, "HOST_DENSE_MAX", 10)
    monkeypatch.setattr(factorisation_limits, "DENSE_FILL", 2.0)      # no fill is enough


@pytest.mark.slow
def test_a_colmap_model_solves_as_with_sparse_schur(tmp_path, sparse_by_default):
    from solvers import colmap
    from test_solver_colmap_problem import synthetic
    _, path = synthetic(tmp_path, n_images=15, per_image_cameras=True)
    results = {}
    for ls in ("dense_schur", "sparse_schur"):
        prob = colmap.problem_from_reconstruction(colmap.read_model(path))
        results[ls] = solvers.solve(prob, linear_solver=ls, max_iterations=10, handle_sigint=False)
    assert "dense Cholesky" in results["dense_schur"].linear_solver_detail
    assert any(s in results["sparse_schur"].linear_solver_detail for s in SPARSE)
    assert_same_solve(results["dense_schur"], results["sparse_schur"])


@pytest.mark.slow
def test_a_general_problem_solves_as_with_sparse_schur(sparse_by_default):
    from test_solver_problem import scene, three_group_problem
    s = scene(seed=3, n_images=8, n_cameras=3, n_points=60)
    results = {ls: solvers.solve(three_group_problem(s, loss="huber"), linear_solver=ls, max_iterations=15,
                                 handle_sigint=False)
               for ls in ("dense_schur", "sparse_schur")}
    assert results["dense_schur"].core == "general"
    assert "LAPACK" in results["dense_schur"].linear_solver_detail
    assert any(s in results["sparse_schur"].linear_solver_detail for s in SPARSE)
    assert_same_solve(results["dense_schur"], results["sparse_schur"])


@pytest.mark.slow
def test_a_split_over_two_devices_solves_as_one_device():
    out = run_on_two_devices(textwrap.dedent("""
        import json, solvers
        p = solvers.synthetic_problem(130, 3000, 5, seed=1)
        kw = dict(linear_solver="dense_schur", max_iterations=6, handle_sigint=False)
        one = solvers.bundle_adjust(p, device=pair[0], **kw)
        two = solvers.bundle_adjust(p, devices=pair, **kw)
        print(json.dumps({"states": [one.state, two.state], "detail": two.linear_solver_detail,
                          "costs": [[h.cost for h in r.history] for r in (one, two)]}))
    """))
    assert out["states"] == ["device", "partitioned"]
    one, two = out["costs"]
    assert len(one) == len(two)
    np.testing.assert_allclose(two, one, rtol=RTOL)


def _cli(*argv):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-W", "ignore", "-m", *argv], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)


@pytest.mark.slow
def test_both_command_lines_take_it(tmp_path):
    run = _cli("solvers.bal", "--synthetic", "20,400,4", "--iterations", "4", "--linear-solver", "dense_schur")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "DENSE_SCHUR" in run.stdout and "Termination:" in run.stdout
    from test_solver_colmap_problem import synthetic
    _, model = synthetic(tmp_path, n_images=8, per_image_cameras=True)
    run = _cli("solvers.colmap", model, "--out", str(tmp_path / "out"), "--iterations", "4",
               "--linear-solver", "dense_schur")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "DENSE_SCHUR" in run.stdout
    assert solvers.colmap.read_model(str(tmp_path / "out")).num_observations > 0


REFUSED_UNDER_A_LIMIT = """
import resource
import scipy.linalg  # noqa: F401 - loaded (with its BLAS threads) before the limit
import solvers
p = solvers.synthetic_problem(800, 2400, 3, seed=2)     # 7200 unknowns: 0.77 GiB dense, twice
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (384 << 20), resource.RLIM_INFINITY))
for attempt in range(2):                # refused in the setup, before the matrix: again on a retry
    try:
        solvers.bundle_adjust(p, linear_solver="dense_schur", max_iterations=2, handle_sigint=False)
        print("no error")
    except solvers.DeviceMemoryError as e:
        print("DeviceMemoryError:", e)
print("the process goes on")
"""


@pytest.mark.slow
def test_a_dense_matrix_past_the_hosts_memory_is_refused_before_it_is_made():
    import clkernels
    if not clkernels.get_runtime().info.is_cpu:
        pytest.skip("a GPU factorises the dense matrix in its own memory, not the host's")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PYCLAD_DEVICE", None)
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", REFUSED_UNDER_A_LIMIT], capture_output=True,
                         text=True, cwd=ROOT, env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert len(lines) == 3 and lines[2] == "the process goes on", run.stdout
    for line in lines[:2]:
        assert line.startswith("DeviceMemoryError: the linear solver factorises the 7200 x 7200 reduced matrix "
                               "dense (dense_schur): 0.77 GiB on the host"), line
        assert "RLIMIT_AS (ulimit -v)" in line and "use linear_solver='sparse_schur'" in line
