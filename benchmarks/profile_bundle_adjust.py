"""Where a bundle adjustment's host time goes: cProfile of one solve after a warm-up solve.

Prints the functions with the most time of their own (waits for the device included, in the
pyopencl calls that block) and the solve's ``times``. For the device time per kernel, see
``bench_bundle_adjust.py`` (its profiled solve).

    python benchmarks/profile_bundle_adjust.py [BAL file | --scale venice] [--linear-solver S] [--top N]
"""
import argparse
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import solvers  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("problem", nargs="?", help="a BAL file (default: a synthetic problem)")
    p.add_argument("--scale", choices=["venice"], help="the venice-size synthetic problem")
    p.add_argument("--linear-solver", default="sparse_schur", choices=list(solvers.LINEAR_SOLVERS))
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    if args.problem:
        problem = solvers.read_bal(args.problem)
    elif args.scale == "venice":
        problem = solvers.synthetic_problem(1778, 993923, 5.0708, seed=1)
    else:
        problem = solvers.synthetic_problem(20, 2000, 4, seed=1)
    kw = dict(linear_solver=args.linear_solver, max_iterations=args.iterations, handle_sigint=False)
    solvers.bundle_adjust(problem, **kw)                       # builds every kernel
    # The fixed cost of a solve: set-up and iteration 0 alone (median of 3).
    setup = []
    for _ in range(3):
        t0 = time.perf_counter()
        solvers.bundle_adjust(problem, **{**kw, "max_iterations": 0})
        setup.append(time.perf_counter() - t0)
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        solvers.bundle_adjust(problem, **kw)
        walls.append(time.perf_counter() - t0)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    result = solvers.bundle_adjust(problem, **kw)
    prof.disable()
    wall = time.perf_counter() - t0
    print(f"{args.problem or args.scale or 'synthetic'}: {args.linear_solver}, {result.iterations} iterations, "
          f"{wall:.3f} s under the profiler, {sorted(walls)[1]:.4f} s without (median of 3), of which "
          f"{sorted(setup)[1]:.4f} s set-up and iteration 0 (a solve of 0 iterations); state {result.state}, "
          f"{result.linear_solver_detail}")
    print({k: round(v, 4) for k, v in result.times.items()})
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
