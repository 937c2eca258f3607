"""Bundle adjustment end to end: pyclad's solver against Ceres Solver in the same run.

Every BAL problem in ../shared/data/bal (or $PYCLAD_BAL_DIR) and synthetic problems of growing
size, with SPARSE_SCHUR and ITERATIVE_SCHUR, the same options on both sides (Levenberg-Marquardt,
50 iterations on BAL problems, tolerances 1e-6 / 1e-10 / 1e-8, Jacobi scaling, no loss) and the
same thread count for Ceres as the machine has cores. Reported: wall time of the solve (reading
the file excluded on both sides), final cost, iterations, the time ratio pyclad / Ceres and the
final-cost ratio; for the synthetic sizes also the time per observation per iteration (how cost
grows with size). Synthetic problems run a fixed number of iterations on both sides.

    python benchmarks/bench_bundle_adjust.py [--quick] [--device SPEC] [--threads N] [--out DIR]
"""
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import harness  # noqa: E402
import ceres_peer  # noqa: E402
import solvers  # noqa: E402

SOLVERS = ("sparse_schur", "iterative_schur")
# (cameras, points, observations per point, iterations): 8k to 1.2M observations.
SYNTHETIC_FULL = [(20, 2000, 4, 10), (60, 25000, 4, 10), (200, 100000, 5, 10), (600, 300000, 4, 5)]
SYNTHETIC_QUICK = [(20, 2000, 4, 10), (60, 25000, 4, 10)]


def ceres_solve(path, solver, threads, iterations):
    try:
        out = ceres_peer.bundle_adjust(path, solver, threads=threads, max_iterations=iterations)
    except ceres_peer.CeresPeerError as e:
        return None, str(e)
    return out, None


def main():
    p = harness.parser(__doc__)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="Ceres' threads (default: all cores)")
    p.add_argument("--solvers", default=",".join(SOLVERS))
    p.add_argument("--no-bal", action="store_true", help="skip the real BAL problems")
    p.add_argument("--no-synthetic", action="store_true", help="skip the synthetic problems")
    p.set_defaults(repeat=1, warmup=0)
    args = p.parse_args()
    chosen = [s for s in args.solvers.split(",") if s]
    have_ceres = ceres_peer.available()
    report = harness.Report("bench_bundle_adjust", args, ceres_threads=args.threads,
                            ceres=("available" if have_ceres else ceres_peer.unavailable_reason()))
    device = report.runtime
    # Build the camera model's kernels once, outside any timing.
    solvers.bundle_adjust(solvers.synthetic_problem(4, 20, 2), device=device, max_iterations=1,
                          handle_sigint=False)

    cases = []
    if not args.no_bal:
        folder = ceres_peer.bal_dir()
        for path in (ceres_peer.bal_files(folder) if folder else []):
            cases.append((solvers.bal.problem_name(path), path, None, 50))
    tmp_dir = tempfile.TemporaryDirectory(prefix="bench_ba_")
    if not args.no_synthetic:
        for nc, npt, k, its in (SYNTHETIC_QUICK if args.quick else SYNTHETIC_FULL):
            cases.append((f"synthetic-{nc}-{npt}-{k}", None, (nc, npt, k), its))

    for name, path, size, iterations in cases:
        problem = solvers.read_bal(path) if path else solvers.synthetic_problem(*size, seed=1)
        if path is None:
            path = os.path.join(tmp_dir.name, name + ".txt")
            solvers.write_bal(problem, path)
        n_obs = problem.num_observations
        for solver in chosen:
            samples, result = [], None
            for _ in range(max(1, args.repeat)):
                t0 = time.perf_counter()
                result = solvers.bundle_adjust(problem, linear_solver=solver, max_iterations=iterations,
                                               device=device, handle_sigint=False)
                samples.append(time.perf_counter() - t0)
            ours = harness.Timing(samples)
            steps = max(result.iterations, 1)
            row = dict(observations=n_obs, final_cost=result.final_cost, initial_cost=result.initial_cost,
                       iterations=result.iterations, termination=result.termination_type,
                       jacobian_s=result.times["jacobian_evaluation"], linear_solver_s=result.times["linear_solver"],
                       us_per_obs_iter=ours.median / (n_obs * steps) * 1e6)
            ceres_samples, ceres_out, why = [], None, None
            if have_ceres:
                for _ in range(max(1, args.repeat)):
                    out, why = ceres_solve(path, solver, args.threads, iterations)
                    if out is None:
                        break
                    ceres_out = out
                    ceres_samples.append(out["times"]["solve_wall_s"])
            if ceres_out is not None:
                ct = harness.Timing(ceres_samples)
                report.add(case=name, variant=f"ceres-{solver}", timing=ct, observations=n_obs,
                           final_cost=ceres_out["final_cost"], initial_cost=ceres_out["initial_cost"],
                           iterations=ceres_out["iterations"]["steps"], termination=ceres_out["termination"]["type"],
                           threads=args.threads,
                           us_per_obs_iter=ct.median / (n_obs * max(ceres_out["iterations"]["steps"], 1)) * 1e6)
                row["time_ratio_vs_ceres"] = ours.median / ct.median
                row["cost_ratio_vs_ceres"] = result.final_cost / ceres_out["final_cost"]
            else:
                row["ceres"] = why or ceres_peer.unavailable_reason()
            report.add(case=name, variant=f"pyclad-{solver}", timing=ours, **row)
    report.write(["case", "variant", "observations", "median_s", "iterations", "final_cost",
                  "time_ratio_vs_ceres", "cost_ratio_vs_ceres", "us_per_obs_iter", "jacobian_s",
                  "linear_solver_s", "termination"])


if __name__ == "__main__":
    main()
