"""Checkpoints of a bundle adjustment (solvers.loop.checkpoint, Options.checkpoint, resume=): when they
are written and what they hold, on the host and the device path; a real solve killed with SIGKILL
and resumed to Ceres' final cost; atomic writes (a failing or interrupted write leaves the
previous checkpoint); refusing another problem's checkpoint; the options' and the CLI's errors."""
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import solvers
import solvers.loop.checkpoint as checkpoint_module
from solvers.bal.__main__ import main as cli_main
from solvers.loop.checkpoint import Checkpoint, CheckpointError, load_checkpoint, problem_fingerprint, save_checkpoint

from bal_data import bal_file
from reference_snavely import ReferenceSnavelyModel

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def cost_of(problem, cameras, points):
    """0.5 |r|^2 by the independent numpy model."""
    r = ReferenceSnavelyModel(problem.camera_index, problem.point_index, problem.observations).residuals(
        cameras, points)
    return 0.5 * float(np.sum(r * r))


# Only max_iterations ends the solve: a known number of iterations.
NO_TOLERANCES = dict(function_tolerance=0.0, parameter_tolerance=0.0, gradient_tolerance=0.0)


def small(seed=2):
    return solvers.synthetic_problem(10, 300, 3, seed=seed)


def files_in(folder):
    return sorted(p.name for p in pathlib.Path(folder).iterdir())


# -- when they are written, what they hold ------------------------------------------------------

