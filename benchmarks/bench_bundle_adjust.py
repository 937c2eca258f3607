"""Bundle adjustment end to end: pyclad's solver against Ceres Solver in the same run.

Every BAL problem in ../shared/data/bal (or $PYCLAD_BAL_DIR) and synthetic problems of growing
size, with SPARSE_SCHUR and ITERATIVE_SCHUR, the same options on both sides (Levenberg-Marquardt,
50 iterations on BAL problems, tolerances 1e-6 / 1e-10 / 1e-8, Jacobi scaling, no loss) and the
same thread count for Ceres as the machine has cores. Reported: wall time of the solve (reading
the file excluded on both sides), final cost, iterations, the time ratio pyclad / Ceres and the
final-cost ratio; for the synthetic sizes also the time per observation per iteration (how cost
grows with size). Synthetic problems run a fixed number of iterations on both sides.

``--scale venice,final,4x`` adds the large synthetic problems (venice size: 1,778 cameras, 993,923
points, 5.04M observations, 10 iterations; final size: 13,682 cameras, 4.46M points, 29.0M
observations, 5 iterations; 4x: four times final's points and observations, 116M, 3 iterations;
pyclad alone at final and 4x), with both solvers (device-resident on a GPU) and Ceres'
SPARSE_SCHUR at venice size (its ITERATIVE_SCHUR does not finish there in minutes, and at final
size neither does in the time a run has).

Beside each pyclad time: where the iterations ran (``state``), a second, profiled solve's time in
device kernels against the rest (``kernel_s``, ``host_s``), the bytes that crossed to and from the
device per iteration, and the ratio to Ceres' faster solver on the same problem; ``setup_s``, the
solve's time before iteration 0 (``times["setup"]``), and ``first_at_size_s``, the first solve of
that size in the process (the warm-up, right after a short solve of another size, so that the
device has not sat idle while Ceres ran) with its ratio to the warm median. The first solve in
the process (kernel builds, or the binary cache) is timed apart, before all.

``--dtypes float64,float32`` adds iterative_schur with float32 storage (``final_cost_f64``: its
solution's cost evaluated in float64). ``--float64-factor`` adds sparse_schur with
``mixed_precision_solves=False`` (variant ``-float64-factor``: the device's dense Cholesky in
float64 throughout, against the default's float32 factorisation refined in float64 on GPUs from
8,192 unknowns).

    python benchmarks/bench_bundle_adjust.py [--quick] [--device SPEC] [--threads N] [--out DIR]
                                             [--scale venice,final] [--no-bal] [--no-synthetic]
                                             [--dtypes float64,float32]
"""
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import harness  # noqa: E402
import ceres_peer  # noqa: E402
import solvers  # noqa: E402

SOLVERS = ("sparse_schur", "iterative_schur")
# (cameras, points, observations per point, iterations): 8k to 1.2M observations.
SYNTHETIC_FULL = [(20, 2000, 4, 10), (60, 25000, 4, 10), (200, 100000, 5, 10), (600, 300000, 4, 5)]
SYNTHETIC_QUICK = [(20, 2000, 4, 10), (60, 25000, 4, 10)]
# name: (cameras, points, mean observations per point, iterations, Ceres' solvers run there,
# pyclad's): at final size the reduced camera matrix (123,138 unknowns, ~190M observation pairs)
# is past the device's dense Cholesky, and Ceres does not finish either solver in the time a run has.
SCALES = {"venice": (1778, 993923, 5.0708, 10, ("sparse_schur",), SOLVERS),
          "final": (13682, 4460000, 6.502, 5, (), ("iterative_schur",)),
          "4x": (13682, 4 * 4456117, 28987644 / 4456117, 3, (), ("iterative_schur",))}


def ceres_solve(path, solver, threads, iterations):
    try:
        out = ceres_peer.bundle_adjust(path, solver, threads=threads, max_iterations=iterations)
    except ceres_peer.CeresPeerError as e:
        return None, str(e)
    return out, None


