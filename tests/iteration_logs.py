"""The iteration logs that hold the solvers' behaviour still while their modules move.

Each case solves one problem through the public API and returns its log: per iteration the
cost, the gradient's max norm, the step's norm and the linear solver's iterations. The logs in
``tests/data/iteration_logs.json`` were recorded by this file at the commit it names, before
``solvers/`` was restructured; ``tests/test_iteration_logs.py`` holds every later commit to them.

    python tests/iteration_logs.py --record          # rewrite the recorded logs (all cases)
    python tests/iteration_logs.py --rerecord WHY CASE ...   # after a deliberate change: those cases
    python tests/iteration_logs.py CASE [CASE ...]   # print the logs of some cases as JSON

The two-device case runs on PoCL's ``POCL_DEVICES="pthread pthread"`` (``pocl_pair``) and the
MPI case under ``mpirun -n 2`` (``mpi_ranks``, through this file's ``--child`` entry), each in a
process of its own.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECORDED = os.path.join(HERE, "data", "iteration_logs.json")
if HERE not in sys.path:
    sys.path.insert(0, HERE)

BAL = ("problem-16-22106-pre", "problem-21-11315-pre", "problem-39-18060-pre",
       "problem-49-7776-pre", "problem-73-11032-pre")
LINEAR_SOLVERS = ("sparse_schur", "iterative_schur")
# Tolerances as bench_colmap's (Ceres' and pycolmap's defaults but for the iteration cap).
TOLERANCES = dict(function_tolerance=1e-6, gradient_tolerance=1e-10, parameter_tolerance=1e-8)


def log(result):
    """The columns the logs are held to."""
    h = result.history
    return {"cost": [s.cost for s in h], "gradient_max_norm": [s.gradient_max_norm for s in h],
            "step_norm": [s.step_norm for s in h],
            "linear_solver_iterations": [int(s.linear_solver_iterations) for s in h],
            "final_cost": float(result.final_cost), "termination_type": result.termination_type,
            "state": result.state}


def _bal(name, linear_solver, **options):
    import solvers
    from bal_data import bal_file
    p = solvers.read_bal(str(bal_file(name)))
    return log(solvers.bundle_adjust(p, linear_solver=linear_solver, max_iterations=20, handle_sigint=False,
                                     **options))


def colmap_model(n_images, folder):
    """bench_colmap's own synthetic reconstruction (a camera per image), written to ``folder`` and
    read back by ours."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from bench_colmap import reconstruction
    from solvers import colmap
    reconstruction(n_images, "per-image").write(folder)
    return colmap.read_model(folder)


def _colmap(n_images):
    import solvers
    from solvers import colmap
    with tempfile.TemporaryDirectory() as tmp:
        model = colmap_model(n_images, tmp)
    prob = colmap.problem_from_reconstruction(model)
    return log(solvers.solve(prob, linear_solver="sparse_schur", max_iterations=50, handle_sigint=False,
                             **TOLERANCES))


def _general():
    import solvers
    from test_solver_problem import scene, three_group_problem
    prob = three_group_problem(scene(seed=3, n_images=8, n_cameras=3, n_points=60), loss="huber")
    return log(solvers.solve(prob, linear_solver="sparse_schur", max_iterations=30, handle_sigint=False))


def split_log(devices=None, comm=None):
    """problem-21 by iterative_schur split over ``devices`` or the ranks of ``comm``."""
    import solvers
    from bal_data import bal_file
    p = solvers.read_bal(str(bal_file("problem-21-11315-pre")))
    return log(solvers.bundle_adjust(p, devices=devices, comm=comm, linear_solver="iterative_schur",
                                     max_iterations=12, handle_sigint=False))


def _two_devices():
    from pocl_pair import run_on_two_devices
    return run_on_two_devices(f"import json, sys; sys.path.insert(0, {HERE!r}); import iteration_logs; "
                              "print(json.dumps(iteration_logs.split_log(devices=pair)))")


