"""Convergence of one bundle adjustment beside Ceres': the cost after each iteration against the
time each solver reports for it, on a real BAL problem, in the same run.

- pyclad: ``solvers.bundle_adjust`` in this process, after one untimed solve of the same problem
  (so kernel builds are not counted); ``result.history`` gives each iteration's cost and its
  ``cumulative_time`` (seconds since the solve began). The wall clock around the timed call is
  reported beside it.
- Ceres: the peer program (``benchmarks/ceres_peer.py``, the same Levenberg-Marquardt options,
  Ceres' ``num_threads``) as a process; its ``history`` gives ``cumulative_time_s`` per iteration
  (Ceres' own clock, from the start of its solve), and ``solve_wall_s`` the whole solve.

Both start from the same file and stop by the same tolerances, so the curves begin at the same
cost; the rows hold every iteration, successful or not (an unsuccessful step keeps the cost).

    python benchmarks/bench_convergence.py [--bal problem-49-7776-pre.txt.bz2] [--linear-solver
        iterative_schur] [--threads 2] [--device SPEC]

Writes bench_convergence-<vendor>-full.{json,md}; ``benchmarks/plots.py`` draws the curves.
"""
import os
import sys
import time

import harness
import ceres_peer  # noqa: E402  (harness put the checkout on sys.path)
import solvers  # noqa: E402


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--bal", default="problem-49-7776-pre.txt.bz2",
                        help="a BAL file, or a name looked up in PYCLAD_BAL_DIR / shared/data/bal")
    parser.add_argument("--linear-solver", default="iterative_schur",
                        choices=("iterative_schur", "sparse_schur"), help="the same for both solvers")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="Ceres' num_threads")
    args = parser.parse_args()
    path = args.bal
    if not os.path.exists(path):
        folder = ceres_peer.bal_dir()
        if folder is None or not os.path.exists(os.path.join(folder, path)):
            sys.exit(f"--bal {path}: no such file, and no BAL folder holds it (set PYCLAD_BAL_DIR)")
        path = os.path.join(folder, path)
    if not ceres_peer.available():
        sys.exit(f"the Ceres peer is not available: {ceres_peer.unavailable_reason()}")
    name = os.path.basename(path).split(".")[0]
    report = harness.Report("bench_convergence", args, problem=name, linear_solver=args.linear_solver,
                            ceres_threads=args.threads)
    rt = report.runtime
    problem = solvers.read_bal(path)
    solvers.bundle_adjust(problem, linear_solver=args.linear_solver, device=rt)     # builds, untimed
    t0 = time.perf_counter()
    ours = solvers.bundle_adjust(problem, linear_solver=args.linear_solver, device=rt)
    wall = time.perf_counter() - t0
    peer = ceres_peer.bundle_adjust(path, args.linear_solver, threads=args.threads)
    report.meta.update(pyclad_wall_s=wall, pyclad_final_cost=ours.final_cost,
                       ceres_solve_wall_s=peer["times"]["solve_wall_s"], ceres_final_cost=peer["final_cost"],
                       pyclad_iterations=len(ours.history) - 1, ceres_iterations=len(peer["history"]) - 1)
    for it in ours.history:
        report.add(case=name, variant="pyclad", iteration=it.iteration, cost=it.cost,
                   cumulative_s=it.cumulative_time, successful=it.step_is_successful)
    for it in peer["history"]:
        report.add(case=name, variant="ceres", iteration=it["iteration"], cost=it["cost"],
                   cumulative_s=it["cumulative_time_s"], successful=it["step_is_successful"])
    report.write(["case", "variant", "iteration", "cost", "cumulative_s", "successful"])
    print(f"pyclad: {wall:.3f} s wall, final cost {ours.final_cost:.6e}; "
          f"Ceres: {peer['times']['solve_wall_s']:.3f} s, final cost {peer['final_cost']:.6e}")


if __name__ == "__main__":
    main()
