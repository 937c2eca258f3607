"""How the command lines end (solvers.split.cli.exit_process): by os._exit once main has returned,
with every line of output there and the exit status kept; as usual where something must still run
at exit (a tracer or profiler, PYCLAD_FAST_EXIT=0), and for main's own exceptions."""
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The README's first command (a small synthetic problem) as `python -m solvers.bal` runs it, with
# an exit handler that says whether the interpreter's exit ran; `setup` runs before it.
RUNNER = """
import atexit, runpy, sys
atexit.register(lambda: print("exit handlers ran", flush=True))
{setup}
sys.argv = ["solvers.bal"] + {args!r}
runpy.run_module("solvers.bal", run_name="__main__", alter_sys=True)
"""


def _bal(args, setup="", **env):
    code = textwrap.dedent(RUNNER.format(setup=setup, args=args))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, **env})


def test_a_finished_command_ends_at_once_with_its_whole_output():
    out = _bal(["--synthetic", "6,300,3", "-q"])
    assert out.returncode == 0, out.stderr
    assert "exit handlers ran" not in out.stdout
    # The report's last lines, written to a pipe (block-buffered): flushed before the exit.
    assert out.stdout.rstrip().splitlines()[-1].startswith("Termination:"), out.stdout[-500:]


@pytest.mark.parametrize("setup, env", [("", {"PYCLAD_FAST_EXIT": "0"}),
                                        ("sys.setprofile(lambda *a: None)", {}),
                                        ("sys.settrace(lambda *a: None)", {})])
def test_it_exits_as_usual_where_exit_handlers_matter(setup, env):
    out = _bal(["--synthetic", "6,300,3", "-q"], setup=setup, **env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("exit handlers ran")


def test_the_status_is_kept():
    """An output that cannot be written: status 2 from main (refused before the solve)."""
    out = _bal(["--synthetic", "6,300,3", "-q", "--out", "/proc/no-such-folder/solution.txt"])
    assert out.returncode == 2 and "--out" in out.stderr
    assert "exit handlers ran" not in out.stdout


@pytest.mark.parametrize("module, args, flag", [
    ("solvers.bal", ["--iterations", "-3"], "--iterations"),
    ("solvers.bal", ["--function-tolerance", "nan"], "--function-tolerance"),
    ("solvers.bal", ["--eta", "-0.5"], "--eta"),
    ("solvers.bal", ["--loss", "huber", "--loss-scale", "0"], "--loss-scale"),
    ("solvers.colmap", ["MODEL", "--out", "OUT", "--gradient-tolerance", "-1"], "--gradient-tolerance"),
    ("solvers.colmap", ["MODEL", "--out", "OUT", "--loss", "cauchy", "--loss-scale", "-2"], "--loss-scale"),
])
def test_a_solver_option_out_of_range_is_one_error_line(module, args, flag, tmp_path):
    """Named by its flag, before the input is read (MODEL need not exist), status 2, no traceback."""
    args = [str(tmp_path / a) if a in ("MODEL", "OUT") else a for a in args]
    out = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"error: {flag} ") and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