def _two_ranks():
    from mpi_ranks import run_ranks
    run = run_ranks(["-n", "2", sys.executable, "-W", "ignore", os.path.abspath(__file__), "--mpi-rank"], 900)
    if run.returncode != 0:
        raise RuntimeError(f"mpi-two-ranks failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _mpi_rank():
    """One rank of :func:`_two_ranks`; rank 0 prints the log as JSON."""
    from mpi4py import MPI
    out = split_log(comm=MPI.COMM_WORLD)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(out))


def recorded_arithmetic() -> dict:
    """Environment variables that give the host's numerical libraries the arithmetic the logs were
    recorded with (an x86-64 CPU with AVX2 and no AVX-512: an AMD EPYC). OpenBLAS picks its
    kernels by the CPU when it loads, and numpy its SIMD loops: on a CPU with AVX-512 (an Intel
    Xeon, seen) both round differently in the last bits, and the host path's costs then differ from
    the logs by 1e-11 relative after a few iterations. Pinned to OpenBLAS' Haswell kernels and
    numpy's AVX2 loops, such a CPU repeats the recording. Empty elsewhere (nothing to pin)."""
    import platform
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return {}
    if "avx2" not in flags or "fma" not in flags:
        return {}
    env = {"OPENBLAS_CORETYPE": "Haswell"}
    try:    # the SIMD targets numpy's loops may dispatch to here (numpy 2's public introspection)
        from numpy.lib.introspect import opt_func_info
    except ImportError:
        return env
    targets = {t for sigs in opt_func_info().values() for info in sigs.values()
               for t in str(info.get("available", "")).split()}
    avx512 = sorted(t for t in targets if t.startswith("AVX512") or t == "X86_V4")
    if avx512:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(avx512)
    return env


def run_case(name: str) -> dict:
    """One case's log, from a process of its own with :func:`recorded_arithmetic`'s environment
    (set before numpy and OpenBLAS load, which is when they read it)."""
    env = dict(os.environ, **recorded_arithmetic())
    run = subprocess.run([sys.executable, "-W", "ignore", os.path.abspath(__file__), name], env=env,
                         capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout[run.stdout.index("{"):])[name]


def cases():
    """Every case's name and the function that returns its log."""
    out = {f"bal-{n}-{ls}": (lambda n=n, ls=ls: _bal(n, ls)) for n in BAL for ls in LINEAR_SOLVERS}
    # The host reference path too, which the device paths are tested against.
    out.update({f"bal-host-problem-49-7776-pre-{ls}": (lambda ls=ls: _bal("problem-49-7776-pre", ls,
                                                                           device_resident=False))
                for ls in LINEAR_SOLVERS})
    out["colmap-30"] = lambda: _colmap(30)
    out["colmap-300"] = lambda: _colmap(300)
    out["general-three-groups"] = _general
    out["split-two-devices"] = _two_devices
    out["mpi-two-ranks"] = _two_ranks
    return out


def main(argv):
    if argv[:1] == ["--mpi-rank"]:
        _mpi_rank()
        return
    table = cases()
    if argv[:1] == ["--record"]:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=ROOT).stdout.strip()
        logs = {}
        for name in table:
            print(name, flush=True)
            logs[name] = run_case(name)     # in the recording's arithmetic, as the test runs it
        from solvers.io.atomic import replacing
        with replacing(RECORDED, "w") as f:
            json.dump({"commit": commit, "logs": logs}, f, indent=1)
            f.write("\n")
        return
    if argv[:1] == ["--rerecord"]:
        # A deliberate change of behaviour (a residual's semantics) changes some logs: those
        # cases are recorded again at the commit that made the change, with why; the others
        # keep their first recording.
        why, names = argv[1], argv[2:]
        if not names or any(n not in table for n in names):
            raise SystemExit(f"--rerecord WHY CASE [CASE ...]; cases: {', '.join(table)}")
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=ROOT).stdout.strip()
        with open(RECORDED) as f:
            recorded = json.load(f)
        for name in names:
            print(name, flush=True)
            recorded["logs"][name] = run_case(name)
            recorded.setdefault("rerecorded", {})[name] = {"commit": commit, "why": why}
        from solvers.io.atomic import replacing
        with replacing(RECORDED, "w") as f:
            json.dump(recorded, f, indent=1)
            f.write("\n")
        return
    print(json.dumps({name: table[name]() for name in argv}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
