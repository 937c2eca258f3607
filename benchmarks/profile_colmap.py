"""Where a COLMAP bundle adjustment's time goes: phases and cProfile of one solve after a
warm-up solve, on a ``bench_colmap.py`` reconstruction. A COLMAP problem runs the device-resident
core on merged rows (solvers.general.merged_groups) where it can; ``--general`` makes it run the general
core, whose phases are these (the device core's phases: the minimizer's times and cProfile):

Phases (wall clock, each waiting for the device at its end): the Jacobian's evaluation and host
assembly (``evaluate_jacobian``, which includes the device reduction's upload, ``prepare``), the
keys' matrix (``enqueue_keys``), the reduced matrix for the host
(``reduced_matrix``), its device assembly, factorisation and solve (``factor_solve``), and the two
products of the right-hand side and the back-substitution; within them the sum of the
keys' copies (``_compress``) and the device Cholesky (``factor``, ``solve``).

    python benchmarks/profile_colmap.py [--images N] [--per-image] [--general] [--top N]
"""
import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import bench_colmap  # noqa: E402
from solvers import colmap  # noqa: E402
from solvers.linalg import dense_cholesky_device
from solvers.general import pair_schur_device, sparse_state

PHASES = {sparse_state.SparseState: ["evaluate_jacobian"],
          pair_schur_device.DevicePairSchur: ["prepare", "enqueue_keys", "reduced_matrix", "factor_solve",
                                              "w_times", "wt_times", "_compress"],
          dense_cholesky_device.DenseCholesky: ["factor", "solve"]}


def timed(cls, name, totals):
    f = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return f(self, *args, **kwargs)
        finally:
            rt = getattr(self, "rt", None)
            if rt is not None:
                rt.queue.finish()
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - t0
    return wrapper


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--per-image", action="store_true", help="a camera per image (default: one shared)")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--general", action="store_true", help="the general core (device_resident=False)")
    args = p.parse_args()
    extra = dict(device_resident=False) if args.general else {}
    rec = bench_colmap.reconstruction(args.images, "per-image" if args.per_image else "shared")
    with tempfile.TemporaryDirectory() as tmp:
        rec.write(tmp)
        prob = colmap.problem_from_reconstruction(colmap.read_model(tmp))
    bench_colmap.ours_solve(prob, "sparse_schur", **extra)                 # builds every kernel
    totals, originals = {}, []
    for cls, names in PHASES.items():
        for name in names:
            originals.append((cls, name, getattr(cls, name)))
            setattr(cls, name, timed(cls, name, totals))
    t, r = bench_colmap.ours_solve(prob, "sparse_schur", **extra)
    for cls, name, f in originals:
        setattr(cls, name, f)
    print(f"{args.images} images, {'camera per image' if args.per_image else 'shared camera'}: "
          f"{t:.3f} s, {r.iterations} iterations, {r.core} core; {r.linear_solver_detail}")
    print("times:", {k: round(v, 4) for k, v in r.times.items()})
    for name, v in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {name:20s} {v:8.4f} s")
    prof = cProfile.Profile()
    prof.enable()
    bench_colmap.ours_solve(prob, "sparse_schur", **extra)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
