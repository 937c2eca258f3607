"""Where ``solvers.bundle_adjust`` spends its time before the first iteration (the device-resident
path; iterative_schur, or sparse_schur with ``--linear-solver``), per stage, at the benchmark's
large synthetic sizes. sparse_schur adds the reduced camera matrix's pattern (``ReducedPattern``:
which camera pairs share points, through which observations), whose arrays go into the digest.

The problem is made as ``bench_bundle_adjust.py`` makes it (``synthetic_problem(*SCALES[...],
seed=1)``); a tiny solve first builds every kernel. Then one ``bundle_adjust`` with
``max_iterations=0`` runs with timers around the preparation's entry points; every stage is timed
without the stages it calls (``DeviceState`` without ``DevicePCG``, and so on), and
``bundle_adjust (rest)`` is what remains of the time from the call to the start of iteration 0's
evaluation (checks, the state vector, the runtime). That evaluation is shown apart.

Each run is a fresh process. At the final size (9.4 GiB of device buffers for a whole solve,
more than PoCL reports on a 24 GiB machine), and with ``--setup-only``, the run stops where
iteration 0's evaluation would start, past the device-memory check. ``--before DIR`` also runs
another checkout (for instance ``git worktree add /tmp/base main``), alternating with this one
``--repeat`` times, and prints the medians side by side, with a digest of what the setup made
(observation orders, segment boundaries, point starts, index, observations) and the first cost,
which must match. ``--source DIR`` measures another checkout alone.

    python benchmarks/bench_preprocessing.py [--scale venice,final] [--before DIR] [--repeat N]
                                             [--settle S] [--setup-only] [--device SPEC] [--json]
                                             [--linear-solver iterative_schur|sparse_schur]
"""
import argparse
import dataclasses
import gc
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# (cameras, points, mean observations per point): bench_bundle_adjust.SCALES without iterations.
SCALES = {"tiny": (60, 25000, 4), "venice": (1778, 993923, 5.0708), "final": (13682, 4460000, 6.502)}
STAGES = ["synthetic_problem", "bundle_adjust (rest)", "Evaluator", "SnavelyModel", "Evaluator.camera_order",
          "DeviceState", "DevicePCG", "_camera_segments", "ReducedPattern", "device_inputs", "setup total",
          "iteration 0 evaluation"]


class _SetupDone(Exception):
    """Raised where iteration 0's evaluation would start, when only the setup is measured."""


class Timers:
    """Seconds per label, each without the time of the labelled calls it makes."""

    def __init__(self):
        self.seconds, self._stack = {}, []

    def wrap(self, owner, attr, label):
        inner = getattr(owner, attr)

        def timed(*args, **kwargs):
            self._stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                took = time.perf_counter() - t0
                nested = self._stack.pop()
                self.seconds[label] = self.seconds.get(label, 0.0) + took - nested
                if self._stack:
                    self._stack[-1] += took

        setattr(owner, attr, timed)


