"""sparse_schur device-resident against the host path: wall time of ``solvers.bundle_adjust`` on
the BAL problems, after a warm-up solve of each variant, median of ``--repeat`` solves taken in
turn (host, device, ...) so that a shared machine's load falls on every variant alike.

Variants: ``host`` (device_resident=False, the reference path), ``device`` (device-resident, S
factorised where solvers.linalg.sparse_schur_device chooses), and with ``--all-routes`` the routes it
does not choose on this device: ``device-dense`` (the dense Cholesky on the device) and
``device-lapack`` (S read back and factorised by LAPACK on the host, up to its dense limit) and
``device-sparse`` (the best sparse Cholesky on the host).
"""
from __future__ import annotations

import glob
import os
import statistics
import time

import harness

import solvers
import solvers.linalg.factorisation_limits as limits

ROUTES = {"device-dense": dict(DEVICE_DENSE_MAX_CPU=10 ** 6, DEVICE_DENSE_MAX=10 ** 6),
          "device-lapack": dict(DEVICE_DENSE_MAX_CPU=0, DEVICE_DENSE_MAX=0),
          "device-sparse": dict(DEVICE_DENSE_MAX_CPU=0, DEVICE_DENSE_MAX=0, HOST_DENSE_MAX=0)}


def solve(problem, device, variant):
    defaults = {name: getattr(limits, name) for name in ("DEVICE_DENSE_MAX_CPU", "DEVICE_DENSE_MAX", "HOST_DENSE_MAX")}
    for name, value in ROUTES.get(variant, {}).items():
        setattr(limits, name, value)
    try:
        t0 = time.perf_counter()
        r = solvers.bundle_adjust(problem, linear_solver="sparse_schur", device=device, handle_sigint=False,
                                  device_resident=variant != "host")
        return time.perf_counter() - t0, r
    finally:
        for name, value in defaults.items():
            setattr(limits, name, value)


def main():
    p = harness.parser(__doc__)
    p.add_argument("--all-routes", action="store_true", help="also the routes not chosen on this device")
    p.set_defaults(repeat=3)
    args = p.parse_args()
    report = harness.Report("bench_sparse_schur_device", args)
    device = report.runtime
    folder = os.environ.get("PYCLAD_BAL_DIR", os.path.join(harness.HERE, "..", "..", "shared", "data", "bal"))
    paths = sorted(glob.glob(os.path.join(folder, "problem-*.txt*")), key=os.path.getsize)
    if not paths:
        raise SystemExit(f"no BAL problems in {folder} (set PYCLAD_BAL_DIR)")
    variants = ["host", "device"] + (list(ROUTES) if args.all_routes else [])
    for path in paths:
        name = os.path.basename(path).split(".")[0]
        problem = solvers.read_bal(path)
        results = {v: solve(problem, device, v)[1] for v in variants}        # warm-up
        samples = {v: [] for v in variants}
        for _ in range(args.repeat):
            for v in variants:
                t, results[v] = solve(problem, device, v)
                samples[v].append(t)
        host = statistics.median(samples["host"])
        for v in variants:
            r = results[v]
            report.add(case=name, variant=v, timing=harness.Timing(samples[v]),
                       ratio_to_host=statistics.median(samples[v]) / host, iterations=len(r.history) - 1,
                       final_cost=r.final_cost, factorised=r.linear_solver_detail.split(", ")[-1])
    report.write(["case", "variant", "median_s", "spread", "ratio_to_host", "iterations", "final_cost",
                  "factorised"])


if __name__ == "__main__":
    main()