def pyclad_row(problem, solver, iterations, device, args, dtype="float64", **options):
    """pyclad's timed solves and, on the device path, a profiled one: (Timing, row fields).
    ``options``: more solver options (``mixed_precision_solves``)."""
    samples, result = [], None
    kw = dict(linear_solver=solver, max_iterations=iterations, device=device, handle_sigint=False,
              dtype=np.dtype(dtype), **options)
    # A short solve of another size first: the device has just worked when this size's first
    # solve starts, as in a process that solves one problem after another. Without it that
    # solve came right after Ceres' run, tens of seconds of an idle GPU at venice size, and
    # first_at_size_s mixed the device's wake-up with what a new size costs.
    solvers.bundle_adjust(solvers.synthetic_problem(16, 800, 3, seed=2), **dict(kw, max_iterations=2))
    # Warm-up solves of this very problem (the rule: after warm-up): its launch plans and pooled
    # buffers made.
    first_s = None
    for _ in range(args.warmup):
        t0 = time.perf_counter()
        solvers.bundle_adjust(problem, **kw)
        first_s = time.perf_counter() - t0 if first_s is None else first_s
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        result = solvers.bundle_adjust(problem, **kw)
        samples.append(time.perf_counter() - t0)
    ours = harness.Timing(samples)
    steps, n_obs, t = max(result.iterations, 1), problem.num_observations, result.transfers
    row = dict(observations=n_obs, final_cost=result.final_cost, initial_cost=result.initial_cost,
               iterations=result.iterations, termination=result.termination_type,
               jacobian_s=result.times["jacobian_evaluation"], linear_solver_s=result.times["linear_solver"],
               setup_s=result.times["setup"], other_s=result.times["other"],
               # The first solve of this size in the process (a warm-up: the programs were made
               # by the tiny first solves) against the warm median.
               first_at_size_s=first_s, first_vs_warm=None if first_s is None else first_s / ours.median,
               us_per_obs_iter=ours.median / (n_obs * steps) * 1e6, state=result.state,
               bytes_to_host_per_iter=t.get("bytes_to_host", 0) / steps,
               bytes_to_device_per_iter=t.get("bytes_to_device", 0) / steps,
               bytes_at_start=t.get("bytes_at_start"), bytes_at_end=t.get("bytes_at_end"))
    if np.dtype(dtype) != np.float64:
        # The float32 solution's cost as float64 evaluates it (what it is worth, not its estimate).
        # (iterative_schur: no linear solve at 0 iterations, and no reduced camera matrix, which
        # sparse_schur's default would size, past 32-bit indices at 4x)
        row["final_cost_f64"] = solvers.bundle_adjust(result.problem, max_iterations=0, device=device,
                                                      linear_solver="iterative_schur",
                                                      handle_sigint=False).initial_cost
    if result.state == "device" and not args.no_profile:
        t0 = time.perf_counter()
        prof = solvers.bundle_adjust(problem, profile_kernels=True, **kw)
        wall = time.perf_counter() - t0
        kernels = prof.times["device_kernels"]
        row.update(kernel_s=kernels["total"], host_s=wall - kernels["total"],
                   kernels={k: round(v, 6) for k, v in kernels.items() if k != "total"})
    return ours, row


def ceres_row(report, name, path, solver, iterations, args, n_obs):
    """Ceres' timed solves, reported as their own row: ``(Timing, final cost)``, or ``(None, why)``."""
    samples, out = [], None
    for _ in range(max(1, args.repeat)):
        o, why = ceres_solve(path, solver, args.threads, iterations)
        if o is None:
            report.add(case=name, variant=f"ceres-{solver}", failed=why)
            return None, why
        out = o
        samples.append(o["times"]["solve_wall_s"])
    ct = harness.Timing(samples)
    report.add(case=name, variant=f"ceres-{solver}", timing=ct, observations=n_obs,
               final_cost=out["final_cost"], initial_cost=out["initial_cost"],
               iterations=out["iterations"]["steps"], termination=out["termination"]["type"],
               threads=args.threads,
               us_per_obs_iter=ct.median / (n_obs * max(out["iterations"]["steps"], 1)) * 1e6)
    return ct, out["final_cost"]


