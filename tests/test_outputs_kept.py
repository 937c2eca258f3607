"""Nothing lost, nothing silently wrong: outputs checked before a solve, written whole or not at
all (real faults: a file size limit, SIGKILL mid-write, a folder removed during the solve), a
solution kept when its write fails, a callback's exception carrying the result, and in-memory
problems whose bad values are named."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import solvers
from solvers.bal.__main__ import main as cli_main
from solvers.colmap.cli import main as colmap_main
from solvers.io.ply import write_ply

from bal_data import bal_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, cwd, timeout=300, **popen):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, **popen)


def litter(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith(".pyclad-tmp") or n.endswith(".pyclad-old"))


# -- outputs checked first --------------------------------------------------------------------------

@pytest.mark.parametrize("option", ["--out", "--ply", "--checkpoint"])
def test_bal_cli_refuses_an_output_it_cannot_write_before_reading(tmp_path, capsys, option):
    # The input does not exist either: the output's error comes first, so nothing was read.
    rc = cli_main([str(tmp_path / "missing.txt"), option, "/nonexistent/dir/out.txt"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"error: {option}: the folder '/nonexistent/dir' does not exist"), err


def test_bal_cli_refuses_a_folder_as_output_file(tmp_path, capsys):
    assert cli_main(["--out", str(tmp_path), "-q"]) == 2
    assert f"--out '{tmp_path}' is a folder" in capsys.readouterr().err


def test_colmap_cli_refuses_an_unwritable_output_before_reading(tmp_path, capsys):
    rc = colmap_main([str(tmp_path / "no-model"), "--out", "/proc/forbidden"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: --out: cannot write in '/proc'"), err


# -- a write that fails after the solve keeps the solution -------------------------------------------

def test_a_folder_removed_during_the_solve_keeps_the_solution_in_the_working_directory(tmp_path):
    src = bal_file("problem-49-7776-pre")
    outdir = tmp_path / "results"
    outdir.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "solvers.bal", str(src), "--out", str(outdir / "out.txt"),
                             "--iterations", "8"], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:          # the outputs were checked before the first log line
            if line.lstrip().startswith("0 "):
                outdir.rmdir()            # the folder goes away while the solve runs
                break
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    kept = work / f"kept-{proc.pid}-out.txt"
    assert f"error: --out: cannot write '{outdir / 'out.txt'}'" in err
    assert f"the solution is kept in '{kept}'" in err
    assert "Solver Summary" in out
    final = float(next(ln.split()[1] for ln in out.splitlines() if ln.strip().startswith("Final")))
    solution = solvers.read_bal(str(kept))
    again = solvers.bundle_adjust(solution, max_iterations=0)
    assert again.initial_cost == pytest.approx(final, rel=1e-6)


# -- files whole or not at all -----------------------------------------------------------------------

def test_write_bal_over_a_file_size_limit_leaves_the_old_file(tmp_path):
    path = tmp_path / "p.txt"
    old = solvers.synthetic_problem(4, 40, 3, seed=1)
    solvers.write_bal(old, str(path))
    before = path.read_bytes()
    code = f"""
        import resource, signal, solvers
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # the write gets EFBIG, as on a full quota
        p = solvers.synthetic_problem(50, 5000, 4, seed=2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len({before!r}) + 100, resource.RLIM_INFINITY))
        try:
            solvers.write_bal(p, {str(path)!r})
        except OSError as e:
            print("raised", e.errno)
        """
    p = run_python(code, tmp_path)
    assert "raised 27" in p.stdout, p.stdout + p.stderr          # EFBIG
    assert path.read_bytes() == before
    assert litter(tmp_path) == []


def test_write_bal_killed_mid_write_leaves_the_old_file_and_the_next_writer_cleans_up(tmp_path):
    path = tmp_path / "p.txt.bz2"
    solvers.write_bal(solvers.synthetic_problem(4, 40, 3, seed=1), str(path))
    before = path.read_bytes()
    code = f"""
        import solvers
        p = solvers.synthetic_problem(200, 200000, 4, seed=2)    # a slow bz2 write
        print("writing", flush=True)
        solvers.write_bal(p, {str(path)!r})
        print("finished", flush=True)
        """
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        deadline = time.monotonic() + 120
        while not litter(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert litter(tmp_path), "the writer's temporary never appeared"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert path.read_bytes() == before                 # the old whole
    left = litter(tmp_path)
    assert left and all(n.startswith(f".p.txt.bz2.{proc.pid}.") for n in left)
    new = solvers.synthetic_problem(5, 50, 3, seed=3)
    solvers.write_bal(new, str(path))                  # the next writer removes the dead one's
    assert litter(tmp_path) == []
    np.testing.assert_array_equal(solvers.read_bal(str(path)).cameras, new.cameras)


def test_write_ply_refuses_values_it_cannot_hold_and_writes_nothing(tmp_path):
    p = solvers.synthetic_problem(3, 20, 2, seed=1)
    p.points[7, 1] = np.nan
    with pytest.raises(ValueError, match=r"write_ply: point 7 is not finite"):
        write_ply(p, str(tmp_path / "c.ply"))
    assert os.listdir(tmp_path) == []


def test_write_bal_checks_the_problem_first(tmp_path):
    p = solvers.synthetic_problem(3, 20, 2, seed=1)
    p.observations[5, 0] = np.inf                      # changed in place after the problem was made
    with pytest.raises(ValueError, match=r"observations\[5\]"):
        solvers.write_bal(p, str(tmp_path / "p.txt"))
    assert os.listdir(tmp_path) == []


# -- callbacks --------------------------------------------------------------------------------------

def test_a_callback_exception_carries_the_result_and_the_checkpoint_holds_its_iteration(tmp_path):
    p = solvers.synthetic_problem(10, 300, 3, seed=1)
    ck = tmp_path / "c.npz"
    seen = []

    class Enough(Exception):
        pass

    def callback(it):
        seen.append(it.cost)
        if it.iteration == 3:
            raise Enough("stop")

    with pytest.raises(Enough) as info:
        solvers.bundle_adjust(p, callback=callback, checkpoint=str(ck), max_iterations=20)
    r = info.value.result
    assert isinstance(r, solvers.BundleAdjustResult)
    assert r.termination_type == "USER_FAILURE" and r.iterations == 3
    assert "The callback raised Enough after iteration 3" in r.message
    assert r.final_cost == pytest.approx(min(seen), rel=1e-12)
    assert r.problem.cameras.shape == p.cameras.shape
    assert any("exception's .result" in n for n in info.value.__notes__)
    saved = solvers.load_checkpoint(str(ck))
    assert saved.iteration == 3 and saved.cost == pytest.approx(r.final_cost, rel=1e-12)
    # The same solve without the callback passes through the same states.
    plain = solvers.bundle_adjust(p, max_iterations=3)
    assert plain.final_cost == pytest.approx(r.final_cost, rel=1e-12)


def test_a_callback_exception_in_a_general_solve_carries_its_result():
    prob = solvers.Problem()
    prob.add_parameter_block("x", np.array([[3.0, -2.0]]))
    prob.add_residual_block(lambda x, d: [x[0] - d[0], 10 * (x[1] - x[0] * x[0])], ["x"], np.array([0]), data=[[1.0]])

    def callback(it):
        if it.iteration == 1:
            raise KeyError("enough")

    with pytest.raises(KeyError) as info:
        solvers.solve(prob, callback=callback, max_iterations=50)
    r = info.value.result
    assert isinstance(r, solvers.SolveResult) and r.termination_type == "USER_FAILURE"
    assert r.parameters["x"].shape == (1, 2) and r.final_cost <= r.initial_cost


# -- in-memory problems: bad values named ------------------------------------------------------------

def test_bal_problem_refuses_fractional_indices_and_names_a_nan_observation():
    p = solvers.synthetic_problem(3, 20, 2, seed=1)
    ci = p.camera_index.astype(float)
    ci[4] = 1.5
    with pytest.raises(ValueError, match=r"camera_index\[4\] = 1.5 is not a whole number"):
        solvers.BALProblem(p.cameras, p.points, ci, p.point_index, p.observations)
    # Whole numbers in a float array are fine (a reader may give them so).
    solvers.BALProblem(p.cameras, p.points, p.camera_index.astype(float), p.point_index, p.observations)
    obs = p.observations.copy()
    obs[9, 1] = np.nan
    with pytest.raises(ValueError, match=r"observations\[9\] = .* is not finite"):
        solvers.BALProblem(p.cameras, p.points, p.camera_index, p.point_index, obs)


def test_problem_names_a_nan_data_row_and_a_row_narrower_than_the_function_reads():
    prob = solvers.Problem()
    prob.add_parameter_block("x", np.ones((4, 2)))
    data = np.ones((4, 2))
    data[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"add_residual_block\('f'\): data row 2 holds a value that is not finite"):
        prob.add_residual_block(lambda x, d: [x[0] - d[0]], ["x"], np.arange(4), data=data, name="f")

    prob.add_residual_block(lambda x, d: [x[0] - d[0], x[1] - d[2]], ["x"], np.arange(4), data=np.ones((4, 2)))
    with pytest.raises(IndexError, match=r"reads data\[2\], but data has 2 entries .* at least 3 entries per row"):
        solvers.solve(prob, max_iterations=2)


@pytest.mark.parametrize("value, error", [(2.5, ValueError), ("10", ValueError), (True, ValueError), (-1, ValueError)])
def test_max_iterations_must_be_a_whole_number(value, error):
    p = solvers.synthetic_problem(3, 20, 2, seed=1)
    with pytest.raises(error, match=r"max_iterations must be a whole number >= 0"):
        solvers.bundle_adjust(p, max_iterations=value)


def test_two_writers_to_one_path_both_succeed_and_leave_one_whole(tmp_path):
    import threading
    path = str(tmp_path / "p.txt")
    problems = [solvers.synthetic_problem(4, 400, 3, seed=s) for s in (1, 2)]
    errors = []

    def write(p):
        try:
            for _ in range(5):
                solvers.write_bal(p, path)
        except Exception as e:       # collected: the test asserts there were none
            errors.append(e)

    threads = [threading.Thread(target=write, args=(p,)) for p in problems]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []
    got = solvers.read_bal(path)
    assert any(np.array_equal(got.cameras, p.cameras) and np.array_equal(got.points, p.points) for p in problems)
    assert litter(tmp_path) == []
