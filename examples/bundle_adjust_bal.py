"""Solve a BAL problem with pyclad's bundle adjuster and write the result.

    python examples/bundle_adjust_bal.py [FILE] [--linear-solver iterative_schur] [--loss huber] ...

Takes the same options as ``python -m solvers.bal`` (which this example calls after showing the
library calls it makes); without FILE it solves a synthetic problem.

The library calls, in short::

    import solvers
    problem = solvers.read_bal("problem-49-7776-pre.txt.bz2")        # BALFormatError if malformed
    result = solvers.bundle_adjust(problem, linear_solver="sparse_schur", loss="huber",
                                   loss_scale=1.0, verbose=True)      # Ceres' iteration log
    print(result.full_report())
    solvers.write_bal(result.problem, "optimised.txt.bz2")
    from solvers.io.ply import write_ply; write_ply(result.problem, "cloud.ply")
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from solvers.bal.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