def _digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(a.dtype.str.encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def measure(scale, device, setup_only=False, settle=0.0, solver="iterative_schur"):
    """One size in this process: {stage: seconds}, plus the orderings' digest and the peak RSS."""
    import numpy as np
    import solvers
    import solvers.ba.evaluator as evaluator
    import solvers.loop.lm as lm
    import solvers.ba.lm_device as lm_device
    import solvers.linalg.schur_pcg_device as schur_pcg
    import solvers.linalg.schur_reduced_device as schur_reduced
    import solvers.linalg.schur_pattern_device as schur_pattern
    import solvers.models.snavely as snavely
    from clkernels import get_runtime

    solvers.bundle_adjust(solvers.synthetic_problem(4, 20, 2), linear_solver="iterative_schur",
                          max_iterations=2, device=device, handle_sigint=False)
    t0 = time.perf_counter()
    problem = solvers.synthetic_problem(*SCALES[scale], seed=1)
    made = time.perf_counter() - t0
    # On some virtual machines memory that the process freed goes back to the host within
    # seconds, and memory touched afresh then faults in slowly: ``settle`` seconds between the
    # problem and the solve let the generator's freed memory go first (the slower case).
    gc.collect()
    time.sleep(settle)

    timers, seen = Timers(), {}
    timers.wrap(evaluator.Evaluator, "__init__", "Evaluator")
    if hasattr(evaluator.Evaluator, "camera_order"):
        timers.wrap(evaluator.Evaluator, "camera_order", "Evaluator.camera_order")
    timers.wrap(snavely.SnavelyModel, "__init__", "SnavelyModel")
    timers.wrap(snavely.SnavelyModel, "device_inputs", "device_inputs")
    timers.wrap(lm_device.DeviceState, "__init__", "DeviceState")
    timers.wrap(schur_pcg.DevicePCG, "__init__", "DevicePCG")
    timers.wrap(schur_pcg, "_camera_segments", "_camera_segments")
    # The pattern, wherever it is made: on the host, or on the device from device-ordered observations.
    timers.wrap(schur_reduced.ReducedPattern, "__init__", "ReducedPattern")
    timers.wrap(schur_pattern, "pattern_on_device", "ReducedPattern")
    timers.wrap(lm_device.DeviceState, "evaluate_jacobian", "iteration 0 evaluation")
    # The setup ends where iteration 0's evaluation starts; keep the state for the digest.
    run = lm.Minimizer.run

    def run_and_keep(self, x0):
        make = self.make_state

        def make_state(*args):
            seen["state"] = make(*args)
            seen["ready"] = time.perf_counter()
            return seen["state"]

        self.make_state = make_state
        return run(self, x0)

    lm.Minimizer.run = run_and_keep
    rt = get_runtime(device)
    setup_only = setup_only or lm_device.device_bytes(
        problem.num_observations, problem.num_cameras, problem.num_points) > rt.info.global_mem_bytes
    if setup_only:
        # The setup alone, up to iteration 0's evaluation, past the memory check (a CPU device's
        # buffers are host memory, and the setup writes only the index and observations).
        if not rt.info.is_cpu:
            raise RuntimeError(f"the {scale} size does not fit on {rt.info.name}")
        rt.info = dataclasses.replace(rt.info, global_mem_bytes=1 << 62)

        def stop_here(self, first):
            raise _SetupDone

        lm_device.DeviceState.evaluate_jacobian = stop_here
    t0 = time.perf_counter()
    try:
        result = solvers.bundle_adjust(problem, linear_solver=solver, max_iterations=0,
                                       device=device, handle_sigint=False)
        if result.state != "device":
            raise RuntimeError(f"the solve ran on the {result.state}, not on the device")
    except _SetupDone:
        result = None
    setup = seen["ready"] - t0
    s = timers.seconds
    out = {k: s.get(k, 0.0) for k in STAGES if k in s}
    out["synthetic_problem"] = made
    out["setup total"] = setup
    out["bundle_adjust (rest)"] = setup - sum(v for k, v in s.items() if k != "iteration 0 evaluation")
    state = seen["state"]
    pcg, ev = state.pcg, state.ev
    ordering = _digest(*(np.asarray(a, np.int64) for a in
                         (ev.cam, ev.pt, pcg.obs.get(), pcg.seg_start.get(), pcg.cam_seg.get(),
                          pcg.pt_start.get(), pcg.cam.get(), pcg.pt.get(), state.index.get())),
                       state.observed.get())
    pattern = getattr(getattr(state.linear, "system", None), "pattern", None)
    if pattern is not None:
        # (the device pattern's large arrays are device arrays: read back for the digest)
        ordering += "-" + _digest(*(np.asarray(a.get() if hasattr(a, "get") else a, np.int64) for a in
                                    (pattern.pair_a, pattern.pair_b, pattern.block_row, pattern.block_col,
                                     pattern.block_run, pattern.run_start, pattern.group_start)))
    return {"scale": scale, "observations": problem.num_observations, "stages": out,
            "ordering_digest": ordering, "initial_cost": None if result is None else result.initial_cost,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20,
            "device": rt.info.name, "setup_only": setup_only, "linear_solver": solver}


def run_child(source, scale, device, setup_only, settle, solver):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", scale, "--source", source,
           "--settle", str(settle), "--linear-solver", solver]
    if device:
        cmd += ["--device", device]
    if setup_only:
        cmd.append("--setup-only")
    env = dict(os.environ, PYTHONPATH=source)
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, check=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_row(runs):
    """One row of the table from repeated runs: the median of each stage."""
    row = dict(runs[0])
    row["stages"] = {k: statistics.median(r["stages"][k] for r in runs) for k in runs[0]["stages"]}
    row["peak_rss_gib"] = max(r["peak_rss_gib"] for r in runs)
    digests = {(r["ordering_digest"], r["initial_cost"]) for r in runs}
    if len(digests) != 1:
        raise RuntimeError(f"repeated runs disagree on the orderings: {digests}")
    return row


