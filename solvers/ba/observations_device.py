"""A bundle adjustment's observations ordered on the device, at the device's pace.

The device-resident iterations read the observations sorted by point (the model's index and
data, the Schur kernels' point runs) and, for the camera sums, a camera order of them. On the
host these orders are numpy passes over every observation (:mod:`solvers.ba.ordering`: a stable sort,
gathers, counts), seconds at a hundred million observations; here they are kernels
(:mod:`clkernels.sort`): the problem's index and data cross once, in the file's order, and
everything else is made where it is used. Equal, array for array, to what
:class:`solvers.ba.evaluator.Evaluator` makes on the host (stable sorts have one answer), so a solve
gives the same bits either way.

Used on GPUs and other accelerators for problems of at least :data:`MIN_OBSERVATIONS`
(``Options.device_setup``: True forces it, False keeps the host); a CPU device works on the host's
arrays in place, where the host passes are the device's.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from clkernels import arrays, simulator, sort

# Below this the host passes take under a millisecond or so and the uploads dominate either way.
MIN_OBSERVATIONS = 100_000


def wanted(runtime, n: int, option: Optional[bool]) -> bool:
    """Whether to order ``n`` observations on ``runtime``'s device (``option``:
    ``Options.device_setup``)."""
    if option is not None:
        return bool(option)
    return runtime is not None and not simulator.cpu_like(runtime.info) and n >= MIN_OBSERVATIONS


def program_requests(runtime, dtype=np.float64) -> list:
    """The programs :class:`DeviceObservations` builds on ``runtime`` with (n, 2) observed data in
    ``dtype``, for :func:`clkernels.templates.prefetch`: the sort's, and take's for int32 indices
    and for the data's rows."""
    return sort.program_requests(runtime, ((4, 1), (np.dtype(dtype).itemsize, 2)))


class DeviceObservations:
    """The orders and index arrays of one problem's observations on a device (int32 device arrays):

    - ``order``: ``np.argsort(point_index, kind="stable")``, the point order of the file's
      observations; ``cam``, ``pt``: the indices in that order; ``index``: them as (n, 2) rows,
      the model's index; ``observed``: the data in that order (in ``dtype``), or None;
    - ``pt_start`` (npt + 1): where each point's observations begin;
    - ``camera_order``: ``np.argsort(cam, kind="stable")``, positions in the point order sorted by
      camera; ``camera_counts`` (host, nc): each camera's observations.

    :meth:`host` reads one of them back (for the consumers that work on the host).
    """

    def __init__(self, runtime, camera_index, point_index, observations, num_cameras: int,
                 num_points: int, dtype=np.float64):
        rt = self.runtime = runtime
        self.n, self.nc, self.npt = len(point_index), int(num_cameras), int(num_points)
        if self.n >= 2 ** 31:
            raise ValueError(f"{self.n} observations: the device orders index with 32-bit ints")
        i32 = np.dtype(np.int32)
        ci = arrays.upload(rt, camera_index, i32)
        pi = arrays.upload(rt, point_index, i32)
        self.bytes_to_device = ci.nbytes + pi.nbytes
        self.order = sort.stable_order(rt, pi, self.npt)
        self.pt_start = sort.starts(rt, pi, self.npt)
        self.cam = sort.take(rt, ci, self.order)
        self.pt = sort.take(rt, pi, self.order)
        self.index = sort.stack_pairs(rt, self.cam, self.pt)
        self.observed = None
        if observations is not None:
            raw = arrays.upload(rt, observations, dtype)
            self.bytes_to_device += raw.nbytes
            self.observed = sort.take(rt, raw, self.order)
        self.camera_order = sort.stable_order(rt, self.cam, self.nc)
        self.camera_counts = sort.counts(rt, self.cam, self.nc).get().astype(np.int64)
        self.bytes_to_host = self.camera_counts.nbytes
        self._host = {}

    def host(self, name: str) -> np.ndarray:
        """``order``, ``cam``, ``pt`` or ``camera_order`` read back (once)."""
        if name not in self._host:
            a = getattr(self, name).get()
            self.bytes_to_host += a.nbytes
            self._host[name] = a
        return self._host[name]

    def gather_host(self, name: str, positions: np.ndarray) -> np.ndarray:
        """``host(name)[positions]`` read back for a few positions only."""
        positions = np.ascontiguousarray(positions, dtype=np.int32)
        if not positions.size:
            return np.zeros(0, np.int32)
        out = sort.take(self.runtime, getattr(self, name), arrays.to_device(self.runtime, positions)).get()
        self.bytes_to_host += out.nbytes
        return out
