"""MPI ranks check that they hold the same problem before a split solve (solvers.split.rank_consistency):
real ``mpirun`` with two ranks given different BAL files (the same sizes with one observation
moved; other sizes), different starting parameters through the library, and a bad ``--devices``
under ``--mpi``. Every case must end every rank quickly with an ``error:`` line, never hang or
exit 0 with a wrong answer."""
import dataclasses
import sys
import textwrap
import time

import pytest

import solvers

from mpi_ranks import run_ranks

# Far above the few seconds these take; a hang (ranks waiting in a reduction) fails here.
TIMEOUT = 60


def _run(argv):
    t0 = time.perf_counter()
    run = run_ranks(argv, TIMEOUT)
    return run, time.perf_counter() - t0


def _bal_cli_on_two_files(a, b, *extra):
    """``mpirun -n 1 python -m solvers.bal A --mpi : -n 1 python -m solvers.bal B --mpi``."""
    rank = [sys.executable, "-W", "ignore", "-m", "solvers.bal"]
    return _run(["-n", "1", *rank, str(a), "--mpi", "-q", *extra,
                 ":", "-n", "1", *rank, str(b), "--mpi", "-q", *extra])


@pytest.fixture(scope="module")
def bal_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bal")
    p = solvers.synthetic_problem(4, 60, 3, seed=1)
    solvers.write_bal(p, d / "a.txt")
    obs = p.observations.copy()
    obs[7, 1] += 0.5                     # one observation moved: the same sizes, other data
    solvers.write_bal(dataclasses.replace(p, observations=obs), d / "moved.txt")
    solvers.write_bal(solvers.synthetic_problem(4, 50, 3, seed=1), d / "smaller.txt")
    return d


def _assert_ended_with(run, seconds, line):
    assert run.returncode != 0, run.stdout + run.stderr
    assert line in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert "Termination" not in run.stdout, run.stdout       # no solve ran
    assert seconds < TIMEOUT / 2


def test_two_files_of_the_same_sizes_end_every_rank_with_an_error(bal_files):
    run, seconds = _bal_cli_on_two_files(bal_files / "a.txt", bal_files / "moved.txt")
    _assert_ended_with(run, seconds, "error: MPI ranks do not hold the same problem: rank 1 differs from "
                                     "rank 0 (180 vs 180 observations, different data)")


def test_two_files_of_other_sizes_end_every_rank_with_an_error_not_a_truncation(bal_files):
    run, seconds = _bal_cli_on_two_files(bal_files / "a.txt", bal_files / "smaller.txt")
    _assert_ended_with(run, seconds, "error: MPI ranks do not hold the same problem: rank 1 differs from "
                                     "rank 0 (50 vs 60 points, 150 vs 180 observations)")
    assert "MPI_ERR_TRUNCATE" not in run.stderr


def test_different_starting_parameters_raise_on_every_rank():
    """The library: every rank raises RankMismatchError (caught here, so each exits 0 having said so)."""
    script = textwrap.dedent("""
        from mpi4py import MPI
        import solvers
        from solvers.split.rank_consistency import RankMismatchError
        comm = MPI.COMM_WORLD
        p = solvers.synthetic_problem(4, 60, 3, seed=1)
        if comm.Get_rank() == 1:
            p.cameras[0, 3] += 1e-3
        try:
            solvers.bundle_adjust(p, comm=comm, linear_solver="iterative_schur", max_iterations=2,
                                  handle_sigint=False)
        except RankMismatchError as e:
            print(f"rank {comm.Get_rank()} raised: {e}", flush=True)
    """)
    run, _ = _run(["-n", "2", sys.executable, "-W", "ignore", "-c", script])
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in (0, 1):
        assert (f"rank {rank} raised: MPI ranks do not hold the same problem: rank 1 differs from rank 0 "
                "(180 vs 180 observations, different starting parameters)") in run.stdout, run.stdout


def test_a_bad_devices_spec_under_mpi_ends_every_rank_with_an_error():
    run, seconds = _run(["-n", "2", sys.executable, "-W", "ignore", "-m", "solvers.bal",
                         "--synthetic", "3,20,2", "--mpi", "--devices", "no-such-device"])
    _assert_ended_with(run, seconds, "error: --devices 'no-such-device': 'no-such-device' matches no OpenCL device")


def test_a_rank_that_cannot_read_its_file_ends_the_others(bal_files):
    """One rank refuses before the solve (exit status 2) while the other waits in the first
    collective: the refusing rank ends them all rather than leave it waiting."""
    run, seconds = _bal_cli_on_two_files(bal_files / "a.txt", bal_files / "missing.txt")
    _assert_ended_with(run, seconds, "error: [Errno 2] No such file or directory")
