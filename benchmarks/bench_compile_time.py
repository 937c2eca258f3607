"""How long the code generator's kernel takes to build, beside what the tape saves.

For the Snavely reprojection residual (9 + 3 parameters, 2 data) and a 2,000-node graph, each
built in a fresh process so that nothing is cached in memory:

- ``cold``: empty pyopencl and PoCL on-disk caches (``XDG_CACHE_HOME`` pointed at a new folder);
- ``disk cache``: a second process with that folder, so the binary comes from the caches;

"build" is what the caller waits for: the program build plus the first launch's excess over an
evaluation (PoCL compiles a kernel's code at its first launch, not at the program build);

for both backends (``codegen``: one kernel per function; ``tape``: one generic kernel per
parameter layout). Each row also gives the evaluation rate (values and Jacobians, device
arrays, after warm-up) and, for codegen, the break-even: the number of tuples above which its
faster evaluation repays its cold build against the tape's.

    python benchmarks/bench_compile_time.py [--device SPEC] [--out DIR]
    python benchmarks/bench_compile_time.py --backends tape     # the tape alone (codegen's 2,000-node
                                                                # build takes minutes on NVIDIA)
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

CHILD = r'''
import json, sys, time
import numpy as np, pyopencl.array as cla
import clkernels, pyclad as pc
from clkernels import templates
from solvers.models.snavely import snavely_residual

which, backend = sys.argv[1], sys.argv[2]
rt = clkernels.get_runtime()
dtype = np.float64 if rt.info.fp64 else np.float32

def chain(x):          # about 2,000 nodes: nothing folds, each step uses the last
    acc = x[0]
    for i in range(330):
        acc = pc.sin(acc * x[1] + 0.001 * (i + 1)) * x[2] + x[3]
    return [acc, acc * x[4]]

if which == "snavely":
    f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, dtype=dtype, backend=backend, device=rt)
else:
    f = pc.BatchFunction(chain, params=(5,), dtype=dtype, backend=backend, device=rt)
source = f.kernel_source(True, rt)
t0 = time.perf_counter()
templates.build(source, rt)
build_s = time.perf_counter() - t0

n = 200_000 if rt.info.is_cpu else 2_000_000
rng = np.random.default_rng(0)
if which == "snavely":
    cams = np.zeros((64, 9), dtype); cams[:, 6] = 500.0; cams[:, 5] = -10.0
    params = [cams, rng.standard_normal((n // 4, 3)).astype(dtype)]
    index = np.stack([rng.integers(0, 64, n), rng.integers(0, n // 4, n)], 1).astype(np.int32)
    data = rng.standard_normal((n, 2)).astype(dtype)
else:
    params = [rng.uniform(0.5, 1.5, (1024, 5)).astype(dtype)]
    index = rng.integers(0, 1024, (n, 1)).astype(np.int32)
    data = None
dev = [cla.to_device(rt.queue, p) for p in params]
d_index = cla.to_device(rt.queue, index)
d_data = cla.to_device(rt.queue, data) if data is not None else None
t0 = time.perf_counter()
f.values_and_jacobians(dev, d_index, d_data, index_checked=True)   # PoCL compiles at the first launch
rt.queue.finish()
first_s = time.perf_counter() - t0
times = []
for _ in range(5):
    t0 = time.perf_counter()
    f.values_and_jacobians(dev, d_index, d_data, index_checked=True)
    rt.queue.finish()
    times.append(time.perf_counter() - t0)
# The build as the caller waits for it: the program build, plus what the first launch took
# beyond an evaluation.
build_s += max(0.0, first_s - float(np.median(times)))
print(json.dumps(dict(build_s=build_s, nodes=len(f.traced.order), source_chars=len(source),
                      tuples_per_s=n / float(np.median(times)))))
'''


def child(which, backend, cache_home, device):
    env = dict(os.environ, XDG_CACHE_HOME=cache_home)
    if device:
        env["PYCLAD_DEVICE"] = device
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", CHILD, which, backend], env=env, capture_output=True,
                         text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"{which} {backend}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = harness.parser(__doc__)
    p.add_argument("--backends", default="codegen,tape", help="comma-separated: codegen, tape")
    args = p.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - {"codegen", "tape"})
    if unknown or not backends:
        p.error(f"--backends: unknown {unknown or 'empty list'}; give codegen, tape or both")
    report = harness.Report("bench_compile_time", args)
    for which in ("snavely", "graph2000"):
        rows = {}
        for backend in backends:
            with tempfile.TemporaryDirectory() as cache_home:
                for mode in ("cold", "disk cache"):
                    r = child(which, backend, cache_home, args.device)
                    rows[backend, mode] = r
        break_even = None
        if len(backends) == 2:
            cg_cold, tape_rate = rows["codegen", "cold"], rows["tape", "cold"]["tuples_per_s"]
            saved_per_tuple = 1 / tape_rate - 1 / cg_cold["tuples_per_s"]
            extra_build = cg_cold["build_s"] - rows["tape", "cold"]["build_s"]
            # Negative when codegen also builds faster (nothing to repay): 0 then.
            break_even = max(0.0, extra_build / saved_per_tuple) if saved_per_tuple > 0 else float("inf")
        for (backend, mode), r in rows.items():
            extra = ({"break_even_tuples": break_even}
                     if (backend, mode) == ("codegen", "cold") and break_even is not None else {})
            report.add(case=which, variant=f"{backend}, {mode}", build_s=r["build_s"], nodes=r["nodes"],
                       source_chars=r["source_chars"], tuples_per_s=r["tuples_per_s"], **extra)
    report.write(["case", "variant", "nodes", "source_chars", "build_s", "tuples_per_s", "break_even_tuples"])


if __name__ == "__main__":
    main()
