"""The dense Cholesky's triangular-solve pair (solvers.linalg.dense_cholesky_device) per
super-block size, on a diagonally dominant random matrix:

- the wall clock of ``solve(x); queue.finish()`` (median of 20, after 3);
- the host's enqueue time alone (the calls before ``finish``);
- the kernels' summed event time, their span, and the launches;
- the residual against the float64 matrix on the host;
- the factorisation's wall clock, and its super-block inverses' event time.

A probe that prints, not a bench with a result table: the GPU figures it gave are kept as its
output in benchmarks/results/probe_dense_solves-h100.log.

    python benchmarks/probe_dense_solves.py [DEVICE [N [DTYPE]]]     # default: nvidia 16002 float32
"""
import os
import statistics
import sys
import time

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import clkernels  # noqa: E402
from solvers.linalg.dense_cholesky_device import DenseCholesky  # noqa: E402
from solvers.linalg.mixed_cholesky_device import float32_blocks  # noqa: E402


def kernel_seconds(events, name=None) -> float:
    """Seconds of kernel time of the (name, event) pairs (those named ``name`` only, if given)."""
    return sum(e.profile.end - e.profile.start for n, e in events if name in (None, n)) * 1e-9


def probe(rt, S, b, dtype, rows):
    n = b.size
    blocks = float32_blocks(rt.info, (32, 4)) if dtype == np.float32 and not rt.info.is_cpu else None
    chol = DenseCholesky(rt, n, block=blocks, dtype=dtype, super_rows=rows, small_solve_max=0)
    factor_s, inverses_s = [], []
    for _ in range(4):
        chol.write_host(S, b)
        rt.queue.finish()
        chol.events = []
        t0 = time.perf_counter()
        chol.factor()
        rt.queue.finish()
        factor_s.append(time.perf_counter() - t0)
        inverses_s.append(kernel_seconds(chol.events, "super_inverse"))
    chol.events = None
    x = clkernels.arrays.scratch(rt, n, dtype)
    rhs = np.zeros(chol.m, dtype)
    rhs[:n] = b
    walls, hosts, busy, spans, launches = [], [], [], [], []
    for it in range(23):
        cl.enqueue_copy(rt.queue, chol.b.data, rhs)      # solve() overwrites b
        rt.queue.finish()
        chol.events = []
        t0 = time.perf_counter()
        chol.solve(x)
        t1 = time.perf_counter()
        rt.queue.finish()
        t2 = time.perf_counter()
        if it >= 3:
            events = [e for _, e in chol.events]
            walls.append(t2 - t0)
            hosts.append(t1 - t0)
            busy.append(kernel_seconds(chol.events))
            spans.append((events[-1].profile.end - events[0].profile.start) * 1e-9)
            launches.append(len(events))
        chol.events = None
    residual = np.abs(S.astype(np.float64) @ x.get()[:n].astype(np.float64) - b).max()
    med = statistics.median
    print(f"{np.dtype(dtype).name} super_rows={rows} launches {med(launches):.0f}: wall {med(walls) * 1e3:.3f} ms  "
          f"host enqueue {med(hosts) * 1e3:.3f} ms  kernels busy {med(busy) * 1e3:.3f} ms  span {med(spans) * 1e3:.3f} ms  "
          f"resid {residual:.2e}  factor {med(factor_s[1:]) * 1e3:.1f} ms of which super_inverse "
          f"{med(inverses_s[1:]) * 1e3:.2f} ms", flush=True)


def main():
    device = sys.argv[1] if len(sys.argv) > 1 else "nvidia"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 16002
    dtype = np.dtype(sys.argv[3] if len(sys.argv) > 3 else "float32")
    rt = clkernels.get_runtime(device).profiled()   # kernel events
    rng = np.random.default_rng(0)
    R = rng.standard_normal((n, n)).astype(np.float32)
    S = R + R.T
    S[np.diag_indices(n)] += 16 * n ** 0.5
    b = rng.standard_normal(n)
    for rows in ((512, 1024, 2048) if dtype == np.float32 else (256, 512, 1024)):
        try:
            probe(rt, S, b, dtype, rows)
        except ValueError as exc:          # a super-block larger than the device's local memory
            print(f"super_rows={rows}: {exc}")


if __name__ == "__main__":
    main()
