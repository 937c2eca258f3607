"""What a bundle adjustment's programs cost to make: built from source one after another, loaded
from pyclad's binary cache with the driver's own cache warm, and with the driver's cache emptied.

Each phase is a fresh process that solves one BAL problem (``sparse_schur``, as the BAL command
line does) on ``--device`` and reports :func:`clkernels.cache.made`: every program it made, how
(``source`` or ``binary``) and in how many seconds (the build, or the binary's load and the
driver's build of it).

1. ``source``: empty caches (``PYCLAD_CACHE_DIR``, ``XDG_CACHE_HOME``, ``CUDA_CACHE_PATH``,
   ``POCL_CACHE_DIR`` point at new folders) and no build workers (``PYCLAD_BUILD_PROCESSES=0``),
   so each program's build is timed alone;
2. ``binary, driver cache warm``: the same folders, now filled;
3. ``binary, driver cache empty``: pyclad's cache kept, the driver's (NVIDIA's ComputeCache,
   PoCL's kernel cache) new and empty. NVIDIA's binaries are PTX, which its driver translates for
   the GPU and keeps in that cache.

``solve_s`` is the whole solve's time in that process: PoCL compiles a kernel for the CPU at its
first launch, not at the program's build, so on PoCL the driver's work shows there.

    python benchmarks/bench_program_loads.py [--device SPEC] [--bal FILE]
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import harness  # noqa: E402
import ceres_peer  # noqa: E402
from bench_cold_start import DRIVER_CACHE_VARS, Caches  # noqa: E402

_CHILD = """
import json, sys, time
import solvers
from clkernels import cache
problem = solvers.read_bal(sys.argv[1])
t = time.perf_counter()
r = solvers.bundle_adjust(problem, linear_solver="sparse_schur", device=sys.argv[2] or None, handle_sigint=False)
print(json.dumps({"solve_s": time.perf_counter() - t, "state": r.state, "made": cache.made()}))
"""
PHASES = (("source", "new", "0"), ("binary, driver cache warm", "same", ""),
          ("binary, driver cache empty", "driver", ""))


def main():
    p = harness.parser(__doc__)
    p.add_argument("--bal", help="the BAL file (default: problem-49-7776-pre.txt.bz2 of ceres_peer.bal_files())")
    args = p.parse_args()
    bal = args.bal or next((f for f in ceres_peer.bal_files() if "problem-49-" in f), None)
    if bal is None:
        p.error("no BAL file: pass --bal")
    rep = harness.Report("bench_program_loads", args, bal=os.path.basename(bal))
    with tempfile.TemporaryDirectory(prefix="bench_program_loads-") as tmp:
        caches = None
        for phase, which, workers in PHASES:
            if which == "new":
                caches = Caches(tmp)
            elif which == "driver":
                caches.renew(DRIVER_CACHE_VARS)
            env = caches.env(dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))))
            env.pop("PYCLAD_BUILD_PROCESSES", None)
            if workers:
                env["PYCLAD_BUILD_PROCESSES"] = workers
            run = subprocess.run([sys.executable, "-c", _CHILD, bal, args.device or ""], env=env,
                                 capture_output=True, text=True, timeout=1800)
            if run.returncode != 0:
                rep.add(phase, "all programs", error=run.stderr.strip().splitlines()[-1][:300])
                continue
            out = json.loads(run.stdout.strip().splitlines()[-1])
            made = out["made"]
            rep.add(phase, "all programs", programs=len(made), how=",".join(sorted({h for _, h, _ in made})),
                    seconds=sum(s for _, _, s in made), solve_s=out["solve_s"], state=out["state"])
            for k, (name, how, s) in enumerate(made):
                rep.add(phase, f"program {k + 1}: {name}", how=how, seconds=s)
    rep.write(["case", "variant", "programs", "how", "seconds", "solve_s", "state", "error"])


if __name__ == "__main__":
    main()
