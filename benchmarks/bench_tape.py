"""The tape interpreter's ladder: what each of its techniques buys, against codegen in the same run.

Residuals and Jacobians of the Snavely reprojection error over a BAL problem (default: the
shared dubrovnik-16 on CPUs, a 5M-observation synthetic one on GPUs), device arrays in and out.
Each rung adds one technique to the one above it (pyclad.TapeConfig); the first rung is the
interpreter's original design: one tuple per work-item, a cell per node in a node-major scratch
over all tuples of a launch, a sweep per output, tables in global memory.

Per rung: the call's wall clock (values_and_jacobians on device arrays, then queue.finish();
median after warm-up), the kernel's profiling-event time beside it, tuples/s, and the ratio to
codegen's call time. The rungs and codegen are timed in turns, so a noisy machine shifts all of
them alike. Every rung's results are checked against codegen (float64: to 1e-12).

    python benchmarks/bench_tape.py                       # both dtypes where the device has them
    python benchmarks/bench_tape.py --problem FILE.bz2 --dtype float64
    python benchmarks/bench_tape.py --synthetic 5000000
    PYCLAD_DEVICE=nvidia python benchmarks/bench_tape.py --sweep   # GPU: layouts x work-group x grid x blocks
"""
import os
import sys
import time

import numpy as np
import pyopencl.array as cla

import harness
import ceres_peer
from bench_jacobian import synthetic

import pyclad as pc  # noqa: E402
from clkernels import arrays  # noqa: E402
from solvers.bal import read_bal  # noqa: E402
from solvers.models.snavely import snavely_residual  # noqa: E402


def ladder(info, n, dtype):
    """(name, TapeConfig) rungs for a device: each adds one technique to the previous."""
    C = pc.TapeConfig
    original = dict(lanes=1, blocks=1, slots=False, fuse=False, library=False, preload=False, layout="node", sweep="each", tables="global",
                    wg=64, work_items=arrays.round_up(n, 64))
    rungs = [("original design", C(**original))]
    if info.is_cpu:
        width = info.native_vector_width_double if dtype == np.float64 else info.native_vector_width_float
        width = min(8, width)
        r = {**original, "work_items": 64 * info.compute_units, "wg": 1, "layout": "item"}
        steps = [("+ persistent grid, scratch per work-item", {}),
                 (f"+ vectors of {width} tuples", {"lanes": width}),
                 ("+ 4 vectors per work-item", {"blocks": 4}),
                 ("+ 16 vectors per work-item", {"blocks": 16}),
                 ("+ slots by liveness, first contributions assign", {"slots": True}),
                 ("+ superinstructions (a product fused into its sum)", {"fuse": True}),
                 ("+ library superinstructions (the rotation as one instruction)", {"library": True}),
                 ("+ inputs loaded before the sweep (no instruction per input)", {"preload": True}),
                 ("+ joint reverse sweep", {"sweep": "joint"}),
                 ("8 vectors per work-item, a sweep per output", {"sweep": "each", "blocks": 8})]
    else:
        r = dict(original)
        # Ordered as measured on the H200: each rung keeps what helped there; the joint sweep
        # (1.7x slower there) is a rung of its own at the end.
        steps = [("+ slots by liveness, first contributions assign", {"slots": True}),
                 ("+ superinstructions (a product fused into its sum)", {"fuse": True}),
                 ("+ tables in constant memory", {"tables": "constant"}),
                 ("+ persistent grid (1,024 work-items per CU)", {"wg": 128, "work_items": 1024 * info.compute_units}),
                 ("+ library superinstructions (the rotation as one instruction)", {"library": True}),
                 ("+ inputs loaded before the sweep (no instruction per input)", {"preload": True}),
                 ("local-memory slots (groups of 64)", {"layout": "local", "wg": 64}),
                 ("joint reverse sweep (local memory)", {"sweep": "joint"})]
    for name, change in steps:   # each rung: the one above with one more change
        r = {**r, **change}
        rungs.append((name, C(**r)))
    rungs.append(("default (pyclad.TapeConfig())", None))
    return rungs


