"""sparse_schur's reduced pattern (:class:`solvers.linalg.schur_reduced_device.ReducedPattern`) made on
the device, from observations ordered there (:class:`solvers.ba.observations_device.DeviceObservations`).

On the host the pattern is numpy passes over every camera-point pair: at venice size (5.04M
observations, 15.3M pairs) about 0.9 s of the solve's setup, where the iterations that follow
take about as long. Here the same passes are :mod:`clkernels.sort`'s kernels and two of this
module's own (``schur_pattern_device.cl.mako``): the groups are where ``(camera, point)``
changes in camera order, the pairs are expanded per group, and one stable radix sort by block
key puts them in the host's order. Stable orders have one answer, so every array equals the
host's, and the solve gives the same bits either way.

The pairs, the groups and the observation order stay on the device, where the reduced system
reads them; only what is a count per camera or per block comes back (the block list, each
block's first pair, each camera's first group), with two single counts that size the arrays.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pyopencl as cl

from clkernels import arrays, sort
from clkernels.launch import owned_kernel
from clkernels.memory import available
from clkernels.templates import get_program, template_request

from .schur_reduced_device import ReducedPattern

TEMPLATE = "solvers/linalg/schur_pattern_device.cl.mako"
# Bytes of device memory per pair while the pattern is made: the pairs, their keys, the key
# order, the sorted copies and the radix sort's ping-pong buffers (int32 each).
BYTES_PER_PAIR = 40


def program_request():
    """This module's program, for :func:`clkernels.templates.prefetch` (the sort's programs are
    clkernels.sort's own)."""
    return template_request(TEMPLATE)


def pattern_on_device(runtime, device_observations, max_run: int, other_bytes: int = 0) -> Optional[ReducedPattern]:
    """The :class:`ReducedPattern` of ``device_observations`` (their ``cam``, ``pt`` and
    ``camera_order``), its large arrays on the device; None where the device cannot make it
    (the caller then makes it on the host): block keys beyond int32 (more than 46,340 cameras),
    2^31 pairs or more, or more memory than the device has left beside ``other_bytes``."""
    rt, dev = runtime, device_observations
    n, nc, npt = dev.n, dev.nc, dev.npt
    if nc * nc >= 2 ** 31:
        return None
    obs = dev.camera_order
    if n == 0:
        return None         # (nothing to gain; the host's pattern of nothing is immediate)
    # Groups: where (camera, point) changes in camera order.
    c, p = sort.take(rt, dev.cam, obs), sort.take(rt, dev.pt, obs)
    first = sort.run_starts(rt, c, p)
    ng = first.size
    group_cam, group_pt = sort.take(rt, c, first), sort.take(rt, p, first)
    del c, p
    group_start = arrays.scratch(rt, ng + 1, np.int32)
    cl.enqueue_copy(rt.queue, group_start.data, first.data, byte_count=4 * ng)
    cl.enqueue_copy(rt.queue, group_start.data, np.array([n], np.int32), dst_offset=4 * ng)
    del first
    # Each point's groups, cameras ascending: its run in by_pt. A group of k in its point's run
    # pairs with the k' >= k after it, so a point of m groups has m (m + 1) / 2 pairs: their
    # number in 64 bits on the host, before anything of that size is made.
    point_start = sort.starts(rt, group_pt, npt)
    per_point = np.diff(point_start.get().astype(np.int64))
    npairs = int(np.sum(per_point * (per_point + 1) // 2))
    have, _ = available(rt.info)
    if npairs >= 2 ** 31 or other_bytes + BYTES_PER_PAIR * npairs > have:
        return None
    by_pt = sort.stable_order(rt, group_pt, npt)
    where = sort.inverse_permutation(rt, by_pt)
    k = _Kernels(rt)
    items = (arrays.round_up(ng, k.ls),), (k.ls,)
    partners = arrays.scratch(rt, ng, np.int32)
    k.partners(rt.queue, *items, group_pt.data, where.data, point_start.data, np.int32(ng), partners.data)
    pair_first = sort.exclusive_scan(rt, partners)
    a, b, key = (arrays.scratch(rt, npairs, np.int32) for _ in range(3))
    k.expand(rt.queue, *items, partners.data, pair_first.data, where.data, by_pt.data, group_cam.data,
             np.int32(ng), np.int32(nc), a.data, b.data, key.data)
    del partners, pair_first, where, by_pt, point_start
    # Sorted by block, stably: within a block, in the order made (a's camera, then point).
    order = sort.stable_order(rt, key, nc * nc)
    pair_a, pair_b, key = sort.take(rt, a, order), sort.take(rt, b, order), sort.take(rt, key, order)
    del a, b, order
    present_start = sort.run_starts(rt, key)
    present = sort.take(rt, key, present_start).get()
    cam_group = sort.starts(rt, group_cam, nc).get()
    return ReducedPattern.from_pairs(n, nc, npt, max_run, obs, group_start, group_pt, cam_group,
                                     pair_a, pair_b, present, present_start.get())


class _Kernels:
    """This module's kernel objects for one call (whose arguments no other call sets)."""

    def __init__(self, rt):
        program = get_program(TEMPLATE, rt)
        self.partners = owned_kernel(program, "group_partners", self)
        self.expand = owned_kernel(program, "expand_pairs", self)
        self.ls = arrays.work_group_size(rt, self.expand, 64 if rt.info.is_cpu else 256)
