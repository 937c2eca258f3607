"""``python -m solvers.colmap MODEL_DIR --out OUT_DIR``: bundle-adjust a COLMAP reconstruction
(text or binary) and write it back, with Ceres' iteration log and report (as ``python -m
solvers.bal``). Ctrl-C stops after the current iteration; the best state found is still written.
``--devices`` / ``--mpi`` split the points over devices or MPI ranks (``mpirun -n K python -m
solvers.colmap MODEL_DIR --mpi``): for a reconstruction with a camera per image, by
iterative_schur (the default when split).
"""
from __future__ import annotations

import argparse
import sys
import time


from ..io import cli_output
from ..split import cli
from ..linalg.linear_solver import LINEAR_SOLVERS
from ..models.loss import LOSSES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m solvers.colmap", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="folder of a COLMAP sparse model (cameras, images, points3D: .txt or .bin)")
    p.add_argument("--out", help="folder to write the refined model to (made if missing)")
    p.add_argument("--binary", action="store_true", help="write .bin files (default: the input's format)")
    p.add_argument("--text", action="store_true", help="write .txt files")
    p.add_argument("--refine-focal-length", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--refine-principal-point", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--refine-extra-params", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--refine-rig-from-world", action=argparse.BooleanOptionalAction, default=True,
                   help="rigs: refine the frames' poses (default)")
    p.add_argument("--refine-sensor-from-rig", action=argparse.BooleanOptionalAction, default=True,
                   help="rigs: refine each camera's pose in its rig (default; --no-... for a calibrated rig)")
    p.add_argument("--constant-rig-from-world-rotation", action="store_true",
                   help="rigs: hold the frames' rotations, refine their positions")
    p.add_argument("--pose-priors", metavar="FILE",
                   help="position priors of images (lines IMAGE_ID X Y Z [SX SY SZ | C11 C12 C13 C22 C23 C33], or a "
                        "COLMAP database.db's priors): the model is aligned to them first and they fix the gauge "
                        "(solvers.colmap.priors)")
    p.add_argument("--prior-loss", default="none", choices=["none"] + [n for n in LOSSES if n != "trivial"],
                   help="the priors' robust loss (default none; COLMAP's mapper uses cauchy)")
    p.add_argument("--prior-loss-scale", type=float, default=None,
                   help="its scale, in standard deviations (default sqrt(7.815), COLMAP's)")
    p.add_argument("--prior-fallback-stddev", type=float, default=1.0,
                   help="the standard deviation of a prior without a covariance (default 1)")
    p.add_argument("--fix", default="gauge", help="gauge, first-two-poses, none, or comma-separated image ids "
                                                  "(frame ids for rigs of several cameras) whose poses stay fixed "
                                                  "(default gauge: COLMAP's TWO_CAMS_FROM_WORLD)")
    p.add_argument("--iterations", type=int, default=50, help="maximum iterations (default 50)")
    p.add_argument("--linear-solver", default=None, choices=list(LINEAR_SOLVERS),
                   help="default sparse_schur; iterative_schur with --devices or --mpi")
    p.add_argument("--loss", default="none", choices=["none"] + [n for n in LOSSES if n != "trivial"])
    p.add_argument("--loss-scale", type=float, default=1.0, help="loss scale in pixels (default 1)")
    p.add_argument("--device", default=None, help="OpenCL device spec (default: PYCLAD_DEVICE or the default device)")
    p.add_argument("--function-tolerance", type=float, default=1e-6)
    p.add_argument("--gradient-tolerance", type=float, default=1e-10)
    p.add_argument("--parameter-tolerance", type=float, default=1e-8)
    p.add_argument("--checkpoint", help="write the best state to this .npz file as the solve goes (atomically)")
    p.add_argument("--checkpoint-every", type=int, default=None, help="with --checkpoint: every N iterations (1)")
    p.add_argument("--resume", help="start from a checkpoint of this model's problem")
    cli.add_arguments(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no iteration log, only the report")
    return p


def _prior_options(args) -> dict:
    """problem_from_reconstruction's prior arguments of the command line (a bad file raises
    ValueError, which the caller reports)."""
    if args.pose_priors is None:
        return {}
    from .priors import read_pose_priors
    out = dict(pose_priors=read_pose_priors(args.pose_priors), prior_fallback_stddev=args.prior_fallback_stddev,
               prior_loss=None if args.prior_loss == "none" else args.prior_loss)
    if args.prior_loss_scale is not None:
        out["prior_loss_scale"] = args.prior_loss_scale
    return out


def main(argv=None) -> int:
    parser = build_parser()
    return cli.run(parser, parser.parse_args(argv), _main)


def _main(parser, args, comm=None) -> int:
    if not cli.only_root_prints(comm):          # rank 0 prints and writes; the others compute
        args.out = None
    args.linear_solver = cli.linear_solver(args)
    bad = cli.solver_option_error(args)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    if args.binary and args.text:
        print("error: --binary and --text exclude each other", file=sys.stderr)
        return 2
    # The output folder checked before the model is read or solved (solvers.io.cli_output).
    if cli_output.report(cli_output.check([("--out", args.out, True), ("--checkpoint", args.checkpoint, False)])):
        return 2
    import solvers
    from . import io, problem
    from ..loop.checkpoint import cli_options
    fix = args.fix
    if fix not in ("gauge", "first-two-poses", "none"):
        try:
            fix = [int(v) for v in fix.split(",")]
        except ValueError:
            print(f"error: --fix must be gauge, first-two-poses, none or image ids, got {args.fix!r}", file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    try:
        rec = io.read_model(args.model)
    except (io.ColmapFormatError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.model}: {rec.camera_ids.size} cameras, {rec.image_ids.size} images, {rec.point_ids.size} points, "
          f"{rec.num_observations} observations (read in {time.perf_counter() - t0:.2f} s)")
    try:
        prob = problem.problem_from_reconstruction(
            rec, refine_focal_length=args.refine_focal_length, refine_principal_point=args.refine_principal_point,
            refine_extra_params=args.refine_extra_params, fix=fix,
            refine_rig_from_world=args.refine_rig_from_world, refine_sensor_from_rig=args.refine_sensor_from_rig,
            constant_rig_from_world_rotation=args.constant_rig_from_world_rotation,
            **_prior_options(args),
            loss=None if args.loss == "none" else args.loss, loss_scale=args.loss_scale, device=args.device)
    except (ValueError, OSError) as e:       # (a bad or missing --pose-priors file too)
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out:
        # The points' errors written after the solve use the model's own function on the device:
        # its program goes to the build workers now, beside the solve's (a cold cache only).
        requests = problem.point_error_requests(rec, backend="auto", device=args.device)
        if requests:
            from clkernels.templates import prefetch
            prefetch(requests, args.device)
    try:
        checkpoint = cli_options(args.checkpoint, args.checkpoint_every)
    except (ValueError, TypeError) as e:
        print(f"error: --checkpoint: {e}", file=sys.stderr)
        return 2
    try:
        result = solvers.solve(prob, linear_solver=args.linear_solver, max_iterations=args.iterations,
                               function_tolerance=args.function_tolerance, gradient_tolerance=args.gradient_tolerance,
                               parameter_tolerance=args.parameter_tolerance, verbose=not args.quiet,
                               resume=args.resume, **checkpoint, **cli.options(args, comm))
    except (solvers.CheckpointError, FileNotFoundError) as e:
        print(f"error: --resume: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        if not cli.is_split(args):
            raise
        print(f"error: {e}", file=sys.stderr)      # what a split cannot solve, and why
        return 2
    print()
    print(result.full_report())
    status = 0 if result.usable else 1
    if args.out:
        # The points' errors by the solve's own function and device (its kernels are built).
        problem.update_reconstruction(rec, result, backend="auto", device=args.device)
        binary = args.binary or (not args.text and io.is_binary_model(args.model))
        # A write that fails now keeps the refined model in a fallback folder and names it.
        failed = cli_output.write_or_keep(lambda f: io.write_model(rec, f, binary=binary), args.out, "--out",
                                          args.checkpoint)
        if cli_output.report(failed):
            status = 1
        else:
            print(f"\nwritten: {args.out} ({'binary' if binary else 'text'} COLMAP model)")
    if result.checkpoint_iteration is not None:
        print(f"written: {args.checkpoint} (checkpoint of the best state, iteration {result.checkpoint_iteration})")
    return status


if __name__ == "__main__":
    sys.exit(main())
