"""``bundle_adjust`` as a layer over ``Problem``/``solve`` against the code before it, same run.

The five BAL problems, sparse_schur and iterative_schur, default options: the wall time of
``solvers.bundle_adjust`` (reading the file excluded) in this checkout and in a checkout of
``--baseline`` (a git revision, default 23dfe7e: the last commit before ``Problem``), each in its
own process, alternating, each process warming up once and timing ``--repeat`` solves (median).
Reported: both times, their ratio (the target: at most 1.05), and whether final costs and
iteration counts are equal.

    python benchmarks/bench_bal_layer.py [--baseline REV] [--device SPEC] [--repeat N] [--rounds N]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import harness  # noqa: E402

PROBLEMS = ("problem-49-7776-pre", "problem-73-11032-pre", "problem-21-11315-pre",
            "problem-39-18060-pre", "problem-16-22106-pre")

# Runs in a child process with the checkout to time first on sys.path.
CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, solvers
path, solver, repeat, device = sys.argv[2], sys.argv[3], int(sys.argv[4]), (sys.argv[5] or None)
p = solvers.read_bal(path)
r = solvers.bundle_adjust(p, linear_solver=solver, device=device, handle_sigint=False)
times = []
for _ in range(repeat):
    t0 = time.perf_counter()
    r = solvers.bundle_adjust(p, linear_solver=solver, device=device, handle_sigint=False)
    times.append(time.perf_counter() - t0)
print(json.dumps({"s": statistics.median(times), "cost": r.final_cost, "iterations": r.iterations, "state": r.state}))
"""


def run(root, path, solver, repeat, device):
    out = subprocess.run([sys.executable, "-c", CHILD, root, path, solver, str(repeat), device or ""],
                         check=True, capture_output=True, text=True, cwd=root)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = harness.parser(__doc__)
    p.add_argument("--baseline", default="23dfe7e", help="git revision of the code before Problem, or a folder "
                                                         "holding a checkout of it (where there is no git)")
    p.add_argument("--rounds", type=int, default=2, help="alternating process pairs per case")
    p.set_defaults(repeat=3)
    args = p.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from bal_data import bal_file
    rep = harness.Report("bench_bal_layer", args, baseline=args.baseline)
    with tempfile.TemporaryDirectory() as tmp:
        given = os.path.isdir(args.baseline)
        base = os.path.abspath(args.baseline) if given else os.path.join(tmp, "baseline")
        if not given:
            subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", base, args.baseline], check=True,
                           capture_output=True)
        try:
            for solver in ("sparse_schur", "iterative_schur"):
                for name in PROBLEMS:
                    path = bal_file(name)
                    new, old = [], []
                    for _ in range(args.rounds):
                        old.append(run(base, path, solver, args.repeat, args.device))
                        new.append(run(ROOT, path, solver, args.repeat, args.device))
                    t_new = statistics.median(r["s"] for r in new)
                    t_old = statistics.median(r["s"] for r in old)
                    rep.add(name, solver, new_s=t_new, before_s=t_old, ratio=t_new / t_old,
                            same_cost=new[0]["cost"] == old[0]["cost"],
                            same_iterations=new[0]["iterations"] == old[0]["iterations"], state=new[0]["state"])
        finally:
            if not given:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base], capture_output=True)
    rep.write(["case", "variant", "new_s", "before_s", "ratio", "same_cost", "same_iterations", "state"])


if __name__ == "__main__":
    main()
