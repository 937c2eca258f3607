"""``feature_maps_format``: per-scale feature maps ``[bs, num_cams, C, H, W]`` packed into the
``[bs, num_feat, C]`` layout that :func:`clkernels.deformable_aggregation` reads, with its two index
tables. Apart from the aggregation itself because it is a different op (a copy, one launch for
all levels) with its own plan; the aggregation's template holds its kernel (``KIND="format"``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import arrays, launch
from ..arrays import check_array, is_device_array
from ..launch import In, Out
from .aggregation import FEAT_DTYPES, INT32_MAX, TEMPLATE

__all__ = ["feature_maps_format"]


def _format_plan(rt, levels, options, config) -> launch.LaunchPlan:
    """One copy kernel for every level into the packed [bs, num_feat, C] layout (the levels'
    shapes are checked by feature_maps_format)."""
    bs, cams, C = (int(v) for v in levels[0].shape[:3])
    sizes = [int(l.shape[3]) * int(l.shape[4]) for l in levels]
    per_cam = sum(sizes)
    out = launch.Buffer("out", (bs, cams * per_cam, C), levels[0].dtype)
    table, row, first = [], 0, 0
    for size in sizes:
        n = bs * cams * C * size
        if n:
            table.append((size, row, first, n))
        row, first = row + size, first + n
    if not first:
        return launch.LaunchPlan([out])
    elem = "ushort" if levels[0].dtype.itemsize == 2 else "uint"      # raw bits
    k = launch.kernel_for_plan(launch.program(rt, TEMPLATE, KIND="format", E=elem, LEVELS=tuple(table)),
                               "da_format_levels")
    lsize = arrays.work_group_size(rt, k, 256)
    used = [i for i, size in enumerate(sizes) if bs * cams * C * size]   # levels with elements
    return launch.LaunchPlan([out], [launch.step(k, (arrays.round_up(first, lsize),), (lsize,), [
        *(In(i) for i in used), Out(0), np.int32(cams), np.int32(C), np.int32(cams * per_cam),
        np.int32(per_cam)])])


_format_ops: dict = {}


def _format_op(n_levels: int) -> launch.LaunchOp:
    """The copy op for this many levels (its parameters are the levels)."""
    if n_levels not in _format_ops:
        _format_ops[n_levels] = launch.LaunchOp(
            "feature_maps_format", [launch.Param(f"levels[{i}]", FEAT_DTYPES, 5) for i in range(n_levels)],
            _format_plan)
    return _format_ops[n_levels]


_format_cache: dict = {}


def _format_tables(shapes) -> tuple:
    """(spatial_shape, scale_start_index, rows per camera) of levels of these shapes; copies of
    a cached result, so that a repeat call derives nothing and a caller may change them."""
    if shapes not in _format_cache:
        bs, cams, C = shapes[0][:3]
        hw = np.array([[s[3], s[4]] for s in shapes], dtype=np.int32)
        spatial_shape = np.ascontiguousarray(np.broadcast_to(hw, (cams, len(shapes), 2)))
        sizes = (hw[:, 0].astype(np.int64) * hw[:, 1]).ravel()
        per_cam = int(sizes.sum())
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        start = (np.arange(cams)[:, None] * per_cam + offsets[None, :]).astype(np.int32)
        if bs * cams * per_cam * max(C, 1) > INT32_MAX:
            raise ValueError("levels are too large for 32-bit indexing")
        if len(_format_cache) > 64:
            _format_cache.clear()
        _format_cache[shapes] = (spatial_shape, start, per_cam)
    spatial_shape, start, per_cam = _format_cache[shapes]
    return spatial_shape.copy(), start.copy(), per_cam


def feature_maps_format(levels: Sequence, *, out=None, device=None, queue=None):
    """Turn per-scale maps ``[bs, num_cams, C, H, W]`` into the layout
    :func:`deformable_aggregation` reads, rows ordered camera, then scale, then pixels
    row-major.

    Args:
        levels: the scales' maps, each ``[bs, num_cams, C, H, W]`` with the same bs, num_cams,
            C and dtype (float32, float16 or bfloat16); numpy arrays or device arrays.
        out: an array for ``mc_ms_feat``, in its form; or None.
        device: where to run (default: where device inputs live, else the selected device).
        queue: a ``pyopencl.CommandQueue`` to run on, instead of ``device``.

    Returns:
        ``(mc_ms_feat [bs, num_feat, C], spatial_shape [num_cams, num_scale, 2] int32,
        scale_start_index [num_cams, num_scale] int32)``: ``mc_ms_feat`` numpy for numpy
        levels, else a device array; the two tables always numpy (the aggregation reads them
        on the host).

    Raises:
        ValueError: no levels, a level without 5 dimensions, or levels whose leading shapes
            or dtypes differ from the first's.
        TypeError: a level that is no array (nor makes one), or of another dtype.
    """
    if len(levels) == 0:
        raise ValueError("levels is empty: pass a list of [bs, num_cams, C, H, W] maps")
    on_device = any(is_device_array(l) for l in levels)
    checked = []
    for i, level in enumerate(levels):
        level = check_array(level, f"levels[{i}]", FEAT_DTYPES, ndim=5)
        if i and (tuple(level.shape[:3]) != tuple(checked[0].shape[:3]) or level.dtype != checked[0].dtype):
            raise ValueError(f"levels[{i}] has shape {tuple(level.shape)} and dtype {level.dtype}, "
                             f"expected ({', '.join(map(str, checked[0].shape[:3]))}, H, W) and "
                             f"{checked[0].dtype} like levels[0]")
        checked.append(level)
    spatial_shape, start, per_cam = _format_tables(tuple(tuple(l.shape) for l in checked))
    bs, cams, C = (int(v) for v in checked[0].shape[:3])
    if not on_device:
        flat = [np.asarray(l).reshape(bs, cams, C, -1) for l in checked]
        feat = np.concatenate(flat, axis=3).transpose(0, 1, 3, 2).reshape(bs, cams * per_cam, C)
        if out is not None:
            launch.check_host_out(out, feat.shape, feat.dtype, "out")
            np.copyto(out, feat)
            return out, spatial_shape, start
        return np.ascontiguousarray(feat), spatial_shape, start
    feat = _format_op(len(checked))(checked, out=out, device=device, queue=queue)[0]
    return feat, spatial_shape, start
