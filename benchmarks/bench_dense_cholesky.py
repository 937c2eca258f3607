"""The device's dense Cholesky (solvers.linalg.dense_cholesky_device), as sparse_schur uses it: factorisation and
solve of one symmetric positive definite float64 matrix already on the device.

Per size and variant (``defer``: block columns over which the trailing update is deferred, 1 =
after every panel; ``RT``: update entries per work-item and dimension): the wall clock of
``factor(); solve(x); queue.finish()`` (median after warm-up, the variants taken in turns), the
kernels' event span and each kernel's summed event time (``kernel_sums``), the factorisation's
rate (n^3 / 3 multiply-adds, 2 flops each) and the relative residual ``|S x - b| / |b|`` checked
on the host. ``--mixed``: also the mixed-precision solve (solvers.linalg.mixed_cholesky_device:
the float32 factorisation, refined in float64; ``--rt32``: its update's RT values), with its
refinement steps; ``--super-rows``: rows of the triangular solves' super-blocks;
``--panel-width``: the panel's work-items per row; ``--small-solve-max``: the size up to which
both solves run in one work-group; ``--nb32``: the float32 factorisation's
block sizes. The matrix
is diagonally dominant (random symmetric entries in [-0.5, 0.5] plus n on
the diagonal), so it is positive definite.

    PYCLAD_DEVICE=nvidia python benchmarks/bench_dense_cholesky.py              # 657, 4,096, 16,002
    python benchmarks/bench_dense_cholesky.py --sizes 657,2000 --defer 1,4
"""
import time

import numpy as np
import pyopencl.array as cla

import harness

from solvers.linalg.dense_cholesky_device import (DenseCholesky, block_sizes, device_panel_width, local_bytes,
                                                  super_rows_for)
from solvers.linalg.mixed_cholesky_device import MixedCholesky


def spd(n, seed=0):
    rng = np.random.default_rng(seed)
    S = rng.uniform(-0.5, 0.5, (n, n))
    S = np.tril(S) + np.tril(S, -1).T
    S[np.arange(n), np.arange(n)] += n
    return S


