"""What a Python call of each public op costs on the host, next to its kernels.

For every public op (and ``BatchFunction.values_and_jacobians``), inputs already on the
device, on a small shape and on real ones:

- ``host_us``: host cost per call, K calls back to back with no wait (wall clock of issuing
  them, over K);
- ``pipelined_us``: K calls back to back, then ``queue.finish()``, over K;
- ``latency_us``: one call, then ``queue.finish()``;
- ``kernel_us``: the call's device work by its OpenCL events (first start to last end);
- ``raw_us``: in the same process, the host cost of a raw pyopencl launch of an empty kernel
  (``knl(queue, (1,), None, buf)``), K back to back; ``over_raw_us`` = host_us - raw_us.

Target: ``over_raw_us`` at most 50 for every op. Medians over ``--repeat`` rounds (each round
first waits for the device), rounds of the ops interleaved so that load from other work on a
shared machine falls on all of them alike.

    python benchmarks/bench_call_overhead.py [--quick] [--device SPEC] [--out DIR]

--quick: the small shapes and the smaller real ones only (for CPUs).
"""
import importlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import pyopencl as cl  # noqa: E402
import pyopencl.array as cla  # noqa: E402

import clkernels  # noqa: E402
import pyclad as pc  # noqa: E402

dcn = importlib.import_module("clkernels.dcnv4")
da = importlib.import_module("clkernels.deformable_aggregation")

K = 20  # calls back to back, as a user's loop would issue them


def _events(result):
    """Every event on the arrays a call returned (the layer puts its launches' events there)."""
    arrays = result if isinstance(result, (tuple, list)) else [result]
    out = []
    for a in arrays:
        if isinstance(a, (tuple, list)):
            out += _events(a)
        elif isinstance(a, cla.Array):
            out += [e for e in a.events if e not in out]
    return out


def _span(events) -> float:
    cl.wait_for_events(events)
    return (max(e.profile.end for e in events) - min(e.profile.start for e in events)) * 1e-9


def measure(rt, call, rounds: int):
    """(host, pipelined, latency, kernel) medians in seconds for ``call()``."""
    q = rt.queue
    for _ in range(3):
        call()
    q.finish()
    host, piped, lat, kern = [], [], [], []
    for _ in range(rounds):
        q.finish()
        t0 = time.perf_counter()
        for _ in range(K):
            call()
        t1 = time.perf_counter()
        q.finish()
        t2 = time.perf_counter()
        host.append((t1 - t0) / K)
        piped.append((t2 - t0) / K)
        t0 = time.perf_counter()
        result = call()
        q.finish()
        lat.append(time.perf_counter() - t0)
        events = _events(result)
        if events:
            kern.append(_span(events))
    med = lambda v: float(np.median(v)) if v else float("nan")  # noqa: E731
    return med(host), med(piped), med(lat), med(kern)


def raw_launch(rt):
    buf = cla.empty(rt.queue, (1024,), np.float32)
    knl = cl.Kernel(cl.Program(rt.context, "__kernel void empty(__global float *a) {}").build(), "empty")
    return lambda: knl(rt.queue, (1,), None, buf.data)


# ---------------------------------------------------------------- the ops and their shapes

def dcnv4_cases(rt, quick):
    shapes = [("small", 1, 8, 8, 16)] + ([("real", 1, 200, 320, 16)] if quick else
                                         [("real", 64, 56, 56, 32), ("real", 64, 28, 28, 64), ("real", 1, 200, 320, 16)])
    rng = np.random.default_rng(0)
    for size, n, h, w, c in shapes:
        p = dcn.offset_mask_channels(4)
        x = cla.to_device(rt.queue, rng.standard_normal((n, h, w, 4 * c), dtype=np.float32))
        om = cla.to_device(rt.queue, rng.uniform(-1, 1, (n, h, w, p)).astype(np.float32))
        go = cla.to_device(rt.queue, rng.standard_normal((n, h, w, 4 * c), dtype=np.float32))
        case = f"{size} N={n} {h}x{w} G=4 C={c}"
        yield "dcnv4", case, lambda x=x, om=om, c=c: clkernels.dcnv4(x, om, group=4, group_channels=c)
        yield "dcnv4_backward", case, \
            lambda x=x, om=om, go=go, c=c: clkernels.dcnv4_backward(go, x, om, group=4, group_channels=c)


def da_problem(rt, bs, anchors, maps, cams=6, points=13, groups=8, channels=256):
    rng = np.random.default_rng(1)
    levels = [cla.to_device(rt.queue, rng.standard_normal((bs, cams, channels, h, w), dtype=np.float32))
              for h, w in maps]
    feat, shape, start = clkernels.feature_maps_format(levels)
    loc = cla.to_device(rt.queue, rng.uniform(-0.1, 1.1, (bs, anchors, points, cams, 2)).astype(np.float32))
    weights = cla.to_device(rt.queue, rng.random((bs, anchors, points, cams, len(maps), groups), dtype=np.float32))
    go = cla.to_device(rt.queue, rng.standard_normal((bs, anchors, channels), dtype=np.float32))
    return levels, feat, shape, start, loc, weights, go


