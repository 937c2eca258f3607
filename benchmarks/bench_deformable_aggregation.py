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
original design in the same run; ``vs_cuda``: the CUDA original's time on the H200 (forward
0.81 / backward 12.0 ms at inference, 6.0 / 96 ms at training) over ours (float32, GPU
runs). Before timing, each case checks the optimized result against the original design and
a float64 numpy reference on a few anchors (``check``: largest difference relative to the
largest value).

  python benchmarks/bench_deformable_aggregation.py            # full shapes
  python benchmarks/bench_deformable_aggregation.py --quick    # 1/9 of the anchors, for CPUs
"""
import importlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

from clkernels import arrays  # noqa: E402

da = importlib.import_module("clkernels.deformable_aggregation")  # the module; clkernels.<name> is the function

MAPS = ((64, 176), (32, 88), (16, 44), (8, 22))
CAMS, POINTS, GROUPS, CHANNELS = 6, 13, 8, 256
CEILING_GBPS = harness.H200_COPY_BYTES_PER_S / 1e9
CUDA_MS = {("inference", "forward"): 0.81, ("inference", "backward"): 12.0,  # original operator,
           ("training", "forward"): 6.0, ("training", "backward"): 96.0}     # same H200
GPU_SWEEP = {  # besides the default configuration
    "forward": [da.Config(cpt=2, vec=2), da.Config(cpt=8, vec=4), da.Config(cpt=4, vec=4, split=2),
                da.Config(cpt=2, vec=1, interleave=True)],
    "backward": [da.Config(cpt=2, vec=1, interleave=True), da.Config(cpt=8, vec=1, interleave=True),
                 da.Config(cpt=4, vec=4),
                 da.Config(cpt=4, vec=4, feature_grad="gather", index_size=64),
                 da.Config(cpt=2, vec=1, interleave=True, feature_grad="gather", index_size=128, groups_per_item=2)],
}
CPU_SWEEP = {"forward": [], "backward": [da.Config(cpt=32, vec=8, local_size=64, feature_grad="scatter")]}


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


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--cases", default="inference,training", help="inference, training or both")
    args = parser.parse_args()
    report = harness.Report("bench_deformable_aggregation", args, maps=str(MAPS), cams=CAMS, points=POINTS,
                            groups=GROUPS, channels=CHANNELS, locations="uniform [-0.1, 1.1]")
    rt = report.runtime
    gpu = not (rt.info.is_cpu or rt.info.is_simulator)
    cases = [("inference", 1, 900), ("training", 6, 1220)]
    if args.quick:
        cases = [("inference/9", 1, 100), ("training/9", 6, 136)]
    cases = [c for c in cases if c[0].split("/")[0] in args.cases.split(",")]
    rng = np.random.default_rng(0)
    for case, bs, anchors in cases:
        for dtype in (np.float32, np.float16):
            host = make_problem(rng, bs, anchors, dtype)
            feat, shape, start, loc, weights = host
            dev = [arrays.to_device(rt, a) for a in host]
            prob = da.prepare(*dev, device=rt)
            go = arrays.to_device(rt, rng.standard_normal((bs, anchors, CHANNELS), dtype=np.float32).astype(dtype))
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
            label = f"{case} {np.dtype(dtype).name}"

            # correctness first: optimized against the original and a float64 reference
            out, _ = da.enqueue_forward(prob, "optimized")
            ref_out, _ = da.enqueue_forward(prob, "original")
            out, ref_out = out.get(), ref_out.get()
            pick = [0, anchors // 2, anchors - 1]
            check = harness.rel_err(out[0, pick], reference_anchors(feat, shape, start, loc, weights, 0, pick))
            grads, _ = da.enqueue_backward(prob, go, "optimized")
            ref_grads, _ = da.enqueue_backward(prob, go, "original")
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
                        launch = lambda: da.enqueue_forward(prob, variant, cfg)[1]  # noqa: E731
                    else:
                        launch = lambda: da.enqueue_backward(prob, go, variant, cfg)[1]  # noqa: E731
                    timing = harness.time_events(launch, warmup=args.warmup, repeat=args.repeat)
                    used = cfg or da.default_config(rt.info, CHANNELS, GROUPS, direction)
                    name = variant if variant == "original" else (
                        f"{variant} cpt={used.cpt} vec={used.vec}{' interleave' if used.interleave else ''}"
                        f"{f' split={used.split}' if used.split > 1 else ''}"
                        f"{' ' + used.feature_grad if direction == 'backward' else ''}" + ("" if cfg else " (default)"))
                    rows[name] = report.add(
                        case=label, variant=f"{direction} {name}", timing=timing, bytes_moved=nbytes,
                        ms=timing.median * 1e3,
                        unique_GB_per_s=unique / timing.median / 1e9,
                        pct_ceiling=100 * nbytes / timing.median / 1e9 / CEILING_GBPS if gpu else "",
                        unique_pct=100 * unique / timing.median / 1e9 / CEILING_GBPS if gpu else "",
                        vs_cuda=(CUDA_MS[case, direction] * 1e-3 / timing.median
                                 if gpu and dtype == np.float32 and (case, direction) in CUDA_MS else ""),
                        speedup=(rows["original"]["median_s"] / timing.median) if "original" in rows else 1.0,
                        check=check if direction == "forward" else bwd_diff)
                rows.clear()
            del dev, prob, go
    report.write(["case", "variant", "ms", "GB_per_s", "pct_ceiling", "unique_GB_per_s", "unique_pct",
                  "speedup", "vs_cuda", "check"])


if __name__ == "__main__":
    main()
