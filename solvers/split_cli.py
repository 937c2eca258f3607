"""``--devices`` and ``--mpi`` of the command lines (``python -m solvers.bal``, ``python -m
solvers.colmap``): a solve split over several devices of this host, or over the ranks of
``MPI_COMM_WORLD`` (solvers.partitioned). Under MPI rank 0 prints and writes, the other ranks
only compute, and a rank that fails ends every rank with a message (``MPI_Abort``) rather than
leaving them waiting in a reduction."""
from __future__ import annotations

import os
import sys


def add_arguments(parser):
    parser.add_argument("--devices", default=None, metavar="SPEC,SPEC|all",
                        help="split the points over several OpenCL devices of this host (comma-separated device "
                             "specs, or 'all': every GPU of the chosen platform); with --mpi, the devices a "
                             "host's ranks take in turn")
    parser.add_argument("--mpi", action="store_true",
                        help="split the points over the ranks of MPI_COMM_WORLD (run under mpirun -n K; needs "
                             "mpi4py): each rank uses its host's GPU or CPU device, rank 0 prints and writes")


def options(args, comm) -> dict:
    """The solve's ``devices=`` / ``comm=`` from ``--devices`` and ``--mpi``."""
    out = {}
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


def run(parser, args, main) -> int:
    """``main(parser, args, comm)`` with ``comm`` None, or MPI_COMM_WORLD under ``--mpi``."""
    if not args.mpi:
        return main(parser, args, None)
    try:
        from mpi4py import MPI
    except ImportError as e:
        parser.error(f"--mpi needs mpi4py (pip install mpi4py, with an MPI such as Open MPI): {e}")
    comm = MPI.COMM_WORLD
    try:
        return main(parser, args, comm)
    except BaseException as e:     # noqa: B902 - any failure must end every rank, not leave them waiting
        if isinstance(e, SystemExit) and not e.code:
            raise
        import traceback
        traceback.print_exc()
        print(f"error: MPI rank {comm.Get_rank()} of {comm.Get_size()} failed ({type(e).__name__}: {e}); "
              "ending every rank", file=sys.stderr, flush=True)
        comm.Abort(1)


def only_root_prints(comm) -> bool:
    """Whether this process prints and writes (rank 0, or no MPI); the others' stdout is dropped."""
    if comm is None or comm.Get_rank() == 0:
        return True
    sys.stdout = open(os.devnull, "w")
    return False
