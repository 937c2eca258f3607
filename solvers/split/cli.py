"""What the command lines (``python -m solvers.bal``, ``python -m solvers.colmap``) share: how
they run (:func:`run`: the driver started in the background, the build workers), their solver
options checked before the input is read (:func:`solver_option_error`), how they end
(:func:`exit_process`), ``--mixed-precision-solves``, and ``--devices`` and ``--mpi``: a solve split over several devices of
this host, or over the ranks of ``MPI_COMM_WORLD`` (solvers.split.partitioned). Under MPI rank 0
prints and writes, the other ranks only compute, and a rank that fails ends every rank with a
message (``MPI_Abort``) rather than leaving them waiting in a reduction."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional


def add_arguments(parser):
    parser.add_argument("--devices", default=None, metavar="SPEC,SPEC|all",
                        help="split the points over several OpenCL devices of this host (comma-separated device "
                             "specs, or 'all': every GPU of the chosen platform); with --mpi, the devices a "
                             "host's ranks take in turn")
    parser.add_argument("--mixed-precision-solves", action=argparse.BooleanOptionalAction, default=None,
                        help="factorise the reduced matrix on the device in float32 and refine the solution "
                             "in float64 to float64's accuracy (Options.mixed_precision_solves; default: "
                             "on GPUs from 8,192 unknowns)")
    parser.add_argument("--mpi", action="store_true",
                        help="split the points over the ranks of MPI_COMM_WORLD (run under mpirun -n K; needs "
                             "mpi4py): each rank uses its host's GPU or CPU device, rank 0 prints and writes")


def options(args, comm) -> dict:
    """The solve's ``devices=`` / ``comm=`` from ``--devices`` and ``--mpi``, and
    ``mixed_precision_solves`` from ``--[no-]mixed-precision-solves``."""
    out = {}
    if args.mixed_precision_solves is not None:
        out["mixed_precision_solves"] = args.mixed_precision_solves
    if args.devices:
        out["devices"] = "all" if args.devices == "all" else args.devices.split(",")
    if comm is not None:
        out["comm"] = comm
        if comm.Get_rank() == 0:
            print(f"MPI: {comm.Get_size()} ranks")
    return out


def is_split(args) -> bool:
    return bool(args.devices) or args.mpi


def linear_solver(args) -> str:
    """``--linear-solver``, or its default: iterative_schur when split (the parts stay on their
    devices), else sparse_schur."""
    if args.linear_solver is not None:
        return args.linear_solver
    return "iterative_schur" if is_split(args) else "sparse_schur"


DEVICES_ALLOWED = ("comma-separated OpenCL device specs naming each device once ([platform][:device]: "
                   "substrings or indices, or cpu/gpu/accelerator; for example 'pocl:0,pocl:1'), or 'all'")


class UsageError(Exception):
    """A command-line value the solve cannot take: printed as one ``error:`` line (exit 2)."""


def check_devices(spec) -> None:
    """Raise :class:`UsageError` unless ``--devices`` names devices of this host, each once:
    before anything is read or solved (a typo found after a load is time lost)."""
    if not spec or spec == "all":
        return
    import clkernels
    from clkernels.multi_device import resolve
    entries = spec.split(",")
    if any(not e.strip() for e in entries):
        raise UsageError(f"--devices {spec!r} has an empty entry; it takes {DEVICES_ALLOWED}")
    try:
        for entry in entries:
            try:
                resolve([entry])
            except clkernels.DeviceNotFoundError:
                raise UsageError(f"--devices {spec!r}: {entry!r} matches no OpenCL device; --devices takes "
                                 f"{DEVICES_ALLOWED}. Devices found:\n{clkernels.describe_devices()}") from None
        resolve(entries)
    except clkernels.NoPlatformError as e:
        raise UsageError(f"--devices {spec!r}: {e}") from None
    except ValueError as e:            # one device named twice (clkernels.multi_device.resolve)
        raise UsageError(f"--devices {spec!r}: {e}; --devices takes {DEVICES_ALLOWED}") from None


def run(parser, args, main) -> int:
    """``main(parser, args, comm)`` with ``comm`` None, or MPI_COMM_WORLD under ``--mpi``."""
    if not args.mpi:
        try:
            check_devices(args.devices)
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        start_build_workers(args)
        return main(parser, args, None)
    try:
        from mpi4py import MPI
    except ImportError as e:
        parser.error(f"--mpi needs mpi4py (pip install mpi4py, with an MPI such as Open MPI): {e}")
    from .rank_consistency import RankMismatchError
    comm = MPI.COMM_WORLD
    try:
        check_devices(args.devices)
        status = main(parser, args, comm)
    except BaseException as e:     # noqa: B902 - any failure must end every rank, not leave them waiting
        if isinstance(e, SystemExit) and not e.code:
            raise
        if isinstance(e, (UsageError, RankMismatchError)):
            # Expected and explained: its line alone, from every rank that raised it (a rank's
            # Abort may end the others before they print).
            print(f"error: {e} (MPI rank {comm.Get_rank()} of {comm.Get_size()}; ending every rank)",
                  file=sys.stderr, flush=True)
            comm.Abort(2)
        import traceback
        traceback.print_exc()
        print(f"error: MPI rank {comm.Get_rank()} of {comm.Get_size()} failed ({type(e).__name__}: {e}); "
              "ending every rank", file=sys.stderr, flush=True)
        comm.Abort(1)
    if status == 2:
        # Refused before the solve (an unreadable file, a bad option) on this rank alone: the
        # others would wait for it in the first collective for ever, so end them too.
        sys.stdout.flush()
        sys.stderr.flush()
        comm.Abort(2)
    return status


def start_build_workers(args) -> None:
    """Start the OpenCL driver and the device's runtime in a thread that does not hold the GIL
    (:func:`clkernels.runtime.start_in_background`), and there, where the program cache is cold
    for this code, build worker processes (:func:`clkernels.templates.start_build_workers`): both
    overlap the imports and the reading of the input; the solve then finds the runtime made and
    hands the workers its programs. Not for the host path or a split over several devices. A
    device that cannot be used is reported by the solve (or it takes the host path), as without
    this."""
    if getattr(args, "backend", None) == "numpy" or getattr(args, "devices", None):
        return
    from clkernels import runtime, templates
    runtime.start_in_background(getattr(args, "device", None), then=templates.start_build_workers)


# The solver options of the command lines: the Options field and its flag (argparse's attribute
# is the flag's name with underscores).
SOLVER_FLAGS = (("max_iterations", "--iterations"), ("function_tolerance", "--function-tolerance"),
                ("gradient_tolerance", "--gradient-tolerance"), ("parameter_tolerance", "--parameter-tolerance"),
                ("eta", "--eta"))


def solver_option_error(args) -> Optional[str]:
    """The ``error:`` text for the first solver option on the command line that the solve would
    refuse (its own message, named by its flag), or None: checked before the input is read, so
    a mistyped value costs neither the reading nor a traceback."""
    from ..loop.lm import Options
    from ..models.loss import Loss
    for field, flag in SOLVER_FLAGS:
        attr = flag[2:].replace("-", "_")
        if not hasattr(args, attr):
            continue
        try:
            Options(**{field: getattr(args, attr)}).check()
        except (ValueError, TypeError) as e:
            return f"{flag} {getattr(args, attr)}: {e}"
    loss = getattr(args, "loss", "none")
    if loss not in (None, "none"):
        try:
            Loss(loss, args.loss_scale)
        except ValueError as e:
            return f"--loss-scale {args.loss_scale}: {e}"
    return None


FAST_EXIT_ENV = "PYCLAD_FAST_EXIT"


def exit_process(status: int):
    """End a command line's process with ``status`` after its ``main`` returned: every output is
    written by then (atomically, and synced), so the streams are flushed and the process ends
    with ``os._exit``, leaving to the OS what the interpreter's teardown would still do (free every
    object, run the drivers' own exit code: 0.06-0.1 s of a 1.4 s COLMAP command on the 2-core
    CPU). Exits as usual (``sys.exit``) where something still runs at exit: under MPI (mpi4py
    finalises MPI then), under a tracer or profiler (coverage, cProfile write their data then),
    where a stream cannot be flushed (its error is reported as usual), and with
    ``PYCLAD_FAST_EXIT=0``. Exceptions of ``main`` never come here: they end the process as usual."""
    if ("mpi4py.MPI" in sys.modules or sys.gettrace() is not None or sys.getprofile() is not None
            or os.environ.get(FAST_EXIT_ENV, "").strip() == "0"):
        sys.exit(status)
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        sys.exit(status)
    if "logging" in sys.modules:        # (file handlers a caller configured)
        import logging
        logging.shutdown()
    os._exit(0 if status is None else int(status))


def only_root_prints(comm) -> bool:
    """Whether this process prints and writes (rank 0, or no MPI); the others' stdout is dropped."""
    if comm is None or comm.Get_rank() == 0:
        return True
    sys.stdout = open(os.devnull, "w")
    return False
