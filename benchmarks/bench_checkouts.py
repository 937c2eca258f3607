"""The same solves timed in two checkouts of the code, in one run: this checkout against an older
one (the code before a restructuring), whose iterations are the same
(``tests/test_iteration_logs.py``), so only the speed can differ.

Every measurement runs in a process of its own, importing ``solvers`` from one checkout only.
The checkouts alternate case by case, ``--rounds`` times. Each process first solves its problem
``--warmup`` times (kernel builds and launch plans out of the timing), then times ``--repeat``
solves: wall clock around the public call (``solvers.bundle_adjust`` or ``solvers.solve``,
whose result is read back to the host), median. A case's figure per checkout is the median of its
rounds' medians; ``ratio`` is this checkout's over the base's. ``ratio_best`` compares the
fastest round of each: on a shared machine a round can land in a slow phase (the H200 machine's
rounds of one checkout spread by up to 30%), and the fastest rounds show what the code can do.

Cases: the five BAL problems with both linear solvers (``bal``); bench_colmap's synthetic
reconstructions of 30 and 300 images, a camera per image, sparse_schur (``colmap``; the models
are made once, by this checkout's benchmark code, and read by each checkout's own reader); and
``--scale venice`` (bench_bundle_adjust's venice size, 10 iterations, both solvers).

    python benchmarks/bench_checkouts.py --base 2a018cb                  # a commit of this repository
    python benchmarks/bench_checkouts.py --base-dir ../old --cases bal --scale venice --device nvidia
"""
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import harness  # noqa: E402

BAL = ("problem-16-22106-pre", "problem-21-11315-pre", "problem-39-18060-pre", "problem-49-7776-pre",
       "problem-73-11032-pre")
SOLVERS = ("sparse_schur", "iterative_schur")
VENICE = (1778, 993923, 5.0708)         # bench_bundle_adjust's SCALES["venice"]: cameras, points, obs per point

# Runs in the worker: ``solvers`` from the checkout first on sys.path, nothing from this one.
WORKER = """
import json, statistics, sys, time
case = json.loads(sys.argv[1])
import solvers
if case["kind"] == "bal":
    problem = solvers.read_bal(case["path"])
elif case["kind"] == "synthetic":
    problem = solvers.synthetic_problem(*case["size"], seed=1)
else:
    from solvers import colmap
    model = colmap.read_model(case["path"])
kw = dict(linear_solver=case["linear_solver"], max_iterations=case["iterations"], handle_sigint=False)
if case["device"]:
    kw["device"] = case["device"]


def once():
    t0 = time.perf_counter()
    if case["kind"] == "colmap":
        prob = colmap.problem_from_reconstruction(model, device=case["device"])
        r = solvers.solve(prob, function_tolerance=1e-6, gradient_tolerance=1e-10, parameter_tolerance=1e-8,
                          **{k: v for k, v in kw.items() if k != "device"})
    else:
        r = solvers.bundle_adjust(problem, **kw)
    return time.perf_counter() - t0, r


for _ in range(case["warmup"]):
    once()
runs = [once() for _ in range(case["repeat"])]
r = runs[-1][1]
print(json.dumps({"median_s": statistics.median(t for t, _ in runs), "final_cost": r.final_cost,
                  "iterations": r.iterations, "state": r.state}))
"""


def checkout_from_commit(rev: str, folder: str) -> str:
    """The packages of commit ``rev`` of this repository, unpacked into ``folder``."""
    archive = os.path.join(folder, "base.tar")
    subprocess.run(["git", "archive", "--format=tar", "-o", archive, rev, "clkernels", "pyclad", "solvers"],
                   cwd=ROOT, check=True)
    with tarfile.open(archive) as t:
        t.extractall(os.path.join(folder, "base"), filter="tar")
    return os.path.join(folder, "base")


def measure(checkout: str, case: dict) -> dict:
    # The checkout first: its packages shadow any others on the path (which still serves pyopencl).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [checkout, os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", WORKER, json.dumps(case)], capture_output=True,
                         text=True, cwd=checkout, env=env, timeout=3600)
    if run.returncode != 0:
        raise RuntimeError(f"{case['name']} in {checkout} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def cases(args, tmp):
    out = []
    common = dict(device=args.device, warmup=args.warmup, repeat=args.repeat)
    wanted = args.cases.split(",") if args.cases else []
    if "bal" in wanted:
        folder = os.environ.get("PYCLAD_BAL_DIR") or os.path.join(os.path.dirname(ROOT), "shared", "data", "bal")
        for name in BAL:
            path = os.path.join(folder, f"{name}.txt.bz2")
            if not os.path.exists(path):
                raise SystemExit(f"{path} not found; set PYCLAD_BAL_DIR to the folder of the BAL problems")
            out += [dict(name=f"{name} {ls}", kind="bal", path=path, linear_solver=ls, iterations=50, **common)
                    for ls in SOLVERS]
    if "colmap" in wanted:
        from bench_colmap import reconstruction
        for n in (30, 300):
            path = os.path.join(tmp, f"colmap{n}")
            os.makedirs(path)
            reconstruction(n, "per-image").write(path)
            out.append(dict(name=f"colmap {n} images", kind="colmap", path=path, linear_solver="sparse_schur",
                            iterations=50, **common))
    if "venice" in args.scale.split(","):
        out += [dict(name=f"venice {ls}", kind="synthetic", size=VENICE, linear_solver=ls, iterations=10,
                     **{**common, "repeat": max(1, args.repeat // 2)}) for ls in SOLVERS]
    return out


def main():
    p = harness.parser(__doc__)
    p.add_argument("--base", default=None, help="a commit of this repository to compare with")
    p.add_argument("--base-dir", default=None, help="or a folder holding the older clkernels, pyclad, solvers")
    p.add_argument("--cases", default="bal,colmap", help="comma-separated: bal, colmap")
    p.add_argument("--scale", default="", help="venice: bench_bundle_adjust's venice size too")
    p.add_argument("--rounds", type=int, default=3, help="alternations of the two checkouts per case")
    p.set_defaults(repeat=5, warmup=1)
    args = p.parse_args()
    if (args.base is None) == (args.base_dir is None):
        p.error("give one of --base COMMIT or --base-dir FOLDER")
    rep = harness.Report("bench_checkouts", args, base=args.base or os.path.abspath(args.base_dir),
                         rounds=args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.abspath(args.base_dir) if args.base_dir else checkout_from_commit(args.base, tmp)
        checkouts = {"base": base, "this": ROOT}
        for case in cases(args, tmp):
            medians = {k: [] for k in checkouts}
            last = {}
            for _ in range(args.rounds):
                for label, folder in checkouts.items():
                    last[label] = measure(folder, case)
                    medians[label].append(last[label]["median_s"])
            b, t = statistics.median(medians["base"]), statistics.median(medians["this"])
            rep.add(case["name"], "this/base", base_s=b, this_s=t, ratio=t / b,
                    ratio_best=min(medians["this"]) / min(medians["base"]),
                    same_cost=harness.rel_err(last["this"]["final_cost"], last["base"]["final_cost"]),
                    iterations=last["this"]["iterations"], state=last["this"]["state"],
                    rounds_base=[round(x, 4) for x in medians["base"]],
                    rounds_this=[round(x, 4) for x in medians["this"]])
    rep.write(columns=["case", "base_s", "this_s", "ratio", "ratio_best", "same_cost", "iterations", "state", "rounds_base",
                       "rounds_this"])


if __name__ == "__main__":
    main()