def main():
    p = harness.parser(__doc__)
    p.add_argument("--sizes", default="657,4096,16002", help="comma-separated matrix sizes")
    p.add_argument("--defer", default="1,2,4,8", help="comma-separated deferrals to compare")
    p.add_argument("--rt", default="", help="comma-separated RT values (default: the device's)")
    p.add_argument("--mixed", action="store_true", help="also the mixed-precision solve")
    p.add_argument("--small-solve-max", default="", help="comma-separated sizes up to which both solves run "
                   "in one work-group, to compare (default: the module's)")
    p.add_argument("--panel-width", default="", help="comma-separated panel work-items per row to compare "
                   "(default: the module's)")
    p.add_argument("--super-rows", default="", help="comma-separated rows of the solves' super-blocks to "
                   "compare (multiples of the block size; default: the module's; the solves above the "
                   "one-group size)")
    p.add_argument("--rt32", default="", help="its float32 update's RT values (default: the device's)")
    p.add_argument("--nb32", default="", help="its float32 block sizes (default: the float64 one's)")
    p.set_defaults(repeat=5)
    args = p.parse_args()
    report = harness.Report("bench_dense_cholesky", args)
    rt = report.runtime
    q = rt.queue
    nb, rt0 = block_sizes(rt.info)
    rts = [int(v) for v in args.rt.split(",") if v] or [rt0]
    defers = [int(v) for v in args.defer.split(",") if v]
    sbs = [int(v) for v in args.super_rows.split(",") if v] or [super_rows_for(nb)]
    ssms = [int(v) for v in args.small_solve_max.split(",") if v] or [None]
    pws = [int(v) for v in args.panel_width.split(",") if v] or [device_panel_width(rt.info, nb)]
    for n in (int(v) for v in args.sizes.split(",") if v):
        S = spd(n, n)
        b = np.random.default_rng(1).standard_normal(n)
        variants = {}
        for r in rts:
            if nb % r or (nb // r) ** 2 > rt.info.max_work_group_size:
                continue
            for d in defers:
                for sb in sbs:
                    for pw in pws:
                        for ssm in ssms:
                            name = (f"defer {d}, RT {r}" + (f", super-blocks of {sb}" if args.super_rows else "")
                                    + (f", PW {pw}" if args.panel_width else "")
                                    + (f", one-group solves to {ssm}" if args.small_solve_max else ""))
                            variants[name] = DenseCholesky(rt, n, block=(nb, r), defer=d, super_rows=sb,
                                                           panel_width=pw, **({} if ssm is None else
                                                                              dict(small_solve_max=ssm)))
        if args.mixed and not (args.nb32 or args.rt32):      # the module's float32 blocks
            for d in defers:
                variants[f"mixed, defer {d}"] = MixedCholesky(rt, n, defer=d)
        elif args.mixed:
            for nb32 in [int(v) for v in args.nb32.split(",") if v] or [nb]:
                if local_bytes(nb32, 4) > rt.info.local_mem_bytes:
                    continue
                for r in [int(v) for v in args.rt32.split(",") if v] or [rt0]:
                    if nb32 % r or (nb32 // r) ** 2 > rt.info.max_work_group_size:
                        continue
                    for d in defers:
                        name = f"mixed, defer {d}, RT32 {r}" + (f", NB32 {nb32}" if args.nb32 else "")
                        variants[name] = MixedCholesky(rt, n, block32=(nb32, r), defer=d)
        x = cla.empty(q, n, np.float64)
        residual = {}
        saved = {}
        for key, chol in variants.items():   # upload once; factor() overwrites A, so keep a copy
            chol.write_host(S, b)
            saved[key] = (chol.A.copy(), chol.b.copy())
            chol.factor()
            chol.solve(x)
            xs = x.get()
            residual[key] = float(np.linalg.norm(S @ xs - b) / np.linalg.norm(b))
            if chol.failed():
                raise SystemExit(f"{key}: the factorisation failed on a positive definite matrix")

        def run(key, events=False):
            chol = variants[key]
            chol.A[:], chol.b[:] = saved[key]        # S and b again (device copies, not timed)
            q.finish()
            chol.events = [] if events else None
            t0 = time.perf_counter()
            chol.factor()
            chol.solve(x)
            q.finish()
            wall = time.perf_counter() - t0
            ev = chol.events
            chol.events = None
            return wall, ev

        # The mixed solves' refinement steps ("f64" where the float64 factorisation took over).
        steps = {k: ("f64" if c.fell_back else c.steps) if isinstance(c, MixedCholesky) else None
                 for k, c in variants.items()}
        walls = {k: [] for k in variants}
        spans, per_kernel, launches = {}, {}, {}
        for key in variants:
            run(key)
            _, ev = run(key, events=True)
            spans[key] = (max(e.profile.end for _, e in ev) - min(e.profile.start for _, e in ev)) * 1e-9
            sums = {}
            for name, e in ev:
                sums[name] = sums.get(name, 0.0) + (e.profile.end - e.profile.start) * 1e-9
            per_kernel[key] = "; ".join(f"{k} {v * 1e3:.2f} ms" for k, v in sorted(sums.items()))
            launches[key] = len(ev)
        for _ in range(args.repeat):
            for key in variants:
                walls[key].append(run(key)[0])
        base = float(np.median(walls[next(iter(variants))]))
        for key in variants:
            t = harness.Timing(walls[key])
            report.add(case=f"n={n}", variant=key, timing=t, kernel_span_s=spans[key],
                       tflops=n ** 3 / 3 * 2 / t.median * 1e-12, x_first=base / t.median,
                       launches=launches[key], rel_residual=residual[key], refinement_steps=steps[key],
                       kernel_sums=per_kernel[key])
    report.write(["case", "variant", "median_s", "spread", "kernel_span_s", "tflops", "x_first", "launches",
                  "rel_residual", "refinement_steps", "kernel_sums"])


if __name__ == "__main__":
    main()
