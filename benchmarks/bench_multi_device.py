"""Bundle adjustment split over devices (or MPI ranks): time per LM iteration, scaling and traffic.

For K = 1, 2, 4, 8 devices (as many as the machine has; ``--devices``), the same problem is solved
for ``--iterations`` LM iterations with its points split over K devices (solvers.split.partitioned and
solvers.split.partitioned_device; K = 1 is the same code with one part, so the ratios compare like with
like), and once by the default one-device solve for reference. Per run: wall clock per LM
iteration after the first (the solve's iteration times, as its log prints them; the setup and
iteration 0 are ``setup_s``; ``call_s`` is the wall clock of the whole ``bundle_adjust`` call),
median of ``--repeat`` solves after a warm-up solve,
scaling efficiency ``t(1) / (K t(K))``, the bytes one part contributes to the reductions per
iteration, and the final cost against the one-part solve's (they must agree to 1e-9).

With ``--parts-on-one-device K`` the split also runs with K parts on the first device, a queue
each: on a machine with one GPU this measures what splitting costs (the reductions, the host's
part in every CG step) at the problem's size, and checks the split's result there. It is not a
scaling figure: the parts share one device.

Under MPI (``mpirun -n K python benchmarks/bench_multi_device.py --mpi``) the K ranks run the
split solve with Allreduce; rank 0 runs the one-part and one-device solves alone first, and
reports.

    python benchmarks/bench_multi_device.py                        # BAL problem-49, this host's devices
    python benchmarks/bench_multi_device.py --synthetic final      # 13,682 cameras, 4.46M points, 29M obs.
    python benchmarks/bench_multi_device.py --synthetic 4x         # four times as many points and observations
    python benchmarks/bench_multi_device.py --parts-on-one-device 2   # a machine of one GPU: see below
    POCL_DEVICES="pthread pthread" python benchmarks/bench_multi_device.py   # two CPU devices
    mpirun -n 2 python benchmarks/bench_multi_device.py --mpi
"""
import sys
import time

import numpy as np


import harness
import ceres_peer

import solvers  # noqa: E402
from clkernels.multi_device import resolve  # noqa: E402

SIZES = {"final": (13682, 4456117, 28987644 / 4456117), "4x": (13682, 4 * 4456117, 28987644 / 4456117)}


def problem_of(args):
    if args.synthetic:
        if args.synthetic in SIZES:
            nc, npt, per = SIZES[args.synthetic]
        else:
            nc, npt, per = (float(v) for v in args.synthetic.split(","))
        return solvers.synthetic_problem(int(nc), int(npt), per, seed=0)
    path = args.problem or next(f for f in ceres_peer.bal_files() if "problem-49-" in f)
    return solvers.read_bal(path)


def queues_on(runtime, k):
    """``k`` runtimes of one device, a queue each, as ``devices=`` takes them: the split's
    check that every device comes once (clkernels.multi_device.resolve) is passed by the
    benchmark alone, which patches it for this case."""
    import pyopencl as cl
    from clkernels import multi_device
    from clkernels.runtime import runtime_for_queue
    runtimes = [runtime] + [runtime_for_queue(cl.CommandQueue(runtime.context, runtime.device)) for _ in range(k - 1)]
    multi_device.resolve = lambda devices, _resolve=multi_device.resolve: (
        list(devices) if devices is runtimes or list(devices) == runtimes else _resolve(devices))
    return runtimes


def per_iteration(r):
    """Seconds per LM iteration after the first evaluation (the solve's setup and iteration 0 are
    the ``setup_s`` column)."""
    later = [h.iteration_time for h in r.history[1:]]
    return sum(later) / max(1, len(later))


