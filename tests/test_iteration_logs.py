"""Behaviour held still: every case of ``tests/iteration_logs.py`` (the five BAL problems with
both linear solvers, the host reference, COLMAP models of 30 and 300 images, a general
three-group problem, a two-device split and a two-rank MPI solve) iterates as the log recorded
before ``solvers/`` was restructured (or, for a case that a deliberate change of behaviour changed,
at that change's commit: the file's ``rerecorded`` says which and why): the same number of iterations, the same linear-solver
iterations, and cost, gradient and step equal to 1e-12 relative.

The logs were recorded on PoCL's CPU device; another OpenCL device rounds differently, so this
test runs on PoCL only (``PYCLAD_TEST_DEVICES`` does not apply). Each case runs in a process of its
own whose numpy and OpenBLAS round as the recording machine's did
(``iteration_logs.recorded_arithmetic``)."""
import json

import numpy as np
import pytest

import iteration_logs
from bal_data import bal_file
from mpi_ranks import mpirun

RECORDED = json.load(open(iteration_logs.RECORDED))
RTOL = 1e-12


def _pocl_only():
    import clkernels
    names = {d.platform.name for d in clkernels.list_devices()}
    if not any("Portable Computing Language" in n for n in names):
        pytest.fail(f"the recorded logs are PoCL's; no PoCL device among {sorted(names)}")


def test_every_case_is_recorded():
    assert sorted(RECORDED["logs"]) == sorted(iteration_logs.cases())


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(RECORDED["logs"]))
def test_the_iterations_are_as_recorded(case):
    _pocl_only()
    if case.startswith("mpi"):
        mpirun()        # skips without MPI, or fails where PYCLAD_REQUIRE_MPI=1
    if not case.startswith(("colmap", "general")):
        # The BAL cases, and the split and MPI ones (problem-21 in a child process): missing data
        # skips here, or fails where PYCLAD_REQUIRE_BAL=1, before any child starts.
        bal_file("problem-21-11315-pre")
    want, got = RECORDED["logs"][case], iteration_logs.run_case(case)
    again = RECORDED.get("rerecorded", {}).get(case)
    where = f"{case} (recorded at {(again or RECORDED)['commit'][:10]}{', again: ' + again['why'] if again else ''})"
    assert len(got["cost"]) == len(want["cost"]), where
    assert got["linear_solver_iterations"] == want["linear_solver_iterations"], where
    assert (got["termination_type"], got["state"]) == (want["termination_type"], want["state"]), where
    for column in ("cost", "gradient_max_norm", "step_norm"):
        np.testing.assert_allclose(got[column], want[column], rtol=RTOL, atol=0, err_msg=f"{where}: {column}")
    np.testing.assert_allclose(got["final_cost"], want["final_cost"], rtol=RTOL, atol=0, err_msg=where)
