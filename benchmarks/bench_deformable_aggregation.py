"""Sparse4D deformable aggregation: forward and backward, float32 and float16 storage, at the
Sparse4Dv3 inference shapes (bs 1, 900 anchors) and training shapes (bs 6, 1220 anchors): 13
points, 6 cameras, 4 scales (64x176, 32x88, 16x44, 8x22), 8 groups, 256 channels, locations
uniform in [-0.1, 1.1]. The original one-work-item-per-(sample, channel) atomic design runs in
the same process as the peer; on GPUs a few other kernel configurations are timed too.

Columns: ``ms`` median time of all the operation's kernels (OpenCL events; zero-fills, index
building and half conversions included); ``GB_per_s`` effective bandwidth: the bytes the
original formulation requests (every bilinear corner of every sample inside the maps, each
feature-gradient add as a float read and write, locations, weights, outputs, gradients) per
second, the same byte count for every variant of a case; ``unique_GB_per_s``: each tensor
read or written once (the DRAM minimum) per second; ``pct_ceiling`` and ``unique_pct``: those
as a percentage of the H200's 4.26 TB/s copy bandwidth (GPU runs); ``speedup`` over the
original design in the same run; ``cuda_ms``: Sparse4D's CUDA operator, built and timed in
the same run (CUDA events around its call), and ``vs_cuda`` that time over ours (float32, GPU
runs). Before timing, each case checks the optimized result against the original design and
a float64 numpy reference on a few anchors (``check``: largest difference relative to the
largest value).

Section ``as-called`` (float32, the CUDA op's only type): forward and backward as a caller
sees them. Ours: ``clkernels.deformable_aggregation`` / ``deformable_aggregation_backward``
on pyopencl arrays, the two small index tables as numpy arrays as its docstring asks (they are
read on the host; ``ours_device_tables_ms``: the same call with them as device arrays too,
read back on every call); the official: Sparse4D's own
``DeformableAggregationFunction`` (forward via ``apply``; backward = its ``backward``, which
zero-allocates the three gradients and launches the kernel) on the same values as torch CUDA
tensors. ``*_as_called_ms``: wall clock around one call and ``queue.finish()`` /
``torch.cuda.synchronize()``, median; ``*_pipelined_ms``: calls back to back, one sync,
divided; ``ours_kernel_ms`` (OpenCL events) and ``official_events_ms`` (CUDA events). Ratios
are official over ours (> 1: ours faster): ``as_called_ratio``, ``kernel_ratio``,
``events_vs_ours_as_called``, ``pipelined_ratio``; ``max_rel_diff`` compares the outputs (the
largest over the three gradients in the backward). Runs per figure: up to --calls /
--pipeline, fewer where one call is slow (--budget-s per figure).

The CUDA operator is built from sources staged by ``benchmarks/peers/stage_cuda_peers.sh``
into ``.peers/cuda`` (see ``benchmarks/cuda_peers.py``), only where torch sees a CUDA device
and the OpenCL device is a GPU; elsewhere its columns stay empty and the report says why.

  python benchmarks/bench_deformable_aggregation.py            # full shapes
  python benchmarks/bench_deformable_aggregation.py --quick    # 1/9 of the anchors, for CPUs
  python benchmarks/bench_deformable_aggregation.py --as-called   # that section only
"""
import importlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import clkernels  # noqa: E402
import cuda_peers  # noqa: E402
from clkernels import arrays  # noqa: E402

da = importlib.import_module("clkernels.deformable_aggregation")  # the module; clkernels.<name> is the function