def main():
    p = harness.parser(__doc__)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="Ceres' threads (default: all cores)")
    p.add_argument("--solvers", default=",".join(SOLVERS))
    p.add_argument("--no-bal", action="store_true", help="skip the real BAL problems")
    p.add_argument("--no-synthetic", action="store_true", help="skip the synthetic problems")
    p.add_argument("--scale", default="", help="large synthetic problems: venice,final,4x")
    p.add_argument("--no-profile", action="store_true", help="skip the profiled second solve")
    p.add_argument("--float64-factor", action="store_true",
                   help="sparse_schur also with mixed_precision_solves=False (variant -float64-factor)")
    p.add_argument("--dtypes", default="float64",
                   help="pyclad's storage types, e.g. float64,float32 (float32: iterative_schur only)")
    p.set_defaults(repeat=1, warmup=1)
    args = p.parse_args()
    chosen = [s for s in args.solvers.split(",") if s]
    have_ceres = ceres_peer.available()
    report = harness.Report("bench_bundle_adjust", args, ceres_threads=args.threads,
                            ceres=("available" if have_ceres else ceres_peer.unavailable_reason()))
    device = report.runtime
    # Build every kernel once, outside any timing; this first solve is reported on its own.
    dtypes = [d for d in args.dtypes.split(",") if d]
    # sparse_schur also with mixed-precision solves forced: GPUs take them from 8,192 unknowns on,
    # and their programs, like every other, are then built before the sizes are timed.
    for solver, dtype, mixed in ([(s, "float64", None) for s in SOLVERS] + [("sparse_schur", "float64", True)]
                                 + [("iterative_schur", d, None) for d in dtypes if d != "float64"]):
        t0 = time.perf_counter()
        first = solvers.bundle_adjust(solvers.synthetic_problem(4, 20, 2), device=device, max_iterations=2,
                                      linear_solver=solver, handle_sigint=False, dtype=np.dtype(dtype),
                                      mixed_precision_solves=mixed)
        report.add(case="first-solve-in-process",
                   variant=f"pyclad-{solver}" + ("" if dtype == "float64" else f"-{dtype}")
                   + ("-mixed" if mixed else ""),
                   timing=harness.Timing([time.perf_counter() - t0]), state=first.state)

    cases = []
    if not args.no_bal:
        folder = ceres_peer.bal_dir()
        for path in (ceres_peer.bal_files(folder) if folder else []):
            cases.append((solvers.bal.problem_name(path), path, None, 50))
    tmp_dir = tempfile.TemporaryDirectory(prefix="bench_ba_")
    ceres_best = {}
    if not args.no_synthetic:
        for nc, npt, k, its in (SYNTHETIC_QUICK if args.quick else SYNTHETIC_FULL):
            cases.append((f"synthetic-{nc}-{npt}-{k}", None, (nc, npt, k), its))
    scale_ceres, scale_ours = {}, {}
    for scale in [s for s in args.scale.split(",") if s]:
        if scale not in SCALES:
            p.error(f"--scale {scale!r}: choose from {', '.join(SCALES)}")
        nc, npt, k, its, ceres_solvers, ours = SCALES[scale]
        cases.append((f"{scale}-size", None, (nc, npt, k), its))
        scale_ceres[f"{scale}-size"] = ceres_solvers
        scale_ours[f"{scale}-size"] = ours

    for name, path, size, iterations in cases:
        t0 = time.perf_counter()
        problem = solvers.read_bal(path) if path else solvers.synthetic_problem(*size, seed=1)
        print(f"{name}: {problem.num_observations} observations, made in {time.perf_counter() - t0:.1f} s",
              flush=True)
        at_scale = name in scale_ceres
        if path is None and have_ceres and (not at_scale or scale_ceres[name]):
            path = os.path.join(tmp_dir.name, name + ".txt")
            solvers.write_bal(problem, path)
        n_obs = problem.num_observations
        rows = []
        for solver in chosen:
            # At scale pyclad runs both solvers (device-resident), Ceres the solvers SCALES names.
            if not have_ceres:
                ceres_t, ceres_cost = None, ceres_peer.unavailable_reason()
            elif at_scale and solver not in scale_ceres[name]:
                ceres_t, ceres_cost = None, "not run at this size (see the docstring)"
            else:
                ceres_t, ceres_cost = ceres_row(report, name, path, solver, iterations, args, n_obs)
            if ceres_t is not None:
                ceres_best[name] = min(ceres_best.get(name, float("inf")), ceres_t.median)
            for dtype in dtypes if solver in scale_ours.get(name, SOLVERS) else ():
                if dtype != "float64" and solver != "iterative_schur":
                    continue
                factors = [("", {})]
                if args.float64_factor and solver == "sparse_schur" and dtype == "float64":
                    factors.append(("-float64-factor", dict(mixed_precision_solves=False)))
                for suffix, options in factors:
                    timing, row = pyclad_row(problem, solver, iterations, device, args, dtype, **options)
                    if ceres_t is not None:
                        row["time_ratio_vs_ceres"] = timing.median / ceres_t.median
                        row["cost_ratio_vs_ceres"] = row.get("final_cost_f64", row["final_cost"]) / ceres_cost
                    else:
                        row["ceres"] = ceres_cost          # why there is no Ceres figure
                    variant = f"pyclad-{solver}" + ("" if dtype == "float64" else f"-{dtype}") + suffix
                    rows.append(report.add(case=name, variant=variant, timing=timing, **row))
        for row in rows:     # against Ceres' faster solver, once both have run
            if name in ceres_best:
                row["time_ratio_vs_ceres_best"] = row["median_s"] / ceres_best[name]
        write(report)        # after every case: a run cut short keeps what it measured
    write(report)


def write(report):
    report.write(["case", "variant", "observations", "median_s", "iterations", "final_cost", "final_cost_f64",
                  "time_ratio_vs_ceres", "time_ratio_vs_ceres_best", "cost_ratio_vs_ceres", "state",
                  "kernel_s", "host_s", "bytes_to_host_per_iter", "us_per_obs_iter", "jacobian_s",
                  "linear_solver_s", "setup_s", "other_s", "first_at_size_s", "first_vs_warm", "termination"])


if __name__ == "__main__":
    main()
