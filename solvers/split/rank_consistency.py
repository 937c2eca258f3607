"""MPI ranks check that they hold the same problem before a split solve starts.

Every rank of a split reads the problem itself and keeps only its own points' observations; the
reductions then sum camera-sized arrays. Ranks that read different files of the same sizes would
sum numbers of different problems and end with a wrong answer and exit 0; ranks with different
sizes would fail inside a reduction (MPI_ERR_TRUNCATE) or wait for ever. So before anything is
split each rank summarises its problem in a small fixed-size value (the sizes, a hash of the
structure and one of the starting parameters) and the ranks compare them with one ``allgather``
(objects of a few hundred bytes whatever the problem: no truncation). A difference raises
:class:`RankMismatchError` on every rank, naming the ranks that differ, so that every rank stops
at the same place.
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..loop.checkpoint import structure_fingerprint


class RankMismatchError(ValueError):
    """The ranks of an MPI split hold different problems (sizes, data or starting parameters)."""


def problem_summary(problem, start=None) -> tuple:
    """``(sizes, structure hash, parameters hash)`` of a :class:`solvers.Problem`: the sizes as
    ``((label, count), ...)``, the structure (groups, residuals' indices and data, what is held
    constant) through :func:`solvers.loop.checkpoint.structure_fingerprint`, and the parameters the
    solve starts from: the groups' values, or ``start``'s (a checkpoint resumed from)."""
    kinds = problem.residuals
    sizes = tuple((name, int(g.values.shape[0])) for name, g in problem.groups.items())
    sizes += tuple(("observations" if len(kinds) == 1 else f"observations of {r.name}", int(r.num_blocks))
                   for r in kinds)
    h = hashlib.sha256(np.dtype(problem.dtype).str.encode())
    if start is None:
        tables = [(name, g.values) for name, g in problem.groups.items()]
    elif hasattr(start, "tables"):          # a general problem's checkpoint
        tables = sorted(start.tables.items())
    else:                                   # a bundle adjustment's
        tables = [("cameras", start.cameras), ("points", start.points)]
    for name, values in tables:
        h.update(f"{name} {np.shape(values)}".encode())
        h.update(np.ascontiguousarray(values, "<f8").tobytes())
    return sizes, structure_fingerprint(problem), h.hexdigest()


def _difference(mine: tuple, theirs: tuple) -> str:
    """What differs between two summaries, e.g. "31843 vs 31800 observations" or "31843 vs
    31843 observations, different data"."""
    sizes = [f"{b} vs {a} {label}" for (label, a), (_, b) in zip(theirs[0], mine[0]) if a != b]
    if len(mine[0]) != len(theirs[0]) or [s[0] for s in mine[0]] != [s[0] for s in theirs[0]]:
        sizes.append("parameter groups or residual kinds " + " vs ".join(
            repr([s[0] for s in t[0]]) for t in (mine, theirs)))
    if sizes:
        return ", ".join(sizes)
    same = [f"{n} vs {n} {label}" for label, n in mine[0] if label.startswith("observations")]
    what = "different data" if mine[1] != theirs[1] else "different starting parameters"
    return ", ".join(same + [what])


def check_same_problem(comm, problem, start=None) -> None:
    """Raise :class:`RankMismatchError` on every rank of ``comm`` (mpi4py) unless every rank
    holds the same problem (and ``start``) as rank 0. Collective: every rank must call it."""
    everyone = comm.allgather(problem_summary(problem, start))
    reference = everyone[0]
    differ = [f"rank {r} differs from rank 0 ({_difference(s, reference)})"
              for r, s in enumerate(everyone) if s != reference]
    if differ:
        raise RankMismatchError(
            "MPI ranks do not hold the same problem: " + "; ".join(differ)
            + ". Give every rank the same input (the same file, or the same --synthetic size and --seed)")