MAPS = ((64, 176), (32, 88), (16, 44), (8, 22))
CAMS, POINTS, GROUPS, CHANNELS = 6, 13, 8, 256
CEILING_GBPS = harness.H200_COPY_BYTES_PER_S / 1e9
SECTIONS = ("kernels", "as-called")
TOLERANCE = {"forward": 1e-5, "backward": 1e-4}  # ours vs the CUDA op, float32, relative to its max
GPU_SWEEP = {  # besides the default configuration
    "forward": [da.AggregationConfig(cpt=2, vec=2), da.AggregationConfig(cpt=8, vec=4), da.AggregationConfig(cpt=4, vec=4, split=2),
                da.AggregationConfig(cpt=2, vec=1, interleave=True)],
    "backward": [da.AggregationConfig(cpt=2, vec=1, interleave=True), da.AggregationConfig(cpt=8, vec=1, interleave=True),
                 da.AggregationConfig(cpt=4, vec=4),
                 da.AggregationConfig(cpt=4, vec=4, feature_grad="gather", index_size=64),
                 da.AggregationConfig(cpt=2, vec=1, interleave=True, feature_grad="gather", index_size=128, groups_per_item=2)],
}
CPU_SWEEP = {"forward": [], "backward": [da.AggregationConfig(cpt=32, vec=8, local_size=64, feature_grad="scatter")]}


def make_problem(rng, bs, anchors, dtype):
    sizes = [h * w for h, w in MAPS]
    feat = rng.standard_normal((bs, CAMS * sum(sizes), CHANNELS), dtype=np.float32).astype(dtype)
    shape = np.array([MAPS] * CAMS, np.int32)
    start = (np.arange(CAMS)[:, None] * sum(sizes) + np.cumsum([0] + sizes[:-1])[None, :]).astype(np.int32)
    loc = rng.uniform(-0.1, 1.1, (bs, anchors, POINTS, CAMS, 2)).astype(np.float32)
    weights = rng.random((bs, anchors, POINTS, CAMS, len(MAPS), GROUPS), dtype=np.float32).astype(dtype)
    return feat, shape, start, loc, weights


def corner_count(loc, shape):
    """Bilinear corners inside the maps over all samples inside (0, 1): the gathered rows."""
    x, y = loc[..., 0].astype(np.float64), loc[..., 1].astype(np.float64)
    inside = (x > 0) & (x < 1) & (y > 0) & (y < 1)
    total = 0
    for H, W in shape[0]:
        h0, w0 = np.floor(y * H - 0.5), np.floor(x * W - 0.5)
        rows = (h0 >= 0).astype(int) + (h0 + 1 <= H - 1)
        cols = (w0 >= 0).astype(int) + (w0 + 1 <= W - 1)
        total += int((rows * cols)[inside].sum())
    return total