def table(rows, labels):
    """Markdown: one line per stage, one column per (label, size)."""
    head = "| stage (s) | " + " | ".join(f"{lab} {r['scale']}".strip() for lab, r in zip(labels, rows)) + " |"
    lines = [head, "|---" * (len(rows) + 1) + "|"]
    for stage in STAGES:
        if not any(stage in r["stages"] for r in rows):
            continue
        cells = [f"{r['stages'][stage]:.2f}" if stage in r["stages"] else "-" for r in rows]
        name = f"**{stage}**" if stage == "setup total" else stage
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| peak RSS (GiB) | " + " | ".join(f"{r['peak_rss_gib']:.1f}" for r in rows) + " |")
    lines.append("| ordering digest | " + " | ".join(r["ordering_digest"] for r in rows) + " |")
    lines.append("| initial cost | " + " | ".join("-" if r["initial_cost"] is None else f"{r['initial_cost']!r}"
                                                  for r in rows) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", default="venice,final", help=f"sizes among {', '.join(SCALES)}")
    p.add_argument("--device", default=None, help="device spec (default: the selected device)")
    p.add_argument("--source", default=os.path.dirname(HERE), help="checkout to import solvers from")
    p.add_argument("--before", default=None, help="a second checkout, measured first, for a before/after table")
    p.add_argument("--repeat", type=int, default=1, help="runs per checkout and size (medians reported)")
    p.add_argument("--setup-only", action="store_true",
                   help="stop before iteration 0's evaluation at every size (always so at 'final')")
    p.add_argument("--settle", type=float, default=0.0,
                   help="seconds between making the problem and the solve (default 0, as in "
                        "bench_bundle_adjust.py)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON too")
    p.add_argument("--linear-solver", default="iterative_schur", choices=("iterative_schur", "sparse_schur"))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        sys.path.insert(0, os.path.abspath(args.source))
        print(json.dumps(measure(args.child, args.device, args.setup_only, args.settle, args.linear_solver)))
        return
    sources = (("before", args.before), ("after", args.source)) if args.before else (("", args.source),)
    rows, labels = [], []
    for scale in [s for s in args.scale.split(",") if s]:
        if scale not in SCALES:
            p.error(f"--scale {scale!r}: choose from {', '.join(SCALES)}")
        runs = {label: [] for label, _ in sources}
        for _ in range(max(1, args.repeat)):          # alternate the checkouts: same conditions
            for label, source in sources:
                row = run_child(os.path.abspath(source), scale, args.device,
                                args.setup_only or scale == "final", args.settle, args.linear_solver)
                runs[label].append(row)
                print(f"{label or 'measured'} {scale}: {row['observations']} observations, setup "
                      f"{row['stages']['setup total']:.2f} s on {row['device']}", file=sys.stderr, flush=True)
        for label, _ in sources:
            rows.append(median_row(runs[label]))
            labels.append(label)
    print(table(rows, labels))
    if args.before:
        for i in range(0, len(rows), 2):
            same = all(rows[i][k] == rows[i + 1][k] for k in ("ordering_digest", "initial_cost"))
            print(f"\n{rows[i]['scale']}: orderings and first cost "
                  f"{'identical' if same else 'DIFFER'} before and after")
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
