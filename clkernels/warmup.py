"""``python -m clkernels warmup``: build the standard kernels ahead of time, into the binary cache.

For images and containers: run it once at build time and every later process loads the binaries
(:mod:`clkernels.cache`). Each area's recipe runs the real calls on tiny inputs (so exactly the
programs a real call needs are made, with no second list of them to keep in step); the recipes'
calls run on threads, so their programs build side by side where the driver allows it.

Areas: ``vision`` (this package's ops), ``bal`` and ``colmap`` (the bundle adjuster's, from
:mod:`solvers.warmup`). The table names the upper layers' recipes by module name, so clkernels
imports none of them unless that area is asked for.
"""
from __future__ import annotations

import importlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Tuple

import numpy as np

from . import cache
from .runtime import get_runtime

# area -> "module:function"; the function takes a Runtime and returns (tasks, skipped):
# tasks [(label, callable)], skipped [(label, why)].
RECIPES = {"vision": "clkernels.warmup:vision", "bal": "solvers.warmup:bal",
           "colmap": "solvers.warmup:colmap"}

Task = Tuple[str, Callable[[], object]]


def vision(rt) -> Tuple[List[Task], List[Tuple[str, str]]]:
    """The vision ops forward and backward on tiny inputs, float32 and float16 storage."""
    from . import dcnv4, dcnv4_backward, deformable_aggregation, deformable_aggregation_backward
    from . import letterbox, warp_affine
    rng = np.random.default_rng(0)
    tasks: List[Task] = []
    for dt in (np.float32, np.float16):
        x = rng.standard_normal((1, 8, 8, 4 * 16)).astype(dt)
        om = rng.standard_normal((1, 8, 8, 4 * 27 + 4)).astype(dt) * dt(0.1)
        kw = dict(group=4, group_channels=16, device=rt)
        tasks.append((f"dcnv4 {np.dtype(dt).name}", lambda x=x, om=om, kw=kw: dcnv4(x, om, **kw)))
        tasks.append((f"dcnv4_backward {np.dtype(dt).name}",
                      lambda x=x, om=om, kw=kw: dcnv4_backward(dcnv4(x, om, **kw), x, om, **kw)))
        shapes = np.array([[[8, 8], [4, 4]]] * 2, np.int32)
        start = np.array([[0, 64], [80, 144]], np.int32)
        feat = rng.standard_normal((1, 160, 32)).astype(dt)
        loc = rng.random((1, 6, 4, 2, 2)).astype(np.float32)
        w = rng.random((1, 6, 4, 2, 2, 4)).astype(np.float32)
        if dt == np.float16:
            w = w.astype(np.float16)
        da = (feat, shapes, start, loc, w)
        tasks.append((f"deformable_aggregation {np.dtype(dt).name}",
                      lambda da=da: deformable_aggregation(*da, device=rt)))
        tasks.append((f"deformable_aggregation_backward {np.dtype(dt).name}",
                      lambda da=da: deformable_aggregation_backward(deformable_aggregation(*da, device=rt), *da,
                                                                    device=rt)))
    image = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
    for dt in (np.float32, np.float16):
        tasks.append((f"letterbox {np.dtype(dt).name}",
                      lambda dt=dt: letterbox(image, size=(32, 32), dtype=dt, device=rt)))
    M = np.array([[0.5, 0.1, 3.0], [-0.1, 0.5, 2.0]])
    tasks.append(("warp_affine", lambda: warp_affine(image, M, (32, 24), device=rt)))
    return tasks, []


def run(device=None, what=("bal", "colmap", "vision"), out=print) -> List[dict]:
    """Run the recipes of ``what`` on ``device``; print and return one row per program made
    (name, how: source or binary, seconds)."""
    rt = get_runtime(device)
    tasks: List[Task] = []
    for area in what:
        if area not in RECIPES:
            raise ValueError(f"unknown warmup area {area!r}; choose from {', '.join(RECIPES)}")
        module, _, fn = RECIPES[area].partition(":")
        area_tasks, skipped = getattr(importlib.import_module(module), fn)(rt)
        for label, why in skipped:
            out(f"skipped {area}: {label}: {why}")
        tasks += [(f"{area}: {label}", call) for label, call in area_tasks]
    out(f"warming up {len(tasks)} calls on {rt.info.name} ({rt.info.platform}); cache {cache.cache_dir()}")
    before = len(cache.made())
    t0 = time.perf_counter()
    failures = []

    def one(task):
        label, call = task
        try:
            call()
            rt.queue.finish()
            return label, None
        except Exception as exc:          # reported below, then raised: a warmup that fails says so
            return label, exc

    with ThreadPoolExecutor(max(1, min(len(tasks), 8))) as pool:
        for label, exc in pool.map(one, tasks):
            if exc is not None:
                failures.append((label, exc))
    rows = [dict(name=n, how=h, seconds=s) for n, h, s in cache.made()[before:]]
    for r in rows:
        out(f"  {r['how']:6s} {r['seconds']:8.3f} s  {r['name'] or '(unnamed)'}")
    built = sum(r["how"] == "source" for r in rows)
    out(f"{len(rows)} programs ({built} built from source, {len(rows) - built} from the cache) in "
        f"{time.perf_counter() - t0:.1f} s")
    for label, exc in failures:
        out(f"FAILED {label}: {type(exc).__name__}: {exc}")
    if failures:
        raise RuntimeError(f"{len(failures)} warmup call(s) failed (see above)")
    return rows
