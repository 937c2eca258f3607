"""Residuals + Jacobians of every observation of each BAL problem: pyclad (codegen and
tape backends, float64 and float32) against Ceres' AutoDiffCostFunction in the same run,
with the same thread count.

pyclad figures:
  kernel - the evaluation kernel alone (OpenCL profiling events), inputs already on the device;
  call   - values_and_jacobians() on device arrays, wall clock (index validation included);
  host   - values_and_jacobians() on numpy arrays, wall clock (transfers both ways included).
Ceres figures (benchmarks/peers/ceres_jacobian.cc): autodiff - AutoDiffCostFunction::Evaluate per
observation over N threads; problem - ceres::Problem::Evaluate into a CRS matrix; solver - the
Jacobian evaluation as Ceres' own solver performs it (its reported Jacobian evaluation time per
evaluation during a SPARSE_SCHUR solve with N threads, median over solves; the comparison the
tape paper makes), for the BAL files (``--solver-synthetic`` adds the synthetic ones).

    python benchmarks/bench_jacobian.py                  # the shared BAL problems + a synthetic one
    python benchmarks/bench_jacobian.py --synthetic 2000000 --threads 16
"""
import os
import sys
import tempfile

import numpy as np
import pyopencl.array as cla

import harness
import ceres_peer

import pyclad as pc  # noqa: E402
from solvers.bal import BALProblem, read_bal, write_bal  # noqa: E402
from solvers.models.snavely import snavely_residual  # noqa: E402


