"""iterative_schur's GPU layout with and without project_points staging its observations in local
memory (solvers.linalg.schur_pcg_device.STAGED_PROJECTION), on a synthetic problem: the wall clock of
``solvers.bundle_adjust`` (median of ``--repeat`` solves after a warm-up, the variants in turns)
and, from a profiled solve, the kernels' event time per CG product kernel.

    PYCLAD_DEVICE=nvidia python benchmarks/bench_schur_pcg_layouts.py            # venice size
    python benchmarks/bench_schur_pcg_layouts.py --quick                         # 200k observations
"""
import time

import harness

import solvers
import solvers.linalg.schur_pcg_device as schur_pcg

VARIANTS = {"staged": dict(SPLIT_LAYOUT=True, STAGED_PROJECTION=True),
            "unstaged": dict(SPLIT_LAYOUT=True, STAGED_PROJECTION=False)}


def solve(problem, device, variant, **kw):
    saved = {k: getattr(schur_pcg, k) for k in VARIANTS[variant]}
    for k, v in VARIANTS[variant].items():
        setattr(schur_pcg, k, v)
    try:
        t0 = time.perf_counter()
        r = solvers.bundle_adjust(problem, linear_solver="iterative_schur", device=device, handle_sigint=False, **kw)
        return time.perf_counter() - t0, r
    finally:
        for k, v in saved.items():
            setattr(schur_pcg, k, v)


def main():
    p = harness.parser(__doc__)
    p.set_defaults(repeat=3)
    args = p.parse_args()
    report = harness.Report("bench_schur_pcg_layouts", args)
    device = report.runtime
    shape = (200, 40000, 5.0708) if args.quick else (1778, 993923, 5.0708)    # venice size
    problem = solvers.synthetic_problem(*shape, seed=1)
    results = {v: solve(problem, device, v)[1] for v in VARIANTS}              # warm-up: builds
    walls = {v: [] for v in VARIANTS}
    for _ in range(args.repeat):
        for v in VARIANTS:
            t, results[v] = solve(problem, device, v)
            walls[v].append(t)
    for v in VARIANTS:
        r = results[v]
        prof = solve(problem, device, v, profile_kernels=True)[1]
        k = prof.times.get("device_kernels") or {}
        report.add(case=f"{problem.num_observations} observations", variant=v, timing=harness.Timing(walls[v]),
                   iterations=len(r.history) - 1, cg_iterations=sum(it.linear_solver_iterations for it in r.history),
                   final_cost=r.final_cost, project_points_s=k.get("project_points", 0.0),
                   camera_rows_s=k.get("camera_rows", 0.0), camera_partials_s=k.get("camera_partials_cg", 0.0),
                   kernel_s=k.get("total", 0.0))
    report.write(["case", "variant", "median_s", "spread", "iterations", "cg_iterations", "final_cost",
                  "project_points_s", "camera_rows_s", "camera_partials_s", "kernel_s"])


if __name__ == "__main__":
    main()
