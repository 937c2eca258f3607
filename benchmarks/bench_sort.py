"""Device ordering primitives (clkernels.sort) against the host ones (solvers.ba.ordering) on a
bundle adjustment problem's observations: 1M and 10M of them, and 116M with ``--large`` (a
4x final-size problem).

Keys are realistic: the point index of each observation of a problem like
``solvers.synthetic_problem(1778, n / 5.07, 5.07, seed=1)`` (venice's cameras and observations
per point), in its file order, sorted by camera then point, so the point indices are not sorted.
Only the index part of that generator is drawn (the same draws, without the geometry).

Per size and operation: ``stable_order`` (by point), ``counts`` (observations per point),
``inverse_permutation`` (of that order) and ``take`` (the observations' (x, y) rows, float64, in
that order); and ``reduced_pattern``, sparse_schur's pattern of camera pairs
(solvers.linalg.schur_pattern_device against solvers.linalg.schur_reduced_device.ReducedPattern,
each from the observations' orders already made on its side, with the GPUs' run length; no
``device-from-host`` variant). Variants: ``device`` (device arrays in and out), ``device-from-host`` (numpy in,
numpy out: uploads and downloads included), ``host`` (solvers.ba.ordering on this host's cores).
Wall clock around the call plus ``queue.finish()``, median of ``--repeat`` runs after
``--warmup``.

    python benchmarks/bench_sort.py               # 1M and 10M
    python benchmarks/bench_sort.py --large       # also 116M
"""
from __future__ import annotations

import numpy as np

import harness

import pyopencl.array as cla
from clkernels import sort
from solvers.ba import ordering
from solvers.ba.observations_device import DeviceObservations
from solvers.linalg import schur_pattern_device
from solvers.linalg.schur_reduced_device import MAX_RUN_GPU, ReducedPattern

NUM_CAMERAS, PER_POINT = 1778, 5.07


def point_indices(n_obs: int, seed: int = 1):
    """(point_index in file order as int32, num_points): solvers.synthetic_problem's indices
    for NUM_CAMERAS cameras and n_obs / PER_POINT points, drawn as it draws them."""
    _, pt, npt = observation_indices(n_obs, seed)
    return pt, npt


def observation_indices(n_obs: int, seed: int = 1):
    """(camera_index, point_index, num_points) in file order, int32: see :func:`point_indices`."""
    nc, npt = NUM_CAMERAS, int(round(n_obs / PER_POINT))
    k = int(np.floor(PER_POINT))
    rng = np.random.default_rng(seed)
    for _ in range(4):                      # the camera centres' heights, f, k1, k2
        rng.standard_normal(nc)
    rng.uniform(-1, 1, size=(npt, 3))       # the points
    first = rng.integers(0, nc, size=npt)
    counts = k + (rng.random(npt) < PER_POINT - k)
    pt_idx = np.repeat(np.arange(npt), counts)
    within = np.arange(pt_idx.size) - np.repeat(np.cumsum(counts) - counts, counts)
    cam_idx = (first[pt_idx] + within) % nc
    order = np.lexsort((pt_idx, cam_idx))
    return cam_idx[order].astype(np.int32), pt_idx[order].astype(np.int32), npt


def main():
    p = harness.parser(__doc__)
    p.add_argument("--large", action="store_true", help="also 116M observations")
    p.set_defaults(repeat=5, warmup=1)
    args = p.parse_args()
    report = harness.Report("bench_sort", args, num_cameras=NUM_CAMERAS, obs_per_point=PER_POINT)
    sizes = [1_000_000] if args.quick else [1_000_000, 10_000_000] + ([116_000_000] if args.large else [])
    for target in sizes:
        # One function per size: its arrays (gigabytes at 116M) are freed before the next size.
        primitives(report, args, target)
        reduced_pattern(report, args, target)
    report.write(["case", "op", "variant", "median_s", "spread", "host_over_this"])


def _time(report, args, case, n, op, fns):
    """Times each variant of ``fns`` (name: call) and adds its row, with the host's ratio."""
    q = report.runtime.queue
    timings = {}
    for variant, fn in fns.items():
        def run(fn=fn):
            fn()
            q.finish()
        timings[variant] = harness.time_wall(run, warmup=args.warmup, repeat=args.repeat)
    for variant, t in timings.items():
        report.add(case=case, variant=variant, op=op, timing=t, n=n,
                   host_over_this=timings["host"].median / t.median)


def _case(n, npt):
    return f"{n / 1e6:.3g}M obs, {npt / 1e6:.3g}M points"


def primitives(report, args, target):
    rt = report.runtime
    q = rt.queue
    keys, npt = point_indices(target)
    n = keys.size
    case = _case(n, npt)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((n, 2))
    order = np.argsort(keys, kind="stable").astype(np.int32)
    keys_d, order_d, obs_d = (cla.to_device(q, a) for a in (keys, order, obs))
    q.finish()
    # (name, device call, numpy-in call, host call): each returns its result (checked once).
    ops = [
        ("stable_order", lambda: sort.stable_order(rt, keys_d, npt),
         lambda: sort.stable_order(rt, keys, npt), lambda: ordering.stable_order(keys, npt)),
        ("counts", lambda: sort.counts(rt, keys_d, npt),
         lambda: sort.counts(rt, keys, npt), lambda: ordering.counts(keys, npt)),
        ("inverse_permutation", lambda: sort.inverse_permutation(rt, order_d),
         lambda: sort.inverse_permutation(rt, order), lambda: ordering.inverse_permutation(order)),
        ("take", lambda: sort.take(rt, obs_d, order_d),
         lambda: sort.take(rt, obs, order), lambda: ordering.take(obs, order)),
    ]
    for name, device, from_host, host in ops:
        want = host()
        if not np.array_equal(device().get(), want) or not np.array_equal(from_host(), want):
            raise SystemExit(f"{name} at {case}: the device's result differs from the host's")
        _time(report, args, case, n, name, {"device": device, "device-from-host": from_host, "host": host})


def reduced_pattern(report, args, target):
    """sparse_schur's pattern, from the orders each side has made already (untimed here)."""
    rt = report.runtime
    cams, pts, npt = observation_indices(target)
    n = pts.size
    dev = DeviceObservations(rt, cams, pts, None, NUM_CAMERAS, npt)
    cam, pt, camera_order = dev.host("cam"), dev.host("pt"), dev.host("camera_order")
    del cams, pts

    def device():
        return schur_pattern_device.pattern_on_device(rt, dev, MAX_RUN_GPU)

    def host():
        return ReducedPattern(cam, pt, NUM_CAMERAS, npt, MAX_RUN_GPU, camera_order)

    want, got = host(), device()
    for name in ("obs", "group_start", "pair_a", "pair_b", "run_start", "block_row", "block_col"):
        value = getattr(got, name)
        if not np.array_equal(value.get() if hasattr(value, "get") else value, getattr(want, name)):
            raise SystemExit(f"reduced_pattern at {_case(n, npt)}: the device's {name} differs from the host's")
    del want, got
    _time(report, args, _case(n, npt), n, "reduced_pattern", {"device": device, "host": host})


if __name__ == "__main__":
    main()