def synthetic(n_obs, n_cams=None, seed=0) -> BALProblem:
    """Random cameras around random points: every observation in front of its camera."""
    rng = np.random.default_rng(seed)
    n_cams = n_cams or max(10, n_obs // 5000)
    n_pts = max(10, n_obs // 5)
    cams = np.zeros((n_cams, 9))
    cams[:, 0:3] = rng.normal(0, 0.2, (n_cams, 3))
    cams[:, 3:5] = rng.normal(0, 0.5, (n_cams, 2))
    cams[:, 5] = -10.0 + rng.normal(0, 0.5, n_cams)
    cams[:, 6] = rng.uniform(400, 800, n_cams)
    cams[:, 7:9] = rng.normal(0, [1e-2, 1e-4], (n_cams, 2))
    pts = rng.normal(0, 1, (n_pts, 3))
    obs = rng.normal(0, 100, (n_obs, 2))
    ci = rng.integers(0, n_cams, n_obs)
    pi = np.concatenate([np.arange(min(n_pts, n_obs)), rng.integers(0, n_pts, max(0, n_obs - n_pts))])
    return BALProblem(cams, pts, ci, pi, obs, name=f"synthetic-{n_obs}")


def bytes_per_tuple(itemsize):
    # compulsory traffic: index (2 int32) + observation (2) in; residual (2) + Jacobians (2 x 12) out
    return 8 + itemsize * (2 + 2 + 24)


def bench_pyclad(report, args, problem, ceres_rate, solver_rate=None):
    n = problem.num_observations
    runtime = report.runtime
    q = runtime.queue
    index = np.stack([problem.camera_index, problem.point_index], axis=1).astype(np.int32)
    for dtype in (np.float64, np.float32):
        if dtype == np.float64 and not runtime.info.fp64:
            continue
        params = [problem.cameras.astype(dtype), problem.points.astype(dtype)]
        obs = problem.observations.astype(dtype)
        dev = [cla.to_device(q, p) for p in params]
        dev_index, dev_obs = cla.to_device(q, index), cla.to_device(q, obs)
        for backend in ("codegen", "tape"):
            f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, dtype=dtype, backend=backend,
                                 device=runtime)

            def launch():
                r, _ = f.values_and_jacobians(dev, dev_index, data=dev_obs)
                return list(r.events)  # the tape may take several launches
            kernel = harness.time_events(launch, warmup=args.warmup, repeat=args.repeat)
            call = harness.time_wall(lambda: (f.values_and_jacobians(dev, dev_index, data=dev_obs), q.finish()),
                                     warmup=1, repeat=max(3, args.repeat // 2))
            host = harness.time_wall(lambda: f.values_and_jacobians(params, index, data=obs),
                                     warmup=1, repeat=max(3, args.repeat // 2))
            name = np.dtype(dtype).name
            for mode, t in (("kernel", kernel), ("call", call), ("host", host)):
                row = report.add(case=problem.name, variant=f"pyclad {backend} {name} {mode}", timing=t,
                                 items=n, bytes_moved=n * bytes_per_tuple(np.dtype(dtype).itemsize))
                if ceres_rate:
                    row["x_ceres_autodiff"] = row["items_per_s"] / ceres_rate
                    print(f"    -> {row['x_ceres_autodiff']:.2f}x Ceres autodiff", flush=True)
                if solver_rate:
                    row["x_ceres_solver"] = row["items_per_s"] / solver_rate


def bench_ceres(report, args, path, name, n):
    if not ceres_peer.available():
        print(f"  Ceres peer unavailable: {ceres_peer.unavailable_reason()}", flush=True)
        return None
    res = ceres_peer.jacobian(path, threads=args.threads, repeat=args.repeat, warmup=args.warmup)
    for mode in ("autodiff", "problem"):
        r = res[mode]
        report.add(case=name, variant=f"ceres {mode} {args.threads} threads",
                   timing=harness.Timing(r["samples_s"]), items=n,
                   bytes_moved=n * bytes_per_tuple(8))
    return res["autodiff"]["obs_per_s"]


def bench_ceres_solver(report, args, path, name, n, solves=3):
    """Ceres' Jacobian evaluation inside its own SPARSE_SCHUR solve: the time it reports per
    evaluation, one sample per solve (10 iterations each)."""
    if not ceres_peer.available():
        return None
    samples = []
    for _ in range(solves):
        t = ceres_peer.bundle_adjust(path, linear_solver="sparse_schur", threads=args.threads,
                                     max_iterations=10)["times"]
        samples.append(t["jacobian_evaluation_s"] / max(1, t["num_jacobian_evaluations"]))
    timing = harness.Timing(samples)
    report.add(case=name, variant=f"ceres solver jacobian evaluation {args.threads} threads", timing=timing,
               items=n, bytes_moved=n * bytes_per_tuple(8))
    return n / timing.median


def main():
    p = harness.parser(__doc__)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="Ceres threads (default: all cores)")
    p.add_argument("--synthetic", type=int, nargs="*", default=[1_000_000],
                   help="sizes of synthetic problems to add (observations)")
    p.add_argument("--problems", nargs="*", default=None, help="BAL files (default: the shared ones)")
    p.add_argument("--solver-synthetic", action="store_true",
                   help="also time Ceres' in-solver Jacobian evaluation on the synthetic problems")
    args = p.parse_args()
    if args.quick:
        args.repeat, args.synthetic = min(args.repeat, 5), [200_000]
    report = harness.Report("bench_jacobian", args, ceres_threads=args.threads,
                            pocl_note="PoCL uses every core of the machine")
    paths = args.problems if args.problems is not None else ceres_peer.bal_files()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [(path, read_bal(path)) for path in paths]
        for n in args.synthetic:
            problem = synthetic(n)
            path = os.path.join(tmp, problem.name + ".txt")
            write_bal(problem, path)
            jobs.append((path, problem))
        for path, problem in jobs:
            print(f"{problem.name}: {problem.num_observations} observations", flush=True)
            rate = bench_ceres(report, args, path, problem.name, problem.num_observations)
            solver = None
            if args.solver_synthetic or not problem.name.startswith("synthetic"):
                solver = bench_ceres_solver(report, args, path, problem.name, problem.num_observations,
                                            solves=1 if args.quick else 3)
            bench_pyclad(report, args, problem, rate, solver)
    report.write(["case", "variant", "median_s", "spread", "items_per_s", "x_ceres_autodiff", "x_ceres_solver",
                  "GB_per_s"])


if __name__ == "__main__":
    sys.exit(main())