@pytest.mark.parametrize("linear_solver,state", [("sparse_schur", "host"), ("iterative_schur", "device")])
def test_written_every_n_iterations_and_at_the_end(tmp_path, device, linear_solver, state):
    if state == "device" and not device.info.fp64:
        pytest.skip(f"the device path needs fp64, which {device.info.name!r} lacks")
    p = small()
    path = tmp_path / "ba.npz"
    seen = {}                       # iteration -> iteration of the checkpoint on disk as it starts

    def watch(it):
        seen[it.iteration] = load_checkpoint(path).iteration if path.exists() else None

    kw = dict(linear_solver=linear_solver, device=device, handle_sigint=False, max_iterations=10,
              device_resident=(state == "device"), **NO_TOLERANCES)
    plain = solvers.bundle_adjust(p, **kw)
    r = solvers.bundle_adjust(p, checkpoint=path, checkpoint_every=3, callback=watch, **kw)
    assert r.state == state and r.iterations == 10, (r.iterations, r.message)
    # The callback runs before the iteration's own checkpoint: after iteration 0, then every 3rd.
    assert seen[0] is None
    for i in range(1, r.iterations + 1):
        assert seen[i] == 3 * ((i - 1) // 3), (i, seen)
        assert i - seen[i] <= 3                   # a kill here would lose at most 3 iterations
    # Checkpointing changes nothing in the solve (the device state is only read).
    assert [h.cost for h in r.history] == [h.cost for h in plain.history]
    np.testing.assert_array_equal(r.points, plain.points)
    ck = load_checkpoint(path)
    assert (ck.iteration, ck.termination_type, ck.cost) == (r.iterations, r.termination_type, r.final_cost)
    assert r.checkpoint_iteration == r.iterations and ck.finished
    np.testing.assert_array_equal(ck.cameras, r.cameras)
    np.testing.assert_array_equal(ck.points, r.points)
    assert ck.trust_region_radius == r.history[-1].trust_region_radius
    assert cost_of(p, ck.cameras, ck.points) == pytest.approx(ck.cost, rel=1e-9)
    assert (ck.num_cameras, ck.num_points, ck.num_observations) == (10, 300, 900)
    assert ck.fingerprint == problem_fingerprint(p)
    assert r.times["checkpoint"] > 0
    if state == "device":
        # The checkpoints' reads count among the iterations' transfers, the end's read apart.
        params = 8 * (9 * 10 + 3 * 300)
        assert r.transfers["bytes_at_end"] == plain.transfers["bytes_at_end"] == params
        # Mid-solve writes after iterations 0, 3, ... the solve went on from: the last one too
        # when it ended on the next iteration's candidate (a tolerance), not otherwise.
        writes = {len(range(0, r.iterations, 3)), len(range(0, r.iterations + 1, 3))}
        assert r.transfers["bytes_to_host"] - plain.transfers["bytes_to_host"] in {params * w for w in writes}


def test_ctrl_c_writes_the_best_state_and_the_second_leaves_the_last(tmp_path, device):
    p = small()
    path = tmp_path / "ba.npz"

    def interrupt(it):
        if it.iteration == 2:
            os.kill(os.getpid(), signal.SIGINT)   # a real Ctrl-C, delivered mid-solve
    r = solvers.bundle_adjust(p, device=device, callback=interrupt, checkpoint=path, checkpoint_every=50)
    assert r.termination_type == "USER_SUCCESS" and r.iterations == 2
    ck = load_checkpoint(path)
    assert (ck.iteration, ck.termination_type, ck.cost) == (2, "USER_SUCCESS", r.final_cost)
    np.testing.assert_array_equal(ck.points, r.points)

    # Two Ctrl-C: the second interrupts at once (KeyboardInterrupt), the checkpoint of
    # iteration 0 stays, complete.
    path.unlink()

    def interrupt_twice(it):
        if it.iteration == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        solvers.bundle_adjust(p, device=device, callback=interrupt_twice, checkpoint=path, checkpoint_every=50)
    ck = load_checkpoint(path)
    assert ck.iteration == 0 and not ck.finished
    np.testing.assert_array_equal(ck.points, p.points)
    assert files_in(tmp_path) == ["ba.npz"]


class NaNJacobianAt:
    """The reference model, with an infinite Jacobian entry at the ``call``-th evaluation."""

    def __init__(self, problem, call):
        self.inner = ReferenceSnavelyModel(problem.camera_index, problem.point_index, problem.observations)
        self.n_obs, self.call, self.calls = problem.num_observations, call, 0

    def residuals(self, cams, pts):
        return self.inner.residuals(cams, pts)

    def residuals_and_jacobians(self, cams, pts):
        r, jc, jp = self.inner.residuals_and_jacobians(cams, pts)
        self.calls += 1
        if self.calls == self.call:
            jp = jp.copy()
            jp[0, 0, 0] = np.inf
        return r, jc, jp


def test_failure_writes_the_best_state_and_a_failed_start_writes_nothing(tmp_path):
    p = small(seed=13)
    path = tmp_path / "ba.npz"
    r = solvers.bundle_adjust(p, model=NaNJacobianAt(p, 3), handle_sigint=False, checkpoint=path)
    assert r.termination_type == "FAILURE"
    ck = load_checkpoint(path)
    assert ck.termination_type == "FAILURE" and ck.cost == r.final_cost < r.initial_cost
    np.testing.assert_array_equal(ck.cameras, r.cameras)
    # Nothing evaluated successfully: nothing better than the input to write.
    r = solvers.bundle_adjust(p, model=NaNJacobianAt(p, 1), handle_sigint=False, checkpoint=tmp_path / "none.npz")
    assert r.termination_type == "FAILURE" and r.checkpoint_iteration is None
    assert not (tmp_path / "none.npz").exists()


# -- resume --------------------------------------------------------------------------------------

def test_resume_restores_parameters_and_radius_and_counts_on(tmp_path, device):
    p = solvers.synthetic_problem(12, 400, 4, seed=3, perturb_rotation=2e-2, perturb_translation=0.2)
    path = tmp_path / "ba.npz"
    kw = dict(device=device, handle_sigint=False, function_tolerance=1e-10)
    full = solvers.bundle_adjust(p, **kw)
    first = solvers.bundle_adjust(p, max_iterations=3, checkpoint=path, **kw)
    ck = load_checkpoint(path)
    assert ck.iteration == 3 and ck.termination_type == "NO_CONVERGENCE"
    out = []

    class Out:
        def write(self, s):
            out.append(s)

        def flush(self):
            pass
    r = solvers.bundle_adjust(p, resume=path, checkpoint=path, verbose=True, out=Out(), **kw)
    text = "".join(out)
    assert f"Resuming from checkpoint {path}: iteration 3" in text
    assert f"Checkpoints: the best state to {path} every 1 iteration and at the end" in text
    # The resumed solve starts where the checkpoint is, with its radius, and a log from 0.
    assert r.initial_cost == pytest.approx(first.final_cost, rel=1e-12)
    assert r.history[0].iteration == 0 and r.history[0].trust_region_radius == ck.trust_region_radius
    assert (r.resumed_from, r.resumed_iteration) == (str(path), 3)
    assert "Resumed from" in r.full_report()
    assert r.final_cost == pytest.approx(full.final_cost, rel=1e-6)
    end = load_checkpoint(path)
    assert end.iteration == 3 + r.iterations == r.checkpoint_iteration
    # initial_trust_region_radius, when given, wins over the checkpoint's.
    q = solvers.bundle_adjust(p, resume=ck, max_iterations=0, initial_trust_region_radius=123.0, **kw)
    assert q.history[0].trust_region_radius == 123.0
    np.testing.assert_array_equal(q.cameras, ck.cameras)


def test_a_checkpoint_of_another_problem_is_refused(tmp_path):
    a, same_size, other_size = small(seed=2), small(seed=5), solvers.synthetic_problem(10, 301, 3, seed=2)
    assert (a.num_observations, same_size.num_observations) == (900, 900)
    path = tmp_path / "a.npz"
    solvers.bundle_adjust(a, handle_sigint=False, max_iterations=1, checkpoint=path)
    with pytest.raises(CheckpointError, match="another problem .* of the same size"):
        solvers.bundle_adjust(same_size, handle_sigint=False, resume=path)
    # Same cameras seeing the same points, other observed values: another problem too.
    moved = solvers.BALProblem(a.cameras, a.points, a.camera_index, a.point_index, a.observations + 0.5)
    with pytest.raises(CheckpointError, match="the observations of .* differ"):
        solvers.bundle_adjust(moved, handle_sigint=False, resume=path)
    with pytest.raises(CheckpointError, match="10 cameras, 300 points and 900 observations.*"
                                               "has 10, 301 and 903"):
        solvers.bundle_adjust(other_size, handle_sigint=False, resume=path)
    # The same problem read back from a BAL file is the same problem.
    solvers.write_bal(a, tmp_path / "a.txt")
    r = solvers.bundle_adjust(solvers.read_bal(tmp_path / "a.txt"), handle_sigint=False, resume=path,
                              max_iterations=0)
    np.testing.assert_array_equal(r.points, load_checkpoint(path).points)


def test_files_that_are_not_checkpoints(tmp_path):
    p = small()
    good = tmp_path / "good.npz"
    solvers.bundle_adjust(p, handle_sigint=False, max_iterations=1, checkpoint=good)
    data = good.read_bytes()
    (tmp_path / "half.npz").write_bytes(data[:len(data) // 2])
    (tmp_path / "text.npz").write_text("not a checkpoint\n")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    np.save(tmp_path / "array.npy", np.zeros(3))
    for name, match in [("half.npz", "not a readable checkpoint"), ("text.npz", "not a readable checkpoint"),
                        ("other.npz", "not a pyclad checkpoint"),
                        ("array.npy", "not an .npz archive")]:
        with pytest.raises(CheckpointError, match=match):
            load_checkpoint(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.npz")
    # A newer format is refused with what to do.
    with np.load(good) as z:
        fields = {k: z[k] for k in z.files}
    fields["version"] = np.array(checkpoint_module.FORMAT_VERSION + 1)
    np.savez(tmp_path / "newer.npz", **fields)
    with pytest.raises(CheckpointError, match="upgrade pyclad"):
        load_checkpoint(tmp_path / "newer.npz")
    # No pickles: an object array in the archive is refused, not unpickled.
    fields["version"] = np.array(1)
    fields["problem_name"] = np.array([{"a": 1}], dtype=object)
    np.savez(tmp_path / "pickled.npz", **fields)
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path / "pickled.npz")


# -- atomic writes -------------------------------------------------------------------------------

def a_checkpoint(p, iteration):
    return Checkpoint(cameras=p.cameras + iteration, points=p.points, iteration=iteration, cost=1.0 + iteration,
                      trust_region_radius=1e4, num_cameras=p.num_cameras, num_points=p.num_points,
                      num_observations=p.num_observations, fingerprint=problem_fingerprint(p))


def test_the_write_goes_to_a_complete_temporary_file_renamed_over_the_path(tmp_path, monkeypatch):
    p = small()
    path = tmp_path / "ba.npz"
    renames = []
    real_replace = os.replace

    def spy(src, dst):
        # At the rename the temporary file is complete and the checkpoint still the old one.
        renames.append((src, dst, load_checkpoint(src).iteration,
                        load_checkpoint(dst).iteration if os.path.exists(dst) else None))
        real_replace(src, dst)
    monkeypatch.setattr(checkpoint_module.os, "replace", spy)
    save_checkpoint(path, a_checkpoint(p, 1))
    save_checkpoint(path, a_checkpoint(p, 2))
    assert [(it, old) for _, _, it, old in renames] == [(1, None), (2, 1)]
    for src, dst, _, _ in renames:
        assert dst == str(path) and src != dst
        assert os.path.dirname(src) == str(tmp_path)          # same file system: an atomic rename
        assert os.path.basename(src).startswith(".ba.npz.") and src.endswith(".pyclad-tmp")
    assert renames[0][0] != renames[1][0]
    assert files_in(tmp_path) == ["ba.npz"]
    # The umask applies as to any new file (not mkstemp's 0600).
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_write_failing_half_way_leaves_the_previous_checkpoint(tmp_path, monkeypatch, error):
    p = small()
    path = tmp_path / "ba.npz"
    save_checkpoint(path, a_checkpoint(p, 1))
    before = path.read_bytes()
    real = checkpoint_module._write_npz

    def half_then_fail(f, arrays):
        import io
        buf = io.BytesIO()
        real(buf, arrays)
        f.write(buf.getvalue()[:buf.tell() // 2])
        f.flush()
        raise error
    monkeypatch.setattr(checkpoint_module, "_write_npz", half_then_fail)
    with pytest.raises(type(error)):
        save_checkpoint(path, a_checkpoint(p, 2))
    assert path.read_bytes() == before and load_checkpoint(path).iteration == 1
    assert files_in(tmp_path) == ["ba.npz"]                     # no temporary file left


def test_a_solve_whose_later_writes_fail_warns_and_goes_on(tmp_path, monkeypatch):
    p = small()
    path = tmp_path / "ba.npz"
    real, calls = checkpoint_module._write_npz, []

    def fail_from_the_third(f, arrays):
        calls.append(int(arrays["iteration"]))
        if len(calls) >= 3:
            raise OSError(28, "No space left on device")
        real(f, arrays)
    monkeypatch.setattr(checkpoint_module, "_write_npz", fail_from_the_third)
    with pytest.warns(RuntimeWarning, match="could not be written .*No space left.* left as it was"):
        r = solvers.bundle_adjust(p, handle_sigint=False, checkpoint=path, max_iterations=5, **NO_TOLERANCES)
    assert r.usable and r.iterations == 5 and calls == [0, 1, 2, 3, 4, 5]
    assert r.checkpoint_iteration == 1 == load_checkpoint(path).iteration
    assert files_in(tmp_path) == ["ba.npz"]
    # A first write that fails stops the solve at once: that path would never be written.
    monkeypatch.setattr(checkpoint_module, "_write_npz", lambda f, arrays: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied")))
    with pytest.raises(PermissionError):
        solvers.bundle_adjust(p, handle_sigint=False, checkpoint=tmp_path / "other.npz", max_iterations=5)
    assert files_in(tmp_path) == ["ba.npz"]


# -- options and command line --------------------------------------------------------------------

def test_bad_checkpoint_options(tmp_path):
    p = small()
    for every in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="checkpoint_every must be an integer >= 1"):
            solvers.bundle_adjust(p, handle_sigint=False, checkpoint=tmp_path / "a.npz", checkpoint_every=every)
    with pytest.raises(ValueError, match="checkpoint_every"):
        solvers.Options(checkpoint_every=0).check()
    with pytest.raises(ValueError, match="does not exist; create it"):
        solvers.bundle_adjust(p, handle_sigint=False, checkpoint=tmp_path / "no" / "a.npz")
    with pytest.raises(ValueError, match="is a directory"):
        solvers.bundle_adjust(p, handle_sigint=False, checkpoint=tmp_path)
    with pytest.raises(TypeError, match="checkpoint must be a file path"):
        solvers.Options(checkpoint=3).check()
    with pytest.raises(ValueError, match="non-empty"):
        solvers.Options(checkpoint="").check()
    solvers.Options(checkpoint=str(tmp_path / "a.npz"), checkpoint_every=np.int64(5)).check()
    assert files_in(tmp_path) == []                                  # nothing was solved, nothing written


def test_command_line_checkpoint_options(tmp_path, capsys):
    p = small()
    src = tmp_path / "p.txt"
    solvers.write_bal(p, src)
    for argv in ([str(src), "--checkpoint-every", "2"],
                 [str(src), "--checkpoint", str(tmp_path / "c.npz"), "--checkpoint-every", "0"]):
        with pytest.raises(SystemExit) as e:
            cli_main(argv)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--checkpoint-every needs --checkpoint" in err and "must be an integer >= 1, got '0'" in err
    assert cli_main([str(src), "--checkpoint", str(tmp_path / "no" / "c.npz")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli_main([str(src), "--resume", str(tmp_path / "missing.npz")]) == 2
    assert "error: --resume:" in capsys.readouterr().err
    other = tmp_path / "other.npz"
    solvers.bundle_adjust(small(seed=5), handle_sigint=False, max_iterations=0, checkpoint=other)
    assert cli_main([str(src), "--resume", str(other)]) == 2
    assert "another problem" in capsys.readouterr().err
    assert cli_main([str(src), "--checkpoint", str(tmp_path / "c.npz"), "--checkpoint-every", "2",
                     "--iterations", "3"]) == 0
    out = capsys.readouterr().out
    assert "Checkpoints: the best state to" in out and "every 2 iterations" in out
    # The iteration log itself is Ceres' rows and nothing else.
    rows = out.split("iter      cost      cost_change")[1].split("\n\n")[0].splitlines()[1:]
    assert len(rows) == 4 and all(row.split()[0] == str(i) for i, row in enumerate(rows))
    assert f"written: {tmp_path / 'c.npz'} (checkpoint of the best state, iteration 3)" in out


# -- a real solve, killed and resumed ------------------------------------------------------------

@pytest.mark.slow
def test_a_solve_killed_with_sigkill_resumes_to_the_same_final_cost(tmp_path):
    """problem-49-7776-pre takes 31 iterations (Ceres' too): the command line is killed with
    SIGKILL once it has checkpointed iteration 3, the checkpoint is complete and the cost of that
    iteration of Ceres' run, and the resumed solve ends at Ceres' final cost."""
    name = "problem-49-7776-pre"
    src = bal_file(name)
    ceres = json.loads((HERE / "data" / "ceres_bal_reference.json").read_text())["sparse_schur"][name]
    path = tmp_path / "ba.npz"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [
        q for q in os.environ.get("PYTHONPATH", "").split(os.pathsep) if q]))
    proc = subprocess.Popen([sys.executable, "-m", "solvers.bal", str(src), "--checkpoint", str(path)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    loads, iterations_seen = 0, set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if path.exists():
                ck = load_checkpoint(path)       # never half-written, however often it is read
                loads += 1
                iterations_seen.add(ck.iteration)
                if ck.iteration >= 3:
                    break
            time.sleep(0.002)
        assert proc.poll() is None, "the solve ended before it could be killed:\n" + proc.stdout.read().decode()
        proc.send_signal(signal.SIGKILL)
        log = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert "Solver Summary" not in log                                  # killed mid-solve
    ck = load_checkpoint(path)
    assert 3 <= ck.iteration < 31 and not ck.finished and loads > 1, (ck.iteration, loads, iterations_seen)
    assert iterations_seen <= set(range(ck.iteration + 1))
    # A kill during a write may leave that write's temporary file beside the checkpoint, no other.
    litter = [q.name for q in tmp_path.iterdir() if q.name != "ba.npz"]
    assert all(re.fullmatch(rf"\.ba\.npz\.{proc.pid}\.[0-9a-f]{{8}}\.pyclad-tmp", n) for n in litter), litter
    problem = solvers.read_bal(src)
    ck.check_problem(problem)
    assert ck.cost == pytest.approx(ceres["cost_history"][ck.iteration], rel=1e-7)
    assert cost_of(problem, ck.cameras, ck.points) == pytest.approx(ck.cost, rel=1e-9)

    out = tmp_path / "out.txt"
    assert cli_main([str(src), "-q", "--resume", str(path), "--checkpoint", str(path), "--out", str(out)]) == 0
    end = load_checkpoint(path)
    assert end.termination_type == "CONVERGENCE" and end.iteration > ck.iteration
    # The killed writer's temporary (if the kill came mid-write) was removed by the next writer.
    assert not [q.name for q in tmp_path.iterdir() if q.name.endswith(".pyclad-tmp")]
    assert end.cost == pytest.approx(ceres["final_cost"], rel=1e-5)
    # The final checkpoint is the optimised problem written by --out, digit for digit.
    optimised = solvers.read_bal(out)
    np.testing.assert_array_equal(end.cameras, optimised.cameras)
    np.testing.assert_array_equal(end.points, optimised.points)
    assert cost_of(problem, end.cameras, end.points) == pytest.approx(end.cost, rel=1e-9)