def reference_anchors(feat, shape, start, loc, weights, b, anchors):
    """float64 numpy reference for a few anchors of batch b, vectorised over points x cams."""
    feat = feat[b].astype(np.float64)
    C, G = feat.shape[1], weights.shape[-1]
    out = np.zeros((len(anchors), C))
    for i, a in enumerate(anchors):
        for k in range(loc.shape[3]):
            x, y = loc[b, a, :, k, 0].astype(np.float64), loc[b, a, :, k, 1].astype(np.float64)
            ok = (x > 0) & (x < 1) & (y > 0) & (y < 1)
            for s, (H, W) in enumerate(shape[k]):
                h, w = y[ok] * H - 0.5, x[ok] * W - 0.5
                h0, w0 = np.floor(h).astype(int), np.floor(w).astype(int)
                lh, lw = h - h0, w - w0
                wgt = np.repeat(weights[b, a, ok, k, s].astype(np.float64), C // G, axis=1)
                for dy, dx, c in ((0, 0, (1 - lh) * (1 - lw)), (0, 1, (1 - lh) * lw),
                                  (1, 0, lh * (1 - lw)), (1, 1, lh * lw)):
                    yy, xx = h0 + dy, w0 + dx
                    good = (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
                    rows = start[k, s] + yy[good] * W + xx[good]
                    out[i] += ((c[good, None] * wgt[good]) * feat[rows]).sum(axis=0)
    return out


def official_calls(official, host, go_host):
    """The CUDA op's forward and backward on torch copies of the case's float32 tensors."""
    t = [cuda_peers.to_cuda(a) for a in host]
    go = cuda_peers.to_cuda(go_host)
    return {"forward": lambda: official.forward(*t), "backward": lambda: official.backward(go, *t)}


def one_call_s(fn, sync) -> float:
    """One call's wall time after one warm-up call: sizes the figures' run counts."""
    fn()
    sync()
    return cuda_peers.median(cuda_peers.wall_as_called(fn, sync, warmup=0, repeat=1))


def as_called(report, rt, args, label, host, dev, go_host, go, prob, calls, failures):
    """Ours and the CUDA op, forward and backward, as called from Python (float32)."""
    feat, shape, start, loc, weights = host
    feat_d, shape_d, start_d, loc_d, w_d = dev
    rt.queue.finish()           # the arrays were made on the profiling queue
    user = rt.unprofiled()      # the library's default runtime: what a caller's call runs on
    finish = user.queue.finish
    # as its docstring asks: tensors on the device, the two index tables as numpy
    ours = {"forward": lambda: clkernels.deformable_aggregation(feat_d, shape, start, loc_d, w_d, device=user),
            "backward": lambda: clkernels.deformable_aggregation_backward(go, feat_d, shape, start, loc_d, w_d,
                                                                          device=user)}
    # everything on the device, tables too (read back on every call)
    device_tables = {
        "forward": lambda: clkernels.deformable_aggregation(feat_d, shape_d, start_d, loc_d, w_d, device=user),
        "backward": lambda: clkernels.deformable_aggregation_backward(go, feat_d, shape_d, start_d, loc_d, w_d,
                                                                      device=user)}
    launch = {"forward": lambda: da.enqueue_forward(rt, *prob, "optimized")[1],
              "backward": lambda: da.enqueue_backward(rt, go, *prob, "optimized")[1]}
    for direction in ("forward", "backward"):
        fn = ours[direction]
        n = cuda_peers.budgeted(args.calls, one_call_s(fn, finish), args.budget_s, 5)
        k = cuda_peers.budgeted(args.pipeline, one_call_s(fn, finish), args.budget_s / args.pipeline_repeat, 3)
        mine = harness.Timing(cuda_peers.wall_as_called(fn, finish, 1, n))
        tables = harness.Timing(cuda_peers.wall_as_called(device_tables[direction], finish, 1, n))
        pipe = harness.Timing(cuda_peers.wall_pipelined(fn, finish, k, 1, args.pipeline_repeat))
        kern = harness.time_events(launch[direction], warmup=1, repeat=min(args.repeat, n))
        row = dict(section="as called", case=label, variant=direction, timing=mine,
                   ours_as_called_ms=mine.median * 1e3, ours_device_tables_ms=tables.median * 1e3,
                   ours_pipelined_ms=pipe.median * 1e3, ours_kernel_ms=kern.median * 1e3, calls=n, pipelined=k)
        if calls is not None:
            theirs = calls[direction]
            mine_out, their_out = fn(), theirs()
            if direction == "forward":
                mine_out, their_out = (mine_out,), (their_out,)
            err = max(harness.rel_err(a.get(), b.cpu().numpy()) for a, b in zip(mine_out, their_out))
            del mine_out, their_out
            one = one_call_s(theirs, cuda_peers._sync)
            n = cuda_peers.budgeted(args.calls, one, args.budget_s, 5)
            k = cuda_peers.budgeted(args.pipeline, one, args.budget_s / args.pipeline_repeat, 3)
            ev = cuda_peers.median(cuda_peers.time_events(theirs, 1, min(args.repeat, n)))
            ac = cuda_peers.median(cuda_peers.time_as_called(theirs, 1, n))
            pp = cuda_peers.median(cuda_peers.time_pipelined(theirs, k, 1, args.pipeline_repeat))
            row.update(official_as_called_ms=ac * 1e3, official_pipelined_ms=pp * 1e3, official_events_ms=ev * 1e3,
                       as_called_ratio=ac / mine.median, kernel_ratio=ev / kern.median,
                       events_vs_ours_as_called=ev / mine.median, pipelined_ratio=pp / pipe.median,
                       max_rel_diff=err, official_calls=n, official_pipelined=k)
            if not err < TOLERANCE[direction]:
                failures.append(f"as called {label} {direction}: ours vs the CUDA op {err:.2e}")
        report.add(**row)


AS_CALLED_COLUMNS = ["case", "variant", "ours_as_called_ms", "ours_device_tables_ms", "ours_pipelined_ms",
                     "ours_kernel_ms", "official_as_called_ms", "official_pipelined_ms", "official_events_ms",
                     "as_called_ratio", "kernel_ratio", "events_vs_ours_as_called", "pipelined_ratio",
                     "max_rel_diff", "calls", "official_calls", "spread"]


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--cases", default="inference,training", help="inference, training or both")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, of {', '.join(SECTIONS)} (default: both)")
    parser.add_argument("--as-called", action="store_true", help="only the as-called section")
    parser.add_argument("--calls", type=int, default=50, help="as-called: timed calls at most (median)")
    parser.add_argument("--pipeline", type=int, default=50, help="as-called: calls back to back per sample, at most")
    parser.add_argument("--pipeline-repeat", type=int, default=5, help="as-called: pipelined samples")
    parser.add_argument("--budget-s", type=float, default=3.0, help="as-called: seconds per figure, about")
    parser.add_argument("--peer-root", default=cuda_peers.DEFAULT_ROOT, help="staged official CUDA sources")
    parser.add_argument("--no-cuda-peer", action="store_true", help="do not build the CUDA operator")
    args = parser.parse_args()
    sections = ["as-called"] if args.as_called else [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.quick:
        args.calls, args.pipeline, args.pipeline_repeat = min(args.calls, 10), min(args.pipeline, 10), 3
    name = ("bench_deformable_aggregation" if set(sections) == set(SECTIONS)
            else "bench_deformable_aggregation-" + "-".join(sections))
    report = harness.Report(name, args, maps=str(MAPS), cams=CAMS, points=POINTS,
                            groups=GROUPS, channels=CHANNELS, locations="uniform [-0.1, 1.1]",
                            sections=",".join(sections))
    rt = report.runtime
    gpu = not (rt.info.is_cpu or rt.info.is_simulator)
    pending = cuda_peers.load_in_background("deformable_aggregation", gpu, args.peer_root, args.no_cuda_peer)
    official, official_events = False, {}  # False: not joined yet
    cases = [("inference", 1, 900), ("training", 6, 1220)]
    if args.quick:
        cases = [("inference/9", 1, 100), ("training/9", 6, 136)]
    cases = [c for c in cases if c[0].split("/")[0] in args.cases.split(",")]
    rng = np.random.default_rng(0)
    failures = []
    for case, bs, anchors in cases:
        for dtype in (np.float32, np.float16):
            if "kernels" not in sections and dtype != np.float32:
                continue
            host = make_problem(rng, bs, anchors, dtype)
            feat, shape, start, loc, weights = host
            dev = [arrays.to_device(rt, a) for a in host]
            # the op's arguments as its docstring asks: tensors on the device, the two small
            # index tables as numpy (they are read on the host)
            prob = (dev[0], shape, start, dev[3], dev[4])
            go_host = rng.standard_normal((bs, anchors, CHANNELS), dtype=np.float32).astype(dtype)
            go = arrays.to_device(rt, go_host)
            label = f"{case} {np.dtype(dtype).name}"
            if official is False:  # the build ran while the first problem was made
                official, reason = pending.result()
                report.meta["official_cuda"] = (cuda_peers.describe(official) if official
                                                else f"unavailable: {reason}")
            calls = official_calls(official, host, go_host) if official and dtype == np.float32 else None
            if "kernels" in sections:
                if calls is not None and gpu:
                    for direction, fn in calls.items():
                        official_events[direction] = cuda_peers.median(
                            cuda_peers.time_events(fn, warmup=args.warmup, repeat=args.repeat))
                kernels(report, rt, args, gpu, label, host, prob, go,
                        official_events if calls is not None and gpu else {})
            if "as-called" in sections and dtype == np.float32:
                as_called(report, rt, args, label, host, dev, go_host, go, prob, calls, failures)
            del dev, prob, go, calls
    report.write(["case", "variant", "ms", "GB_per_s", "pct_ceiling", "unique_GB_per_s", "unique_pct",
                  "speedup", "cuda_ms", "vs_cuda", "check"], sections={"as called": AS_CALLED_COLUMNS})
    if failures:
        print("CHECK FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)


def kernels(report, rt, args, gpu, label, host, prob, go, cuda_s):
    """The original design, the default and the sweep's configurations by OpenCL events;
    ``cuda_s``: the CUDA op's event time per direction (float32 GPU runs), else empty."""
    feat, shape, start, loc, weights = host
    bs, anchors = loc.shape[:2]
    dtype = feat.dtype
    e, corners = np.dtype(dtype).itemsize, corner_count(loc, shape)
    small = loc.nbytes + weights.nbytes
    out_bytes = bs * anchors * CHANNELS * e
    fwd_bytes = corners * CHANNELS * e + small + out_bytes
    # backward: the corner reads, a float read and write per feature-gradient add, its
    # zero-fill, grad_out per (anchor, point, camera), locations and weights in, their
    # gradients out
    bwd_bytes = (corners * CHANNELS * (e + 8) + feat.size * 4 + loc[..., 0].size * CHANNELS * e
                 + 2 * small)
    fwd_unique = feat.nbytes + small + out_bytes
    bwd_unique = 2 * feat.nbytes + out_bytes + 2 * small

    # correctness first: optimized against the original and a float64 reference
    out, _ = da.enqueue_forward(rt, *prob, "optimized")
    ref_out, _ = da.enqueue_forward(rt, *prob, "original")
    out, ref_out = out.get(), ref_out.get()
    pick = [0, anchors // 2, anchors - 1]
    check = harness.rel_err(out[0, pick], reference_anchors(feat, shape, start, loc, weights, 0, pick))
    grads, _ = da.enqueue_backward(rt, go, *prob, "optimized")
    ref_grads, _ = da.enqueue_backward(rt, go, *prob, "original")
    bwd_diff = max(harness.rel_err(g.get(), r.get()) for g, r in zip(grads, ref_grads))
    print(f"  check {label}: forward vs reference {check:.2e}, vs original "
          f"{harness.rel_err(out, ref_out):.2e}; backward vs original {bwd_diff:.2e}", flush=True)
    del grads, ref_grads

    rows = {}
    for direction, nbytes, unique in (("forward", fwd_bytes, fwd_unique),
                                      ("backward", bwd_bytes, bwd_unique)):
        configs = [("original", None), ("optimized", None)]
        configs += [("optimized", c) for c in (GPU_SWEEP if gpu else CPU_SWEEP)[direction]]
        for variant, cfg in configs:
            if direction == "forward":
                launch = lambda: da.enqueue_forward(rt, *prob, variant, cfg)[1]  # noqa: E731
            else:
                launch = lambda: da.enqueue_backward(rt, go, *prob, variant, cfg)[1]  # noqa: E731
            timing = harness.time_events(launch, warmup=args.warmup, repeat=args.repeat)
            used = cfg or da.default_config(rt.info, CHANNELS, GROUPS, direction)
            name = variant if variant == "original" else (
                f"{variant} cpt={used.cpt} vec={used.vec}{' interleave' if used.interleave else ''}"
                f"{f' split={used.split}' if used.split > 1 else ''}"
                f"{' ' + used.feature_grad if direction == 'backward' else ''}" + ("" if cfg else " (default)"))
            cuda = cuda_s.get(direction)
            rows[name] = report.add(
                case=label, variant=f"{direction} {name}", timing=timing, bytes_moved=nbytes,
                ms=timing.median * 1e3,
                unique_GB_per_s=unique / timing.median / 1e9,
                pct_ceiling=100 * nbytes / timing.median / 1e9 / CEILING_GBPS if gpu else "",
                unique_pct=100 * unique / timing.median / 1e9 / CEILING_GBPS if gpu else "",
                cuda_ms=cuda * 1e3 if cuda else "", vs_cuda=cuda / timing.median if cuda else "",
                speedup=(rows["original"]["median_s"] / timing.median) if "original" in rows else 1.0,
                check=check if direction == "forward" else bwd_diff)
        rows.clear()


if __name__ == "__main__":
    main()