def da_cases(rt, quick):
    sizes = [("small", 1, 8, ((8, 22), (4, 11)), 2, 16)]
    sizes.append(("real bs 1", 1, 900, ((64, 176), (32, 88), (16, 44), (8, 22)), 6, 256))
    for size, bs, anchors, maps, cams, channels in sizes:
        levels, feat, shape, start, loc, w, go = da_problem(rt, bs, anchors, maps, cams=cams, channels=channels)
        case = f"{size}: {anchors} anchors, {cams} cams, C={channels}"
        args = (feat, shape, start, loc, w)   # bound now: the calls run after the loop
        yield "deformable_aggregation", case, lambda a=args: clkernels.deformable_aggregation(*a)
        yield "deformable_aggregation_backward", case, \
            lambda a=args, go=go: clkernels.deformable_aggregation_backward(go, *a)
        yield "feature_maps_format", case, lambda levels=levels: clkernels.feature_maps_format(levels)[0]


def warp_cases(rt, quick):
    rng = np.random.default_rng(2)
    M = np.array([[0.5, 0.1, 3.0], [-0.1, 0.5, 2.0]])
    for size, (h, w) in (("small", (48, 64)), ("real 1080p", (1080, 1920))):
        img = cla.to_device(rt.queue, rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        yield "letterbox", f"{size} -> 640x640", lambda img=img: clkernels.letterbox(img)[0]
        yield "warp_affine", f"{size} -> {w // 2}x{h // 2}", \
            lambda img=img, w=w, h=h: clkernels.warp_affine(img, M, (w // 2, h // 2))


def batch_cases(rt, quick):
    from solvers.models.snavely import snavely_residual
    dtype = np.float64 if rt.info.fp64 else np.float32
    f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, dtype=dtype, device=rt)
    rng = np.random.default_rng(3)
    for size, n_obs in (("small", 1000), ("real", 200_000 if quick else 1_000_000)):
        nc, npt = 50, n_obs // 4
        cams = np.zeros((nc, 9), dtype)
        cams[:, 6] = 500.0
        cams[:, 5] = -10.0
        pts = rng.standard_normal((npt, 3)).astype(dtype)
        index = np.stack([rng.integers(0, nc, n_obs), rng.integers(0, npt, n_obs)], 1).astype(np.int32)
        obs = rng.standard_normal((n_obs, 2)).astype(dtype)
        params = [cla.to_device(rt.queue, cams), cla.to_device(rt.queue, pts)]
        d_index, d_obs = cla.to_device(rt.queue, index), cla.to_device(rt.queue, obs)
        f.values_and_jacobians(params, d_index, d_obs)   # checks the index once
        case = f"{size}: {n_obs} Snavely residuals"
        args = (params, d_index, d_obs)       # bound now: the calls run after the loop
        yield "BatchFunction.values_and_jacobians (index_checked)", case, \
            lambda a=args: f.values_and_jacobians(*a, index_checked=True)
        yield "BatchFunction.values_and_jacobians (index checked per call)", case, \
            lambda a=args: f.values_and_jacobians(*a)


def main():
    p = harness.parser(__doc__)
    p.add_argument("--ops", default="dcnv4,deformable_aggregation,warp,batch",
                   help="comma-separated groups: dcnv4, deformable_aggregation, warp, batch")
    args = p.parse_args()
    groups = {"dcnv4": dcnv4_cases, "deformable_aggregation": da_cases, "warp": warp_cases,
              "batch": batch_cases}
    report = harness.Report("bench_call_overhead", args, calls_back_to_back=K)
    rt = report.runtime
    with clkernels.use_device(rt.device):
        cases = [c for name in args.ops.split(",") for c in groups[name.strip()](rt, args.quick)]
        raw = raw_launch(rt)
        rounds = max(3, args.repeat)
        results = {i: [] for i in range(len(cases))}
        raw_host = []
        for _ in range(rounds):  # interleaved: one measurement of each per round
            raw_host.append(measure(rt, raw, 1)[0])
            for i, (_, _, call) in enumerate(cases):
                results[i].append(measure(rt, call, 1))
        raw_us = float(np.median(raw_host)) * 1e6
        report.meta["raw_pyopencl_launch_us"] = raw_us
        worst = 0.0
        for i, (op, case, _) in enumerate(cases):
            host, piped, lat, kern = (float(np.nanmedian([r[j] for r in results[i]])) * 1e6 for j in range(4))
            over = host - raw_us
            if "per call" not in op:
                worst = max(worst, over)
            report.add(case=case, variant=op, host_us=host, pipelined_us=piped, latency_us=lat,
                       kernel_us=kern, raw_us=raw_us, over_raw_us=over,
                       within_50us=("yes" if over <= 50 else "no"))
        report.meta["worst_over_raw_us"] = worst
    report.write(["variant", "case", "host_us", "over_raw_us", "within_50us", "pipelined_us",
                  "latency_us", "kernel_us", "raw_us"])


if __name__ == "__main__":
    main()
