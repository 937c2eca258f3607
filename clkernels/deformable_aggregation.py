"""Sparse4D multi-camera, multi-scale deformable aggregation (forward and backward).

``out[b, a, c] = sum over points p, cameras k, scales s of
weights[b, a, p, k, s, c // (C // G)] * bilinear(level (k, s) of mc_ms_feat[b], at
sampling_location[b, a, p, k])``, where a sample counts only when its (x, y) lies strictly
inside (0, 1); pixel positions are ``h = y * H - 0.5``, ``w = x * W - 0.5``, corners outside the
map read as zero and the weights are not renormalised. The kernels are in
``deformable_aggregation.cl.mako``; this module validates, chooses a per-device configuration
and launches them.

Numpy in, numpy out; ``pyopencl.array.Array`` in, device arrays out with no copy of the
tensors (the small ``spatial_shape`` and ``scale_start_index`` tables are always read on the
host, to validate every block before launch). Feature storage float32 or float16 (half
storage, float arithmetic); weights float32 or float16; locations float32.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import numpy as np
import pyopencl as cl

from . import arrays
from .arrays import check_array, is_device_array
from .runtime import DeviceInfo, Runtime, get_runtime
from .templates import Storage, get_program, kernel, storage

__all__ = ["deformable_aggregation", "deformable_aggregation_backward", "feature_maps_format",
           "Config", "default_config", "enqueue_forward", "enqueue_backward",
           "deformable_aggregation_torch"]

TEMPLATE = "clkernels/deformable_aggregation.cl.mako"
FEAT_DTYPES = (np.float32, np.float16)
INT_DTYPES = (np.int32, np.int64)
INT32_MAX = 2**31 - 1
VARIANTS = ("optimized", "original")


@dataclasses.dataclass(frozen=True)
class Config:
    """Kernel shape. ``cpt`` channels of one group per work-item; ``vec`` load width for the
    contiguous layout; ``interleave`` gives a work-item channels i, i + C/G/cpt, ... instead
    of cpt adjacent ones; ``split`` (forward) work-items sharing one output; ``local_size``
    the wanted work-group size (capped by the device). Backward: ``feature_grad`` "scatter"
    (float atomics) or "gather" (deterministic, through an inverse index built with
    ``index_size`` work-items per (batch, camera, scale) plane; each gathering work-item
    takes ``cpt`` channels in each of ``groups_per_item`` groups)."""
    cpt: int = 4
    vec: int = 4
    interleave: bool = False
    split: int = 1
    local_size: int = 256
    feature_grad: str = "scatter"
    index_size: int = 64
    groups_per_item: int = 1


def _pow2_divisor(n: int, cap: int) -> int:
    d = 1
    while d * 2 <= cap and n % (d * 2) == 0:
        d *= 2
    return d


def default_config(info: DeviceInfo, channels: int, groups: int, direction: str = "forward") -> Config:
    """The configuration used when none is given: CPUs (and the simulator) like many channels
    per work-item in vector loads; GPUs like more work-items, and for the backward's
    atomics, neighbouring channels on neighbouring work-items."""
    cpg = max(channels // max(groups, 1), 1)
    if info.is_cpu or info.is_simulator:
        # CPUs: a whole group per work-item where it fits (PoCL, 2 cores: 32 channels beat 16
        # and 8 at the Sparse4D shapes); compare-and-swap float adds are slow (8x slower at the
        # inference shapes), so the backward gathers, 4 groups per work-item (1.4x faster than 1).
        cpt = _pow2_divisor(cpg, 32)
        return Config(cpt=cpt, vec=min(cpt, 8), local_size=64, feature_grad="gather", index_size=8,
                      groups_per_item=_pow2_divisor(max(groups, 1), 4))
    # GPUs, from the sweep on an H200 (Sparse4Dv3 inference and training shapes): the forward
    # is fastest with 4 channels in float4 loads and two work-items per output (split=2,
    # 1.7x over split=1); the backward with 2 interleaved channels per work-item (1.1x over 4).
    if direction == "backward":
        return Config(cpt=_pow2_divisor(cpg, 2), vec=1, interleave=True, local_size=256)
    cpt = _pow2_divisor(cpg, 4)
    return Config(cpt=cpt, vec=cpt, split=2 if cpg >= 2 * cpt else 1, local_size=256)


# ----------------------------------------------------------------------------- validation

@dataclasses.dataclass
class Problem:
    """Validated inputs on the device (from :func:`prepare`), for :func:`enqueue_forward`
    and :func:`enqueue_backward`."""
    runtime: Runtime
    like_device: bool
    feat: object
    loc: object
    weights: object
    shape: np.ndarray
    shape_dev: object
    start_dev: object
    bs: int
    num_feat: int
    C: int
    A: int
    P: int
    cams: int
    S: int
    G: int
    st: Storage
    ws: Storage


def _runtime_for(device, tensors) -> Runtime:
    if device is None:
        for t in tensors:
            if is_device_array(t):
                return get_runtime(t.context.devices[0])
    return get_runtime(device)


def _host_table(a, name: str, shape) -> np.ndarray:
    host = a.get() if is_device_array(a) else a
    host = check_array(host, name, INT_DTYPES, shape=shape)
    return np.asarray(host, dtype=np.int64)


_tables: dict = {}


def _device_table(runtime: Runtime, host: np.ndarray):
    """int32 copy of a small index table on the device, kept per (context, content)."""
    key = (runtime.context.int_ptr, host.shape, host.astype(np.int32).tobytes())
    if key not in _tables:
        if len(_tables) > 64:
            _tables.clear()
        _tables[key] = arrays.to_device(runtime, np.ascontiguousarray(host, dtype=np.int32))
    return _tables[key]


def _check_blocks(shape: np.ndarray, start: np.ndarray, num_feat: int):
    for cam, s in np.ndindex(*start.shape):
        H, W = (int(v) for v in shape[cam, s])
        first = int(start[cam, s])
        if H < 0 or W < 0 or H >= 2**24 or W >= 2**24:
            raise ValueError(f"spatial_shape[{cam}, {s}] = ({H}, {W}) is not a valid (H, W): "
                             "each must be in [0, 2**24)")
        if first < 0 or first + H * W > num_feat:
            raise ValueError(
                f"scale_start_index[{cam}, {s}] = {first} with spatial_shape ({H}, {W}) covers rows "
                f"[{first}, {first + H * W}) but mc_ms_feat has num_feat = {num_feat} rows: the "
                "block must lie inside mc_ms_feat (build the three with feature_maps_format)")


def prepare(mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights,
            device=None) -> Problem:
    """Check every argument (errors name the tensor) and every block, and move the tensors to
    the device (device arrays are used as they are)."""
    tensors = (mc_ms_feat, sampling_location, weights)
    runtime = _runtime_for(device, tensors)
    feat = check_array(mc_ms_feat, "mc_ms_feat", FEAT_DTYPES, ndim=3)
    bs, num_feat, C = (int(v) for v in feat.shape)
    loc = check_array(sampling_location, "sampling_location", (np.float32,), ndim=5)
    if loc.shape[0] != bs or loc.shape[4] != 2:
        raise ValueError(f"sampling_location has shape {tuple(loc.shape)}, expected "
                         f"({bs}, num_anchors, num_pts, num_cams, 2) for batch size {bs}")
    A, P, cams = (int(v) for v in loc.shape[1:4])
    shape = _host_table(spatial_shape, "spatial_shape", (cams, None, 2))
    S = shape.shape[1]
    start = _host_table(scale_start_index, "scale_start_index", (cams, S))
    w = check_array(weights, "weights", FEAT_DTYPES, ndim=6)
    if tuple(w.shape[:5]) != (bs, A, P, cams, S):
        raise ValueError(f"weights has shape {tuple(w.shape)}, expected ({bs}, {A}, {P}, {cams}, {S}, "
                         "num_groups) from mc_ms_feat, sampling_location and spatial_shape")
    G = int(w.shape[5])
    if G == 0 or C % G:
        raise ValueError(f"weights has {G} groups, which does not divide the {C} channels of "
                         "mc_ms_feat: channel c uses group c // (C // num_groups)")
    _check_blocks(shape, start, num_feat)
    if bs * A * P * cams * S * max(G, 2) > INT32_MAX or bs * A * C > INT32_MAX or num_feat > INT32_MAX:
        raise ValueError("sampling_location/weights are too large for 32-bit indexing in the "
                         "kernels; split the batch")
    return Problem(
        runtime, any(is_device_array(t) for t in tensors),
        arrays.to_device(runtime, feat, "mc_ms_feat"), arrays.to_device(runtime, loc, "sampling_location"),
        arrays.to_device(runtime, w, "weights"),
        shape, _device_table(runtime, shape), _device_table(runtime, start),
        bs, num_feat, C, A, P, cams, S, G, storage(feat.dtype, runtime), storage(w.dtype, runtime))


def _check_config(cfg: Config, prob: Problem) -> Config:
    cpg = prob.C // prob.G
    if cfg.cpt < 1 or cpg % cfg.cpt:
        raise ValueError(f"config.cpt = {cfg.cpt} must divide the {cpg} channels of a group")
    if not cfg.interleave and (cfg.vec not in (1, 2, 3, 4, 8, 16) or cfg.cpt % cfg.vec):
        raise ValueError(f"config.vec = {cfg.vec} must be 1, 2, 3, 4, 8 or 16 and divide cpt = {cfg.cpt}")
    if cfg.split < 1 or cfg.split & (cfg.split - 1):
        raise ValueError(f"config.split = {cfg.split} must be a power of two")
    if cfg.groups_per_item < 1 or prob.G % cfg.groups_per_item:
        raise ValueError(f"config.groups_per_item = {cfg.groups_per_item} must divide the {prob.G} groups")
    if cfg.feature_grad not in ("scatter", "gather"):
        raise ValueError(f"config.feature_grad must be 'scatter' or 'gather', not {cfg.feature_grad!r}")
    return cfg


def _kernel(prob: Problem, cfg: Config, name: str) -> cl.Kernel:
    return kernel(_program(prob, cfg), name)


def _program(prob: Problem, cfg: Config):
    return get_program(
        TEMPLATE, prob.runtime, KIND="aggregate", st=prob.st, ws=prob.ws, info=prob.runtime.info,
        C=prob.C, G=prob.G, S=prob.S, CPT=cfg.cpt, VEC=1 if cfg.interleave else cfg.vec,
        INTERLEAVE=cfg.interleave, SPLIT=cfg.split, SCATTER=cfg.feature_grad == "scatter",
        GPI=cfg.groups_per_item,
        CPG=prob.C // prob.G,
        IPG=prob.C // prob.G // cfg.cpt, ITEMS=prob.C // cfg.cpt)


def _sizes(prob: Problem):
    return (np.int32(prob.A), np.int32(prob.P), np.int32(prob.cams), np.int32(prob.num_feat))


def _to_storage(prob: Problem, acc, st: Storage, events: list):
    """A float accumulator as storage ``st`` (a kernel conversion for half)."""
    out = arrays.convert(prob.runtime, acc, st.dtype)
    if out is not acc:
        events.extend(out.events)
    return out


def _check_original(prob: Problem):
    if prob.bs * prob.A * prob.P * prob.cams * prob.S * prob.C > INT32_MAX:
        raise ValueError("the original design needs one work-item per (sample, channel): "
                         "too many for 32-bit ids at these shapes")


def _zeros(runtime: Runtime, shape, dtype, events: list):
    """Zero-filled accumulator (see :func:`clkernels.arrays.zeros` for the simulator)."""
    out = arrays.zeros(runtime, shape, dtype)
    events.extend(out.events)  # the fill is part of the operation's time
    return out


def _launch_1d(prob: Problem, k: cl.Kernel, n: int, *args, wait_for=None, wanted=256):
    """n work-items (rounded up to the work-group size; kernels check their id)."""
    if n > INT32_MAX // 2:
        raise ValueError(f"{n} work-items are too many for 32-bit ids in the kernels; split the batch")
    lsize = arrays.work_group_size(prob.runtime, k, wanted)
    return k(prob.runtime.queue, (arrays.round_up(n, lsize),), (lsize,), *args, wait_for=wait_for)


# ----------------------------------------------------------------------------- forward

def enqueue_forward(prob: Problem, variant: str = "optimized", config: Optional[Config] = None):
    """Launch the forward on prepared device arrays; returns ``(out, events)``."""
    rt, events = prob.runtime, []
    cfg = _check_config(config or default_config(rt.info, prob.C, prob.G, "forward"), prob)
    n_tasks = prob.bs * prob.A * (prob.C // cfg.cpt)
    wait = [*prob.feat.events, *prob.loc.events, *prob.weights.events]
    if variant == "original":
        _check_original(prob)
        acc = _zeros(rt, (prob.bs, prob.A, prob.C), np.float32, events)
        n = prob.bs * prob.A * prob.P * prob.cams * prob.S * prob.C
        if n:
            k = _kernel(prob, cfg, 'da_forward_original')
            events.append(_launch_1d(prob, k, n, prob.feat.data, prob.shape_dev.data,
                                     prob.start_dev.data, prob.loc.data, prob.weights.data, acc.data,
                                     *_sizes(prob), np.int32(n), wait_for=wait + acc.events))
            acc.add_event(events[-1])
        return _to_storage(prob, acc, prob.st, events), events
    if variant != "optimized":
        raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")
    out = arrays.empty(rt, (prob.bs, prob.A, prob.C), prob.st.dtype)
    if n_tasks == 0:
        return out, events
    k = _kernel(prob, cfg, 'da_forward')
    lsize = arrays.work_group_size(rt, k, cfg.local_size)
    args = [prob.feat.data, prob.shape_dev.data, prob.start_dev.data, prob.loc.data,
            prob.weights.data, out.data, *_sizes(prob), np.int32(n_tasks)]
    if cfg.split > 1:
        if lsize < cfg.split:
            raise ValueError(f"config.split = {cfg.split} exceeds the work-group size {lsize}")
        tpw = lsize // cfg.split
        args.append(cl.LocalMemory(4 * (cfg.split - 1) * cfg.cpt * tpw))
        global_size = -(-n_tasks // tpw) * lsize
    else:
        global_size = arrays.round_up(n_tasks, lsize)
    events.append(k(rt.queue, (global_size,), (lsize,), *args, wait_for=wait))
    out.add_event(events[-1])
    return out, events


def deformable_aggregation(mc_ms_feat, spatial_shape, scale_start_index, sampling_location,
                           weights, *, device=None, variant: str = "optimized",
                           config: Optional[Config] = None):
    """Sparse4D deformable aggregation: ``[bs, num_anchors, C]`` in the features' dtype.

    ``mc_ms_feat`` [bs, num_feat, C] (float32/float16), ``spatial_shape`` [num_cams,
    num_scale, 2] as (H, W), ``scale_start_index`` [num_cams, num_scale], ``sampling_location``
    [bs, num_anchors, num_pts, num_cams, 2] (x, y) float32, ``weights`` [bs, num_anchors,
    num_pts, num_cams, num_scale, num_groups]. ``variant="original"`` runs the original
    one-work-item-per-(sample, channel) atomic design (a benchmark baseline).
    """
    prob = prepare(mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights, device)
    out, _ = enqueue_forward(prob, variant, config)
    return arrays.to_host_like(out, prob.like_device)


# ----------------------------------------------------------------------------- backward

def enqueue_backward(prob: Problem, grad_out, variant: str = "optimized",
                     config: Optional[Config] = None):
    """Launch the backward; ``grad_out`` a device array. Returns ``((g_feat, g_loc, g_w), events)``."""
    rt, events = prob.runtime, []
    cfg = _check_config(config or default_config(rt.info, prob.C, prob.G, "backward"), prob)
    n_qc = prob.bs * prob.A * prob.P * prob.cams
    wait = [*prob.feat.events, *prob.loc.events, *prob.weights.events, *grad_out.events]
    loc_shape, w_shape = (prob.bs, prob.A, prob.P, prob.cams, 2), (prob.bs, prob.A, prob.P, prob.cams, prob.S, prob.G)
    if variant == "original":
        _check_original(prob)
        g_feat = _zeros(rt, (prob.bs, prob.num_feat, prob.C), np.float32, events)
        wait += g_feat.events
        common = [prob.feat.data, prob.shape_dev.data, prob.start_dev.data, prob.loc.data,
                  prob.weights.data, grad_out.data, g_feat.data]
        g_loc = _zeros(rt, loc_shape, np.float32, events)
        g_w = _zeros(rt, w_shape, np.float32, events)
        n = n_qc * prob.S * prob.C
        if n:
            k = _kernel(prob, cfg, 'da_backward_original')
            events.append(_launch_1d(prob, k, n, *common, g_loc.data, g_w.data, *_sizes(prob),
                                     np.int32(n), wait_for=wait + g_loc.events + g_w.events))
            for a in (g_feat, g_loc, g_w):
                a.add_event(events[-1])
        return (_to_storage(prob, g_feat, prob.st, events), g_loc,
                _to_storage(prob, g_w, prob.ws, events)), events
    if variant != "optimized":
        raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")
    if not (n_qc and prob.C):  # nothing is sampled: every gradient is zero
        return tuple(_to_storage(prob, _zeros(rt, shp, np.float32, events), st, events)
                     for shp, st in (((prob.bs, prob.num_feat, prob.C), prob.st),
                                     (loc_shape, Storage(np.float32)), (w_shape, prob.ws))), events
    gather = cfg.feature_grad == "gather"
    if gather:
        g_feat = arrays.empty(rt, (prob.bs, prob.num_feat, prob.C), prob.st.dtype)
        events += _gather_feature_grad(prob, cfg, grad_out, g_feat, wait)
    else:
        g_feat = _zeros(rt, (prob.bs, prob.num_feat, prob.C), np.float32, events)
        wait += g_feat.events
    g_loc = arrays.empty(rt, loc_shape, np.float32)
    g_w = arrays.empty(rt, w_shape, prob.ws.dtype)
    k = _kernel(prob, cfg, 'da_backward')
    items = prob.C // cfg.cpt
    limit = arrays.work_group_size(rt, k, max(cfg.local_size, items))
    if items > limit:
        raise ValueError(f"C / config.cpt = {items} work-items per sample exceed this device's "
                         f"work-group limit {limit}: use more channels per work-item")
    qpw = max(1, min(cfg.local_size, limit) // items)
    lsize = qpw * items
    red = cl.LocalMemory(4 * (prob.S + 2) * lsize)
    red2 = cl.LocalMemory(4 * qpw * 2 * prob.G)
    args = [prob.feat.data, prob.shape_dev.data, prob.start_dev.data, prob.loc.data,
            prob.weights.data, grad_out.data] + ([] if gather else [g_feat.data])
    if n_qc * items > INT32_MAX // 2:
        raise ValueError("sampling_location: too many samples for 32-bit ids in the kernels; split the batch")
    events.append(k(rt.queue, (-(-n_qc // qpw) * lsize,), (lsize,), *args, g_loc.data,
                    g_w.data, *_sizes(prob), np.int32(n_qc), red, red2, wait_for=wait))
    for a in (g_feat, g_loc, g_w):
        a.add_event(events[-1])
    if gather:
        return (g_feat, g_loc, g_w), events
    return (_to_storage(prob, g_feat, prob.st, events), g_loc, g_w), events


def _gather_feature_grad(prob: Problem, cfg: Config, grad_out, g_feat, wait) -> list:
    """Inverse index of samples per bilinear cell, then the feature gradient row by row."""
    rt = prob.runtime
    cells = ((prob.shape[..., 0] + 1) * (prob.shape[..., 1] + 1)).ravel()
    cell_base = np.concatenate([[0], np.cumsum(cells)]).astype(np.int64)
    n_planes, n_samples = prob.bs * prob.cams * prob.S, prob.A * prob.P
    if prob.bs * int(cell_base[-1]) > INT32_MAX:
        raise ValueError("spatial_shape: too many bilinear cells for 32-bit indexing; split the batch")
    base_dev = _device_table(rt, cell_base)
    count, first, end = (arrays.scratch(rt, prob.bs * int(cell_base[-1]), np.int32) for _ in range(3))
    entries = arrays.scratch(rt, max(n_planes * n_samples, 1), np.int32)
    events = []
    if n_planes:  # (the caller has checked that there are samples)
        index = _kernel(prob, cfg, 'da_index')
        R = arrays.work_group_size(rt, index, cfg.index_size)
        events.append(index(rt.queue, (n_planes * R,), (R,), prob.shape_dev.data, prob.loc.data,
                            base_dev.data, count.data, first.data, end.data, entries.data,
                            np.int32(prob.A), np.int32(prob.P), np.int32(prob.cams), cl.LocalMemory(4 * R),
                            wait_for=wait + count.events + first.events + end.events + entries.events))
    n_items = prob.bs * prob.num_feat * (prob.C // cfg.cpt // cfg.groups_per_item)
    if n_items:  # rows in no block, or with no scale at all, are written as zeros
        gather = _kernel(prob, cfg, 'da_backward_feat')
        events.append(_launch_1d(prob, gather, n_items, prob.shape_dev.data, prob.start_dev.data,
                                 prob.loc.data, prob.weights.data, grad_out.data, base_dev.data, first.data,
                                 end.data, entries.data, g_feat.data, *_sizes(prob), np.int32(n_items),
                                 wait_for=wait + events, wanted=cfg.local_size))
    return events


def deformable_aggregation_backward(grad_out, mc_ms_feat, spatial_shape, scale_start_index,
                                    sampling_location, weights, *, device=None,
                                    variant: str = "optimized", config: Optional[Config] = None):
    """Gradients ``(g_feat, g_loc, g_w)`` of ``sum(grad_out * deformable_aggregation(...))``
    with respect to ``mc_ms_feat``, ``sampling_location`` and ``weights``. ``grad_out`` has the
    output's shape and dtype. Samples outside (0, 1), NaN included, get zero gradient; the
    location gradient carries each scale's W (for x) and H (for y) factor.
    """
    prob = prepare(mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights,
                    _runtime_for(device, (grad_out, mc_ms_feat, sampling_location, weights)))
    go = check_array(grad_out, "grad_out", (prob.st.dtype,), shape=(prob.bs, prob.A, prob.C))
    go = arrays.to_device(prob.runtime, go, "grad_out")
    grads, _ = enqueue_backward(prob, go, variant, config)
    like_device = prob.like_device or is_device_array(grad_out)
    return tuple(arrays.to_host_like(g, like_device) for g in grads)


# ----------------------------------------------------------------------------- formatting

def feature_maps_format(levels: Sequence, *, device=None):
    """Turn per-scale maps ``[bs, num_cams, C, H, W]`` into ``(mc_ms_feat [bs, num_feat, C],
    spatial_shape [num_cams, num_scale, 2] int32, scale_start_index [num_cams, num_scale] int32)``
    with rows ordered camera, then scale, then pixels row-major. Device arrays in, device
    ``mc_ms_feat`` out (the tables are always numpy)."""
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
    bs, cams, C = (int(v) for v in checked[0].shape[:3])
    hw = np.array([[int(l.shape[3]), int(l.shape[4])] for l in checked], dtype=np.int32)
    spatial_shape = np.ascontiguousarray(np.broadcast_to(hw, (cams, len(checked), 2)))
    sizes = (hw[:, 0].astype(np.int64) * hw[:, 1]).ravel()
    per_cam = int(sizes.sum())
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    start = (np.arange(cams)[:, None] * per_cam + offsets[None, :]).astype(np.int32)
    if bs * cams * per_cam * max(C, 1) > INT32_MAX:
        raise ValueError("levels are too large for 32-bit indexing")
    if not on_device:
        flat = [np.asarray(l).reshape(bs, cams, C, -1) for l in checked]
        feat = np.concatenate(flat, axis=3).transpose(0, 1, 3, 2).reshape(bs, cams * per_cam, C)
        return np.ascontiguousarray(feat), spatial_shape, start
    runtime = _runtime_for(device, checked)
    elem = "ushort" if checked[0].dtype == np.float16 else "uint"
    k = kernel(get_program(TEMPLATE, runtime, KIND="format", E=elem), "da_format_level")
    out = arrays.empty(runtime, (bs, cams * per_cam, C), checked[0].dtype)
    for level, first, size in zip(checked, offsets, sizes):
        level = arrays.to_device(runtime, level, "levels")
        n = bs * cams * C * int(size)
        if n:
            lsize = arrays.work_group_size(runtime, k, 256)
            out.add_event(k(runtime.queue, (arrays.round_up(n, lsize),), (lsize,), level.data,
                                 out.data, np.int32(cams), np.int32(C), np.int32(size),
                                 np.int32(cams * per_cam), np.int32(per_cam), np.int32(first),
                                 np.int32(n), wait_for=level.events + out.events))
    return out, spatial_shape, start


# ----------------------------------------------------------------------------- PyTorch

@functools.lru_cache(maxsize=None)
def _torch_function():
    import torch

    def as_numpy(t, name):
        if not isinstance(t, torch.Tensor):
            return t
        if t.device.type != "cpu":
            raise ValueError(f"{name} is on {t.device}: the PyTorch wrapper takes CPU tensors "
                             "(they are shared with numpy without a copy)")
        return t.detach().contiguous().numpy()

    class DeformableAggregationFunction(torch.autograd.Function):
        """``torch.autograd.Function`` over CPU tensors (shared with numpy, no copy)."""

        @staticmethod
        def forward(ctx, mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights):
            inputs = (mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights)
            ctx.save_for_backward(*inputs)
            names = ("mc_ms_feat", "spatial_shape", "scale_start_index", "sampling_location", "weights")
            args = [as_numpy(t, n) for t, n in zip(inputs, names)]
            return torch.from_numpy(deformable_aggregation(*args))

        @staticmethod
        def backward(ctx, grad_out):
            names = ("mc_ms_feat", "spatial_shape", "scale_start_index", "sampling_location", "weights")
            args = [as_numpy(t, n) for t, n in zip(ctx.saved_tensors, names)]
            g_feat, g_loc, g_w = deformable_aggregation_backward(as_numpy(grad_out, "grad_out"), *args)
            return torch.from_numpy(g_feat), None, None, torch.from_numpy(g_loc), torch.from_numpy(g_w)

    return DeformableAggregationFunction


def deformable_aggregation_torch(mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights):
    """:func:`deformable_aggregation` on CPU tensors, differentiable with ``torch.autograd``."""
    return _torch_function().apply(mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights)


def __getattr__(name):
    if name == "DeformableAggregationFunction":  # defined on first use: torch is optional
        return _torch_function()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

