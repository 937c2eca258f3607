"""The parts of a split solve (:mod:`solvers.split.partitioned`, :mod:`solvers.split.partitioned_device`):
the points cut into contiguous ranges with about as many observations each, each part's
evaluator over its range's observations, the two ways to reduce across parts (the parts of this
process, or one part per MPI rank), the device of a rank, and the log's line for a split."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import List

import numpy as np

from ..ba import ordering
from ..ba.observation_index import ObservationIndex


def point_ranges(point_index, num_points: int, parts: int):
    """``parts`` contiguous ranges ``[lo, hi)`` of the points with about equal observation counts."""
    if parts < 1:
        raise ValueError(f"the number of parts must be at least 1, got {parts}")
    counts = np.bincount(np.asarray(point_index), minlength=num_points)
    cum = np.cumsum(counts)
    total = int(cum[-1]) if cum.size else 0
    cuts = [0] + [int(np.searchsorted(cum, total * k / parts, side="left")) + 1 for k in range(1, parts)] + [num_points]
    cuts = np.minimum(np.maximum.accumulate(np.array(cuts)), num_points)
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]


class LocalParts:
    """Parts in this process. The state combines its parts' values itself (in part order), so
    each reduction here receives the combined value and has nothing left to add."""
    size, rank = 1, 0

    def __init__(self, n_parts: int):
        self._pool = ThreadPoolExecutor(n_parts) if n_parts > 1 else None
        self.bytes = 0     # contributed to the reductions (as a rank would send them)

    def map(self, fn, parts):
        if self._pool is None:
            return [fn(p) for p in parts]
        return list(self._pool.map(fn, parts))

    def sum(self, local):
        local = np.asarray(local, dtype=np.float64)
        self.bytes += local.nbytes
        return local

    max = sum

    def concat(self, local):
        return local

    def union(self, keys):
        return np.unique(keys)

    def close(self):
        if self._pool is not None:
            self._pool.shutdown()


class MPIParts:
    """One part per MPI rank of ``comm`` (mpi4py): reductions are ``Allreduce``."""

    def __init__(self, comm):
        self.comm = comm
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        self.bytes = 0     # sent by this rank's reductions

    def map(self, fn, parts):
        return [fn(p) for p in parts]

    def _allreduce(self, local, op):
        from mpi4py import MPI
        a = np.ascontiguousarray(local, dtype=np.float64)
        out = np.empty_like(a)
        self.bytes += a.nbytes
        self.comm.Allreduce(a, out, op={"sum": MPI.SUM, "max": MPI.MAX}[op])
        return out

    def sum(self, local):
        return self._allreduce(local, "sum")

    def max(self, local):
        return self._allreduce(local, "max")

    def concat(self, local):
        self.bytes += local.nbytes
        return np.concatenate(self.comm.allgather(np.ascontiguousarray(local)))

    def union(self, keys):
        return np.unique(np.concatenate(self.comm.allgather(keys)))

    def close(self):
        pass


def describe_split(comm, parts, how: str) -> str:
    """The log's line for a split solve: over what, on which devices, and ``how`` it solves."""
    devices = ", ".join(sorted({p.runtime.info.name if p.runtime is not None else "host" for p in parts}))
    if isinstance(comm, MPIParts):
        where, devices = f"{comm.size} MPI ranks", f"rank {comm.rank}: {devices}"
    else:
        where = f"{len(parts)} device{'s' if len(parts) > 1 else ''}"
    return f"Points split over {where} ({devices}); {how}"


def part_evaluators(make_evaluator, evaluator, runtimes: List, ranges) -> List[tuple]:
    """``(evaluator, runtime, lo, hi)`` per (runtime, point range): ``make_evaluator(sub_problem,
    runtime, camera_order)`` evaluates the observations of the range's points, numbered from the
    range's start. ``evaluator``: the whole problem's (solvers.ba.evaluator.Evaluator), whose point
    order holds each range's observations as one slice, in the order a part's evaluator would
    sort them to; so a part's need no mask, no sort, and, where the range starts at point 0, no
    copy. Its camera order is the whole problem's restricted to the slice."""
    ev, o = evaluator, evaluator.problem
    observed = ev.observed_in_order()
    camera_order = ev.camera_order()
    # Where each range's observations begin and end in point order.
    bounds = np.searchsorted(ev.pt, np.asarray(ranges, dtype=ev.pt.dtype).reshape(-1), side="left").reshape(-1, 2)
    out = []
    for rt, (lo, hi), (a, b) in zip(runtimes, ranges, bounds.tolist()):
        pt = ev.pt[a:b] if lo == 0 else ev.pt[a:b] - ev.pt.dtype.type(lo)
        if a == 0 and b == ev.pt.size:
            co = camera_order
        else:
            # Positions in point order sorted by camera, ties in point order: keeping the slice's
            # keeps that order.
            co = camera_order[(camera_order >= a) & (camera_order < b)]
            co = (co - a).astype(ordering.index_dtype(b - a), copy=False)
        sub = ObservationIndex(ev.cam[a:b], pt, None if observed is None else observed[a:b], o.num_cameras, hi - lo,
                            f"points {lo}:{hi}", o.camera_size, o.point_size)
        out.append((make_evaluator(sub, rt, co), rt, lo, hi))
    return out


def rank_runtime(comm, devices=None):
    """The device of this MPI rank: its host's ``devices`` (default: every GPU of the chosen
    platform, or its CPU device when it has none) taken in turn by the host's ranks."""
    from mpi4py import MPI

    from clkernels.multi_device import resolve
    local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    runtimes = resolve(devices if devices is not None else "all")
    return runtimes[local % len(runtimes)]