def sweep(info, n, dtype):
    """(name, TapeConfig) for the GPU tuning sweep: slot layout, sweep, work-group size, grid
    (work-items per compute unit, or one per tuple) and tuples per work-item; the variants a
    device's local memory cannot hold are left out when they are built."""
    C, cu = pc.TapeConfig, info.compute_units
    out = []
    for layout, sweeps, wgs in (("node", ("each",), (64, 128, 256)), ("local", ("each", "joint"), (32, 64, 128))):
        for sw in sweeps:
            for wg in wgs:
                for per_cu in (None, 2048, 1024, 512):
                    for blocks in (1, 2):
                        items = arrays.round_up(-(-n // blocks), wg) if per_cu is None else per_cu * cu
                        name = (f"{layout}, {sw}, wg {wg}, {'one per tuple' if per_cu is None else f'{per_cu}/CU'}, "
                                f"{blocks} per item")
                        out.append((name, C(lanes=1, blocks=blocks, slots=True, fuse=True, layout=layout, sweep=sw,
                                            tables="constant", wg=wg, work_items=items)))
    out.append(("default (pyclad.TapeConfig())", None))
    return out


def main():
    p = harness.parser(__doc__)
    p.add_argument("--problem", default=None, help="a BAL file (default: dubrovnik-16 on CPUs)")
    p.add_argument("--synthetic", type=int, default=None, help="observations of a synthetic problem "
                   "(default on GPUs: 5,000,000)")
    p.add_argument("--dtype", choices=["float64", "float32"], nargs="*", default=None)
    p.add_argument("--sweep", action="store_true", help="time the GPU tuning grid instead of the ladder")
    p.add_argument("--default-only", action="store_true", help="time only the default variant against codegen")
    args = p.parse_args()
    report = harness.Report("bench_tape", args)
    rt = report.runtime
    q = rt.queue
    if args.synthetic or (not rt.info.is_cpu and not args.problem):
        problem = synthetic(args.synthetic or (200_000 if args.quick else 5_000_000))
    else:
        path = args.problem or next(f for f in ceres_peer.bal_files() if "problem-16-" in f)
        problem = read_bal(path)
    n = problem.num_observations
    print(f"{problem.name}: {n} observations", flush=True)
    index = np.stack([problem.camera_index, problem.point_index], axis=1).astype(np.int32)
    dtypes = args.dtype or (["float64", "float32"] if rt.info.fp64 else ["float32"])
    repeat = 3 if args.quick else args.repeat
    for name in dtypes:
        dtype = np.dtype(name)
        dev = [cla.to_device(q, a.astype(dtype)) for a in (problem.cameras, problem.points)]
        dev_index, dev_obs = cla.to_device(q, index), cla.to_device(q, problem.observations.astype(dtype))
        fs = {"codegen": pc.BatchFunction(snavely_residual, params=(9, 3), data=2, dtype=dtype,
                                          backend="codegen", device=rt)}
        rungs = (sweep if args.sweep else ladder)(rt.info, n, dtype)
        for rung, config in (rungs[-1:] if args.default_only else rungs):
            fs[rung] = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, dtype=dtype, backend="tape",
                                        config=config, device=rt)
        ref = None
        events, errs = {}, {}
        for key, f in list(fs.items()):
            try:
                r, jacs = f.values_and_jacobians(dev, dev_index, data=dev_obs)
            except ValueError as e:    # a sweep's variant that the device's local memory cannot hold
                if not args.sweep:
                    raise
                print(f"  {key}: skipped ({e})", flush=True)
                del fs[key]
                continue
            got = [r.get(), *(j.get() for j in jacs)]
            ref = ref or got
            errs[key] = max(harness.rel_err(a, b) for a, b in zip(got, ref))
            events[key] = harness.time_events(lambda: list(f.values_and_jacobians(dev, dev_index, data=dev_obs)[0].events),
                                              warmup=1, repeat=max(3, repeat // 2))
        walls = {k: [] for k in fs}
        for _ in range(args.warmup):
            for f in fs.values():
                f.values_and_jacobians(dev, dev_index, data=dev_obs)
            q.finish()
        for _ in range(repeat):        # in turns: noise shifts every rung alike
            for key, f in fs.items():
                t0 = time.perf_counter()
                f.values_and_jacobians(dev, dev_index, data=dev_obs)
                q.finish()
                walls[key].append(time.perf_counter() - t0)
        base = np.array(walls["codegen"])
        for key in fs:
            t = harness.Timing(walls[key])
            config = fs[key]._impl.config_for(rt) if key != "codegen" else None
            report.add(case=f"{problem.name} {name}", variant=key if key == "codegen" else f"tape: {key}",
                             timing=t, items=n, kernel_ms=events[key].median * 1e3,
                             x_codegen=float(np.median(base / np.array(walls[key]))), max_rel_err=errs[key],
                             config="" if config is None else
                             f"lanes {config.lanes}, blocks {config.blocks}, slots {config.slots}, "
                             f"{config.layout}, {config.sweep}, {config.tables}, wg {config.wg}, "
                             f"items {config.work_items}")
            if name == "float64" and errs[key] > 1e-12:
                print(f"  !! {key}: results differ from codegen by {errs[key]:.2e}", flush=True)
    report.write(["case", "variant", "median_s", "spread", "items_per_s", "kernel_ms", "x_codegen",
                  "max_rel_err", "config"])


if __name__ == "__main__":
    sys.exit(main())
