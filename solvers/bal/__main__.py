"""``python -m solvers.bal [FILE]``: solve a BAL problem and print Ceres' iteration log and report.

With no FILE, a seeded synthetic problem is solved (works anywhere, a few seconds).
Ctrl-C stops after the current iteration; the best state found is still written (--out, --ply).
--checkpoint PATH writes the best state to PATH atomically every --checkpoint-every iterations
(and at the end), so a killed solve loses at most that many; --resume PATH starts from one
(`--checkpoint P --resume P` restarts a solve that may be killed again).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from ..io import cli_output
from ..split import cli
from ..models.loss import LOSSES
from ..linalg.linear_solver import LINEAR_SOLVERS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m solvers.bal", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", nargs="?", help="BAL file (.txt, .bz2, .gz); omitted: a synthetic problem")
    p.add_argument("--iterations", type=int, default=50, help="maximum iterations (default 50)")
    p.add_argument("--linear-solver", default=None, choices=list(LINEAR_SOLVERS),
                   help="default sparse_schur; iterative_schur with --devices or --mpi (the parts stay on "
                        "their devices)")
    p.add_argument("--loss", default="none", choices=["none"] + [name for name in LOSSES if name != "trivial"],
                   help="robust loss (default none)")
    p.add_argument("--loss-scale", type=float, default=1.0, help="loss scale in pixels (default 1)")
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"],
                   help="precision of the Jacobian evaluation (float32 for devices without fp64)")
    p.add_argument("--device", default=None, help="OpenCL device spec (default: PYCLAD_DEVICE or the default device)")
    p.add_argument("--backend", default=None, help="pyclad backend for the camera model (codegen, tape, numpy)")
    p.add_argument("--function-tolerance", type=float, default=1e-6)
    p.add_argument("--gradient-tolerance", type=float, default=1e-10)
    p.add_argument("--parameter-tolerance", type=float, default=1e-8)
    p.add_argument("--eta", type=float, default=0.1, help="CG forcing tolerance of iterative_schur (default 0.1)")
    p.add_argument("--out", help="write the optimised problem as a BAL file (.bz2/.gz compress)")
    p.add_argument("--ply", help="write points and camera centres as a PLY point cloud")
    p.add_argument("--plot", help="write a convergence plot (PNG; needs matplotlib)")
    p.add_argument("--synthetic", default="20,2000,4", metavar="CAMS,POINTS,OBS_PER_POINT",
                   help="size of the synthetic problem used when no FILE is given (default 20,2000,4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic problem")
    p.add_argument("--checkpoint", metavar="PATH",
                   help="write the best state (a numpy .npz) to PATH atomically after iteration 0, "
                        "every --checkpoint-every iterations and at the end")
    p.add_argument("--checkpoint-every", type=_positive_int, default=None, metavar="N",
                   help="iterations between checkpoints (default 1; needs --checkpoint)")
    p.add_argument("--resume", metavar="PATH",
                   help="start from the parameters (and trust region radius) of a checkpoint of this problem")
    cli.add_arguments(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no iteration log, only the report")
    return p


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return v


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit(f"--plot needs matplotlib (pip install matplotlib, or pip install '.[plot]'): {e}")
    return plt


def plot_convergence(result, path) -> None:
    plt = _pyplot()
    its = [h.iteration for h in result.history]
    costs = [h.cost for h in result.history]
    ok = [h.step_is_successful for h in result.history]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogy(its, costs, "-", color="0.6")
    ax.semilogy([i for i, s in zip(its, ok) if s], [c for c, s in zip(costs, ok) if s], "o", label="accepted")
    if not all(ok):
        ax.semilogy([i for i, s in zip(its, ok) if not s], [c for c, s in zip(costs, ok) if not s], "x",
                    label="rejected")
    ax.set_xlabel("iteration")
    ax.set_ylabel("cost (1/2 sum of squared residuals)")
    ax.set_title(f"{result.problem.name}: {result.options.linear_solver}")
    ax.legend()
    fig.tight_layout()
    from ..io.atomic import replacing
    with replacing(path) as f:          # the old plot or the new one, as every output
        fig.savefig(f, dpi=100, format=os.path.splitext(os.fspath(path))[1][1:].lower() or "png")
    plt.close(fig)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.file and os.path.isfile(args.file):
        # Read and decompressed in a thread while the OpenCL driver starts (cli.run's
        # start_build_workers) and the solver imports; read_bal takes the reader.
        from ..io import read_ahead
        read_ahead.start(args.file)
    return cli.run(parser, args, _main)


def _main(parser, args, comm=None) -> int:
    if not cli.only_root_prints(comm):          # rank 0 prints and writes; the others compute
        args.out = args.ply = args.plot = None
    args.linear_solver = cli.linear_solver(args)
    bad = cli.solver_option_error(args)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    if args.checkpoint_every is not None and not args.checkpoint:
        parser.error("--checkpoint-every needs --checkpoint PATH")
    if args.plot:
        _pyplot()          # say so before solving, not after
    # Every output checked before anything is read or solved (solvers.io.cli_output).
    if cli_output.report(cli_output.check([("--out", args.out, False), ("--ply", args.ply, False),
                                           ("--plot", args.plot, False), ("--checkpoint", args.checkpoint, False)])):
        return 2
    import solvers
    from solvers.loop.checkpoint import cli_options
    from solvers.io.ply import write_ply

    t0 = time.perf_counter()
    if args.file:
        try:
            problem = solvers.read_bal(args.file)
        except (solvers.BALFormatError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    else:
        try:
            nc, npt, k = (int(v) for v in args.synthetic.split(","))
        except ValueError:
            print("error: --synthetic must be CAMS,POINTS,OBS_PER_POINT, e.g. 20,2000,4", file=sys.stderr)
            return 2
        problem = solvers.synthetic_problem(nc, npt, k, seed=args.seed)
    t_read = time.perf_counter() - t0
    print(f"{problem.name}: {problem.num_cameras} cameras, {problem.num_points} points, "
          f"{problem.num_observations} observations"
          + (f" (read in {t_read:.2f} s)" if args.file else " (synthetic; pass a BAL file to solve it)"))
    resume = None
    if args.resume:
        try:
            resume = solvers.load_checkpoint(args.resume)
            resume.check_problem(problem)
        except (solvers.CheckpointError, OSError) as e:
            print(f"error: --resume: {e}", file=sys.stderr)
            return 2
    try:
        checkpoint = cli_options(args.checkpoint, args.checkpoint_every)
    except (ValueError, TypeError) as e:
        print(f"error: --checkpoint: {e}", file=sys.stderr)
        return 2
    backend = args.backend
    if backend is None and args.device is None and not os.environ.get("PYCLAD_DEVICE"):
        # Nothing asked for a device: without a usable one the host reference path still solves
        # (and says why), so the quick start works on any machine. An explicit choice still fails.
        import clkernels
        try:
            clkernels.get_runtime()
        except clkernels.NoPlatformError as e:
            print(f"note: no usable OpenCL device, so the host reference path solves (backend numpy).\n"
                  f"      {e}", file=sys.stderr)
            backend = "numpy"
    result = solvers.bundle_adjust(
        problem, linear_solver=args.linear_solver, loss=args.loss, loss_scale=args.loss_scale,
        max_iterations=args.iterations, function_tolerance=args.function_tolerance,
        gradient_tolerance=args.gradient_tolerance, parameter_tolerance=args.parameter_tolerance,
        eta=args.eta, dtype=np.dtype(args.dtype), device=args.device, backend=backend,
        verbose=not args.quiet, resume=resume, **checkpoint, **cli.options(args, comm))
    print()
    print(result.full_report())
    status = 0 if result.usable else 1
    # A write that fails now keeps the solution in a fallback file and names it (cli_output).
    for option, path, write, what in (
            ("--out", args.out, lambda f: solvers.write_bal(result.problem, f), "optimised BAL problem"),
            ("--ply", args.ply, lambda f: write_ply(result.problem, f),
             f"PLY: {problem.num_points} points, {problem.num_cameras} camera centres"),
            ("--plot", args.plot, lambda f: plot_convergence(result, f), "convergence plot")):
        if not path:
            continue
        failed = cli_output.write_or_keep(write, path, option, args.checkpoint)
        if cli_output.report(failed):
            status = 1
        else:
            print(("\n" if option == "--out" else "") + f"written: {path} ({what})")
    if result.checkpoint_iteration is not None:
        print(("" if args.out else "\n") + f"written: {args.checkpoint} (checkpoint of the best state, "
              f"iteration {result.checkpoint_iteration})")
    return status


if __name__ == "__main__":
    cli.exit_process(main())