def solve_time(problem, iterations, repeat, **kw):
    """(median seconds per LM iteration, the last result, median wall clock of the whole public
    call) over ``repeat`` solves after one."""
    solvers.bundle_adjust(problem, max_iterations=iterations, **kw)
    per, calls, r = [], [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = solvers.bundle_adjust(problem, max_iterations=iterations, **kw)   # returns host arrays: synced
        calls.append(time.perf_counter() - t0)
        per.append(per_iteration(r))
    r.call_s = float(np.median(calls))
    return harness.Timing(per), r


def main():
    p = harness.parser(__doc__)
    p.add_argument("--problem", default=None, help="a BAL file (default: problem-49 of the shared set)")
    p.add_argument("--synthetic", default=None, help="'final', '4x' or CAMS,POINTS,OBS_PER_POINT")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--linear-solver", default="iterative_schur",
                   help="iterative_schur (default: the parts' states on their devices) or sparse_schur (host path)")
    p.add_argument("--devices", default=None, help="counts of devices to use, e.g. 1,2,4,8 (default: 1, 2, 4, 8 up to all)")
    p.add_argument("--mpi", action="store_true", help="under mpirun: the ranks split the solve")
    p.add_argument("--parts-on-one-device", type=int, default=0, metavar="K",
                   help="also split into K parts on the first device, a queue each (not a scaling figure)")
    p.set_defaults(repeat=3)
    args = p.parse_args()
    comm = None
    if args.mpi:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    root = comm is None or comm.Get_rank() == 0
    report = harness.Report("bench_multi_device" + ("-mpi" if comm else ""), args) if root else None
    problem = problem_of(args)
    n = problem.num_observations
    kw = dict(linear_solver=args.linear_solver)
    repeat = 1 if args.quick else args.repeat
    if root:
        print(f"{problem.name}: {problem.num_cameras} cameras, {problem.num_points} points, {n} observations", flush=True)
    case = f"{problem.name} {args.linear_solver}"
    rows = []
    if comm is not None:
        k = comm.Get_size()
        if root:
            t_one, one = solve_time(problem, args.iterations, repeat, devices=[report.runtime], **kw)
            t_dev, dev = solve_time(problem, args.iterations, repeat, **kw)
            rows.append(("one device (default solve)", 1, t_dev, dev))
            rows.append(("one part", 1, t_one, one))
        # The other ranks wait asleep: MPI's blocking waits spin, and would take the cores that
        # rank 0's one-process solves are timed on.
        waiting = comm.Ibarrier()
        while not waiting.Test():
            time.sleep(0.01)
        t_k, r_k = solve_time(problem, args.iterations, repeat, comm=comm, **kw)
        if root:
            rows.append((f"{k} MPI ranks", k, t_k, r_k))
    else:
        every = resolve("all")
        counts = [int(c) for c in args.devices.split(",")] if args.devices else \
            [c for c in (1, 2, 4, 8) if c <= len(every)]
        t_dev, dev = solve_time(problem, args.iterations, repeat, device=every[0], **kw)
        rows.append(("one device (default solve)", 1, t_dev, dev))
        for k in counts:
            t_k, r_k = solve_time(problem, args.iterations, repeat, devices=every[:k], **kw)
            rows.append((f"{k} device{'s' if k > 1 else ''}", k, t_k, r_k))
        if args.parts_on_one_device > 1:
            k = args.parts_on_one_device
            t_k, r_k = solve_time(problem, args.iterations, repeat, devices=queues_on(every[0], k), **kw)
            rows.append((f"{k} parts on one device", 1, t_k, r_k))
    if not root:
        return 0
    one = next(r for r in rows if r[0] in ("one part", "1 device"))
    for name, k, t, r in rows:
        its = max(1, len(r.history) - 1)
        split = r.state.startswith("partitioned")
        report.add(case=case, variant=name, timing=t, items=n, devices=k, state=r.state,
                   x_one_part=one[2].median / t.median,
                   efficiency=(one[2].median / (k * t.median)) if split else "",
                   bytes_per_iteration=(r.transfers.get("reduced_bytes", 0) / its) if split else "",
                   final_cost=r.final_cost, cost_vs_one_part=abs(r.final_cost - one[3].final_cost) / one[3].final_cost,
                   iterations=len(r.history) - 1, cg_steps=sum(h.linear_solver_iterations for h in r.history),
                   setup_s=r.history[0].cumulative_time, call_s=r.call_s)
    report.write(["case", "variant", "devices", "median_s", "spread", "x_one_part", "efficiency",
                  "bytes_per_iteration", "iterations", "cg_steps", "setup_s", "call_s", "final_cost", "cost_vs_one_part", "state"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
