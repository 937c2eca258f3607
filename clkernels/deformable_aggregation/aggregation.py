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
host, to validate every block before launch). Feature storage float32, float16 or bfloat16
(``ml_dtypes.bfloat16``; 16-bit storage, float arithmetic); weights float32, float16 or
bfloat16; locations float32.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import pyopencl as cl

from .. import arrays, config_check, dtypes, launch, multi_device, simulator, torch_autograd
from ..arrays import check_array, is_device_array
from ..launch import OUTPUT, In, Out, Tmp
from ..runtime import DeviceInfo, Runtime
from ..templates import Storage, storage

__all__ = ["deformable_aggregation", "deformable_aggregation_backward",
           "AggregationConfig", "default_config", "enqueue_forward", "enqueue_backward",
           "deformable_aggregation_torch"]

TEMPLATE = "clkernels/deformable_aggregation/deformable_aggregation.cl.mako"
FEAT_DTYPES = (np.float32, np.float16, dtypes.BFLOAT16)
INT_DTYPES = (np.int32, np.int64)
INT32_MAX = 2**31 - 1
VARIANTS = ("optimized", "original")


@dataclasses.dataclass(frozen=True)
class AggregationConfig:
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

    def __post_init__(self):
        # What depends on the call (cpt dividing a group's channels, the device's limits) is
        # checked when a plan is made; what no call could accept, here.
        name = "AggregationConfig"
        config_check.integer(name, "cpt", self.cpt)
        config_check.boolean(name, "interleave", self.interleave)
        # (An interleaved work-item loads channel by channel: vec is not used there.)
        config_check.integer(name, "vec", self.vec, allowed=None if self.interleave else (1, 2, 3, 4, 8, 16))
        config_check.integer(name, "split", self.split)
        if self.split & (self.split - 1):
            raise ValueError(f"{name}.split must be a power of two (1, 2, 4, ...), got {self.split}")
        config_check.integer(name, "local_size", self.local_size)
        config_check.choice(name, "feature_grad", self.feature_grad, ("scatter", "gather"))
        config_check.integer(name, "index_size", self.index_size)
        config_check.integer(name, "groups_per_item", self.groups_per_item)


def _pow2_divisor(n: int, cap: int) -> int:
    d = 1
    while d * 2 <= cap and n % (d * 2) == 0:
        d *= 2
    return d


def default_config(info: DeviceInfo, channels: int, groups: int, direction: str = "forward") -> AggregationConfig:
    """The configuration used when none is given: CPUs (and the simulator) like many channels
    per work-item in vector loads; GPUs like more work-items, and for the backward's
    atomics, neighbouring channels on neighbouring work-items."""
    cpg = max(channels // max(groups, 1), 1)
    if simulator.cpu_like(info):
        # CPUs: a whole group per work-item where it fits (PoCL, 2 cores: 32 channels beat 16
        # and 8 at the Sparse4D shapes); compare-and-swap float adds are slow (8x slower at the
        # inference shapes), so the backward gathers, 4 groups per work-item (1.4x faster than 1).
        cpt = _pow2_divisor(cpg, 32)
        return AggregationConfig(cpt=cpt, vec=min(cpt, 8), local_size=64, feature_grad="gather", index_size=8,
                      groups_per_item=_pow2_divisor(max(groups, 1), 4))
    # GPUs, from the sweep on an H200 (Sparse4Dv3 inference and training shapes): the forward
    # is fastest with 4 channels in float4 loads and two work-items per output (split=2,
    # 1.7x over split=1); the backward with 2 interleaved channels per work-item (1.1x over 4).
    if direction == "backward":
        return AggregationConfig(cpt=_pow2_divisor(cpg, 2), vec=1, interleave=True, local_size=256)
    cpt = _pow2_divisor(cpg, 4)
    return AggregationConfig(cpt=cpt, vec=cpt, split=2 if cpg >= 2 * cpt else 1, local_size=256)


# ----------------------------------------------------------------------------- plans

class AggregationTables:
    """The two small index tables, read on the host (every block is checked against the
    features before a launch). Hashable by content, the hash computed once: they are part of
    a plan's key. Their shapes are checked against the tensors when a plan is made."""

    __slots__ = ("shape_dims", "hw", "start_dims", "start", "_hash")

    def __init__(self, shape_dims, hw, start_dims, start):
        self.shape_dims, self.hw, self.start_dims, self.start = shape_dims, hw, start_dims, start
        self._hash = hash((shape_dims, hw, start_dims, start))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return self is other or (isinstance(other, AggregationTables) and
                                 (self.shape_dims, self.hw, self.start_dims, self.start) ==
                                 (other.shape_dims, other.hw, other.start_dims, other.start))

    @classmethod
    def of(cls, spatial_shape, scale_start_index) -> "AggregationTables":
        shape = _host_table(spatial_shape, "spatial_shape", None)
        start = _host_table(scale_start_index, "scale_start_index", None)
        return cls(shape.shape, tuple(shape.ravel().tolist()), start.shape, tuple(start.ravel().tolist()))

    def arrays(self, cams: int):
        """(spatial_shape [cams, S, 2], scale_start_index [cams, S]), shapes checked."""
        shape = check_array(np.array(self.hw, np.int64).reshape(self.shape_dims), "spatial_shape",
                            INT_DTYPES, shape=(cams, None, 2))
        start = check_array(np.array(self.start, np.int64).reshape(self.start_dims),
                            "scale_start_index", INT_DTYPES, shape=(cams, shape.shape[1]))
        return shape, start


def _host_table(a, name: str, shape) -> np.ndarray:
    host = a.get() if is_device_array(a) else a
    host = check_array(host, name, INT_DTYPES, shape=shape)
    return np.asarray(host, dtype=np.int64)


_table_cache: dict = {}


def _tables(spatial_shape, scale_start_index) -> AggregationTables:
    """AggregationTables of these host arrays, by their bytes: a repeat call converts nothing."""
    if type(spatial_shape) is np.ndarray and type(scale_start_index) is np.ndarray:
        key = (spatial_shape.dtype.str, spatial_shape.shape, spatial_shape.tobytes(),
               scale_start_index.dtype.str, scale_start_index.shape, scale_start_index.tobytes())
        t = _table_cache.get(key)
        if t is None:
            t = AggregationTables.of(spatial_shape, scale_start_index)
            if len(_table_cache) > 64:
                _table_cache.clear()
            _table_cache[key] = t
        return t
    return AggregationTables.of(spatial_shape, scale_start_index)


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


@dataclasses.dataclass
class AggregationCall:
    """The sizes of a call, checked (made when a plan is made, from shapes and tables)."""
    rt: Runtime
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


def _problem(rt: Runtime, feat, loc, weights, tables: AggregationTables) -> AggregationCall:
    """Every shape check (errors name the tensor) and every block, then the tables on the
    device (kept by the plan)."""
    bs, num_feat, C = (int(v) for v in feat.shape)
    if loc.shape[0] != bs or loc.shape[4] != 2:
        raise ValueError(f"sampling_location has shape {tuple(loc.shape)}, expected "
                         f"({bs}, num_anchors, num_pts, num_cams, 2) for batch size {bs}")
    A, P, cams = (int(v) for v in loc.shape[1:4])
    shape, start = tables.arrays(cams)
    S = shape.shape[1]
    if tuple(weights.shape[:5]) != (bs, A, P, cams, S):
        raise ValueError(f"weights has shape {tuple(weights.shape)}, expected ({bs}, {A}, {P}, {cams}, {S}, "
                         "num_groups) from mc_ms_feat, sampling_location and spatial_shape")
    G = int(weights.shape[5])
    if G == 0 or C % G:
        raise ValueError(f"weights has {G} groups, which does not divide the {C} channels of "
                         "mc_ms_feat: channel c uses group c // (C // num_groups)")
    _check_blocks(shape, start, num_feat)
    if bs * A * P * cams * S * max(G, 2) > INT32_MAX or bs * A * C > INT32_MAX or num_feat > INT32_MAX:
        raise ValueError("sampling_location/weights are too large for 32-bit indexing in the "
                         "kernels; split the batch")
    up = lambda t: arrays.to_device(rt, np.ascontiguousarray(t, dtype=np.int32))  # noqa: E731
    return AggregationCall(rt, shape, up(shape), up(start), bs, num_feat, C, A, P, cams, S, G,
                   storage(feat.dtype, rt), storage(weights.dtype, rt))


def _check_config(cfg: AggregationConfig, prob: AggregationCall) -> AggregationConfig:
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


def _kernel(prob: AggregationCall, cfg: AggregationConfig, name: str) -> cl.Kernel:
    program = launch.program(
        prob.rt, TEMPLATE, KIND="aggregate", st=prob.st, ws=prob.ws, info=prob.rt.info,
        C=prob.C, G=prob.G, S=prob.S, CPT=cfg.cpt, VEC=1 if cfg.interleave else cfg.vec,
        INTERLEAVE=cfg.interleave, SPLIT=cfg.split, SCATTER=cfg.feature_grad == "scatter",
        GPI=cfg.groups_per_item, CPG=prob.C // prob.G, IPG=prob.C // prob.G // cfg.cpt,
        ITEMS=prob.C // cfg.cpt)
    return launch.kernel_for_plan(program, name)


def _sizes(prob: AggregationCall):
    return (np.int32(prob.A), np.int32(prob.P), np.int32(prob.cams), np.int32(prob.num_feat))


def _check_original(prob: AggregationCall):
    if prob.bs * prob.A * prob.P * prob.cams * prob.S * prob.C > INT32_MAX:
        raise ValueError("the original design needs one work-item per (sample, channel): "
                         "too many for 32-bit ids at these shapes")


def _step_1d(prob: AggregationCall, k: cl.Kernel, n: int, args, wanted=256) -> launch.Step:
    """n work-items (rounded up to the work-group size; kernels check their id)."""
    if n > INT32_MAX // 2:
        raise ValueError(f"{n} work-items are too many for 32-bit ids in the kernels; split the batch")
    lsize = arrays.work_group_size(prob.rt, k, wanted)
    return launch.step(k, (arrays.round_up(n, lsize),), (lsize,), args)


# Inputs of every plan, in this order: (mc_ms_feat, sampling_location, weights[, grad_out]).
FEAT, LOC, W, GRAD = In(0), In(1), In(2), In(3)


def _forward_plan(rt, args, options, config) -> launch.LaunchPlan:
    tables, variant = options
    feat, loc, weights = args
    prob = _problem(rt, feat, loc, weights, tables)
    cfg = _check_config(config or default_config(rt.info, prob.C, prob.G, "forward"), prob)
    out = launch.Buffer("out", (prob.bs, prob.A, prob.C), prob.st.dtype)
    keep = (prob.shape_dev, prob.start_dev)
    head = [FEAT, prob.shape_dev.data, prob.start_dev.data, LOC, W]
    if variant == "original":
        _check_original(prob)
        steps, temps = [], []
        acc, convert = launch.accumulator(rt, prob.st.dtype, out, 0, temps, steps)
        n = prob.bs * prob.A * prob.P * prob.cams * prob.S * prob.C
        if n:
            steps.append(_step_1d(prob, _kernel(prob, cfg, "da_forward_original"), n,
                                  head + [acc, *_sizes(prob), np.int32(n)]))
        steps += [convert] if convert else []
        return launch.LaunchPlan([out], steps, temps, keep)
    if variant != "optimized":
        raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")
    n_tasks = prob.bs * prob.A * (prob.C // cfg.cpt)
    if n_tasks == 0:
        return launch.LaunchPlan([out])
    k = _kernel(prob, cfg, "da_forward")
    lsize = arrays.work_group_size(rt, k, cfg.local_size)
    args = head + [Out(0), *_sizes(prob), np.int32(n_tasks)]
    if cfg.split > 1:
        if lsize < cfg.split:
            raise ValueError(f"config.split = {cfg.split} exceeds the work-group size {lsize}")
        tpw = lsize // cfg.split
        args.append(cl.LocalMemory(4 * (cfg.split - 1) * cfg.cpt * tpw))
        global_size = -(-n_tasks // tpw) * lsize
    else:
        global_size = arrays.round_up(n_tasks, lsize)
    return launch.LaunchPlan([out], [launch.step(k, (global_size,), (lsize,), args)], (), keep)


def _backward_plan(rt, args, options, config) -> launch.LaunchPlan:
    tables, variant = options
    feat, loc, weights, grad_out = args
    prob = _problem(rt, feat, loc, weights, tables)
    if tuple(grad_out.shape) != (prob.bs, prob.A, prob.C):
        raise ValueError(f"grad_out has shape {tuple(grad_out.shape)}, expected "
                         f"{(prob.bs, prob.A, prob.C)}, the output's")
    cfg = _check_config(config or default_config(rt.info, prob.C, prob.G, "backward"), prob)
    n_qc = prob.bs * prob.A * prob.P * prob.cams
    outputs = [launch.Buffer("g_feat", (prob.bs, prob.num_feat, prob.C), prob.st.dtype),
               launch.Buffer("g_loc", (prob.bs, prob.A, prob.P, prob.cams, 2), np.float32),
               launch.Buffer("g_w", (prob.bs, prob.A, prob.P, prob.cams, prob.S, prob.G), prob.ws.dtype)]
    keep = [prob.shape_dev, prob.start_dev]
    head = [FEAT, prob.shape_dev.data, prob.start_dev.data, LOC, W, GRAD]
    steps, temps = [], []
    if variant == "original":
        _check_original(prob)
        g_feat, to_storage_feat = launch.accumulator(rt, prob.st.dtype, outputs[0], 0, temps, steps)
        g_loc, _ = launch.accumulator(rt, np.float32, outputs[1], 1, temps, steps)
        g_w, to_storage_w = launch.accumulator(rt, prob.ws.dtype, outputs[2], 2, temps, steps)
        n = n_qc * prob.S * prob.C
        if n:
            steps.append(_step_1d(prob, _kernel(prob, cfg, "da_backward_original"), n,
                                  head + [g_feat, g_loc, g_w, *_sizes(prob), np.int32(n)]))
        steps += [s for s in (to_storage_feat, to_storage_w) if s is not None]
        return launch.LaunchPlan(outputs, steps, temps, keep)
    if variant != "optimized":
        raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")
    if not (n_qc and prob.C):  # nothing is sampled: every gradient is zero (zero bits in any type)
        return launch.LaunchPlan(outputs, [launch.ZeroStep(rt, OUTPUT, i, o) for i, o in enumerate(outputs)
                                     if o.nbytes])
    gather = cfg.feature_grad == "gather"
    to_storage = None
    if gather:
        steps += _gather_feature_grad(prob, cfg, temps, keep)
        feat_args = []
    else:
        g_feat, to_storage = launch.accumulator(rt, prob.st.dtype, outputs[0], 0, temps, steps)
        feat_args = [g_feat]
    k = _kernel(prob, cfg, "da_backward")
    items = prob.C // cfg.cpt
    limit = arrays.work_group_size(rt, k, max(cfg.local_size, items))
    if items > limit:
        raise ValueError(f"C / config.cpt = {items} work-items per sample exceed this device's "
                         f"work-group limit {limit}: use more channels per work-item")
    qpw = max(1, min(cfg.local_size, limit) // items)
    lsize = qpw * items
    if n_qc * items > INT32_MAX // 2:
        raise ValueError("sampling_location: too many samples for 32-bit ids in the kernels; split the batch")
    steps.append(launch.step(k, (-(-n_qc // qpw) * lsize,), (lsize,), head + feat_args + [
        Out(1), Out(2), *_sizes(prob), np.int32(n_qc), cl.LocalMemory(4 * (prob.S + 2) * lsize),
        cl.LocalMemory(4 * qpw * 2 * prob.G)]))
    steps += [to_storage] if to_storage is not None else []
    return launch.LaunchPlan(outputs, steps, temps, keep)


def _gather_feature_grad(prob: AggregationCall, cfg: AggregationConfig, temps: list, keep: list) -> list:
    """Steps: an inverse index of samples per bilinear cell, then the feature gradient row by
    row, written straight into output 0 (every row, zeros where nothing samples it)."""
    rt = prob.rt
    cells = ((prob.shape[..., 0] + 1) * (prob.shape[..., 1] + 1)).ravel()
    cell_base = np.concatenate([[0], np.cumsum(cells)]).astype(np.int64)
    n_planes, n_samples = prob.bs * prob.cams * prob.S, prob.A * prob.P
    if prob.bs * int(cell_base[-1]) > INT32_MAX:
        raise ValueError("spatial_shape: too many bilinear cells for 32-bit indexing; split the batch")
    base_dev = arrays.to_device(rt, cell_base.astype(np.int32))
    keep.append(base_dev)
    first = len(temps)
    temps += [launch.Buffer(name, (prob.bs * int(cell_base[-1]),), np.int32)
              for name in ("cell_count", "cell_start", "cell_end")]
    temps.append(launch.Buffer("entries", (max(n_planes * n_samples, 1),), np.int32))
    count, start, end, entries = (Tmp(first + i) for i in range(4))
    steps = launch.scratch_steps(rt, [(Tmp(first + i), temps[first + i]) for i in range(4)])
    if n_planes:  # (the caller has checked that there are samples)
        index = _kernel(prob, cfg, "da_index")
        R = arrays.work_group_size(rt, index, cfg.index_size)
        steps.append(launch.step(index, (n_planes * R,), (R,), [
            prob.shape_dev.data, LOC, base_dev.data, count, start, end, entries,
            np.int32(prob.A), np.int32(prob.P), np.int32(prob.cams), cl.LocalMemory(4 * R)]))
    n_items = prob.bs * prob.num_feat * (prob.C // cfg.cpt // cfg.groups_per_item)
    if n_items:  # rows in no block, or with no scale at all, are written as zeros
        steps.append(_step_1d(prob, _kernel(prob, cfg, "da_backward_feat"), n_items, [
            prob.shape_dev.data, prob.start_dev.data, LOC, W, GRAD, base_dev.data, start, end,
            entries, Out(0), *_sizes(prob), np.int32(n_items)], wanted=cfg.local_size))
    return steps


_PARAMS = [launch.Param("mc_ms_feat", FEAT_DTYPES, 3), launch.Param("sampling_location", (np.float32,), 5),
           launch.Param("weights", FEAT_DTYPES, 6)]
FORWARD = launch.LaunchOp("deformable_aggregation", _PARAMS, _forward_plan)
BACKWARD = launch.LaunchOp("deformable_aggregation_backward",
                     _PARAMS + [launch.Param("grad_out", like="mc_ms_feat", ndim=3)], _backward_plan,
                     output_names=("g_feat", "g_loc", "g_w"))


def enqueue_forward(rt: Runtime, mc_ms_feat, spatial_shape, scale_start_index, sampling_location,
                    weights, variant: str = "optimized", config: Optional[AggregationConfig] = None, out=None):
    """Enqueue the forward on device arrays; returns ``(out, events)``."""
    (result,), events = FORWARD.run((mc_ms_feat, sampling_location, weights),
                                    (_tables(spatial_shape, scale_start_index), variant), config,
                                    out=out, queue=rt.queue)
    return result, events


def enqueue_backward(rt: Runtime, grad_out, mc_ms_feat, spatial_shape, scale_start_index,
                     sampling_location, weights, variant: str = "optimized",
                     config: Optional[AggregationConfig] = None, out=None):
    """Enqueue the backward on device arrays; returns ``((g_feat, g_loc, g_w), events)``, the
    events spanning all of its work (fills, index building, half conversions)."""
    return BACKWARD.run((mc_ms_feat, sampling_location, weights, grad_out),
                        (_tables(spatial_shape, scale_start_index), variant), config,
                        out=out, queue=rt.queue)


def deformable_aggregation(mc_ms_feat, spatial_shape, scale_start_index, sampling_location,
                           weights, *, out=None, device=None, queue=None, variant: str = "optimized",
                           config: Optional[AggregationConfig] = None, devices=None):
    """Sparse4D deformable aggregation: ``[bs, num_anchors, C]`` in the features' dtype.

    Each anchor sums, over its points, cameras and scales, the bilinear sample of that
    camera's scale at the point's location, weighted per channel group. numpy in, numpy out;
    device arrays in (any context and queue), device array out.

    Args:
        mc_ms_feat: ``[bs, num_feat, C]``, float32, float16 or bfloat16: every camera's scales,
            flattened as :func:`feature_maps_format` makes them.
        spatial_shape: ``[num_cams, num_scale, 2]`` integers, each scale's (H, W). Read on the
            host: pass numpy (a device array is read back on every call).
        scale_start_index: ``[num_cams, num_scale]`` integers, where each scale's rows start in
            ``mc_ms_feat``; on the host, as ``spatial_shape``.
        sampling_location: ``[bs, num_anchors, num_pts, num_cams, 2]`` float32, (x, y) in
            [0, 1] across the image; samples outside (0, 1), NaN included, add nothing.
        weights: ``[bs, num_anchors, num_pts, num_cams, num_scale, num_groups]`` in the
            features' dtype; ``num_groups`` divides C.
        out: an array of the result's shape and dtype to write into, in the result's form.
        device: where to run (default: where device inputs live, else the selected device).
        queue: a ``pyopencl.CommandQueue`` to run on, instead of ``device``.
        variant: ``"optimized"`` (default) or ``"original"``, the one-work-item-per-(sample,
            channel) atomic design, kept as a benchmark baseline.
        config: the kernel's shape, an :class:`AggregationConfig` (default: from the device,
            :func:`default_config`).
        devices: several devices (or ``"all"``) that share the batch (bs), for host arrays
            (:mod:`clkernels.multi_device`).

    Returns:
        ``[bs, num_anchors, C]`` in the features' dtype: numpy for numpy inputs, else a device
        array on the inputs' context and queue.

    Raises:
        TypeError: an input of another dtype or form than above, or an ``out`` of the other
            form.
        ValueError: shapes that do not match each other (named in the message), an invalid
            (H, W) or scale start, a group count that does not divide C, sizes beyond 32-bit
            indexing, an unknown ``variant``, or a ``config`` the call cannot use.
        DeviceMemoryError: the output and uploaded inputs do not fit the device.

    Example::

        feat, shape, start = clkernels.feature_maps_format([level0, level1])
        out = clkernels.deformable_aggregation(feat, shape, start, locations, weights)
    """
    opts = (_tables(spatial_shape, scale_start_index), variant)
    if devices is not None:
        return multi_device.batched(
            "deformable_aggregation",
            lambda f, loc, w, out, device: FORWARD((f, loc, w), opts, config, out=out, device=device)[0],
            (mc_ms_feat, sampling_location, weights), devices, out, device=device, queue=queue)
    return FORWARD((mc_ms_feat, sampling_location, weights), opts, config,
                   out=out, device=device, queue=queue)[0]


def deformable_aggregation_backward(grad_out, mc_ms_feat, spatial_shape, scale_start_index,
                                    sampling_location, weights, *, out=None, device=None, queue=None,
                                    variant: str = "optimized", config: Optional[AggregationConfig] = None,
                                    devices=None):
    """Gradients ``(g_feat, g_loc, g_w)`` of ``sum(grad_out * deformable_aggregation(...))``
    with respect to ``mc_ms_feat``, ``sampling_location`` and ``weights``.

    Samples outside (0, 1), NaN included, get zero gradient; the location gradient carries
    each scale's W (for x) and H (for y) factor. On GPUs the feature gradient is summed with
    float atomics by default (its last bits may vary from run to run);
    ``AggregationConfig(feature_grad="gather")`` sums it in one order instead, as CPUs do.

    Args:
        grad_out: ``[bs, num_anchors, C]``, the gradient of the forward's output, in its dtype.
        mc_ms_feat: the forward's features.
        spatial_shape: the forward's ``[num_cams, num_scale, 2]`` (H, W) table, numpy.
        scale_start_index: the forward's ``[num_cams, num_scale]`` table, numpy.
        sampling_location: the forward's locations.
        weights: the forward's weights.
        out: a tuple of three arrays (or None entries) to write ``g_feat``, ``g_loc`` and
            ``g_w`` into, in the results' form; or None.
        device: where to run, as in :func:`deformable_aggregation`.
        queue: a ``pyopencl.CommandQueue`` to run on, instead of ``device``.
        variant: as in :func:`deformable_aggregation`.
        config: an :class:`AggregationConfig` (default: from the device, :func:`default_config`
            with ``direction="backward"``).
        devices: as in :func:`deformable_aggregation`; each device's part is summed apart, so
            the bits may differ from one device's by rounding.

    Returns:
        ``(g_feat, g_loc, g_w)`` shaped and typed like ``mc_ms_feat``, ``sampling_location``
        and ``weights``: numpy for numpy inputs, else device arrays.

    Raises:
        TypeError, ValueError, DeviceMemoryError: as :func:`deformable_aggregation`, and a
            ``grad_out`` whose shape or dtype is not the forward output's.
    """
    opts = (_tables(spatial_shape, scale_start_index), variant)
    if devices is not None:
        return multi_device.batched(
            "deformable_aggregation_backward",
            lambda g, f, loc, w, out, device: BACKWARD((f, loc, w, g), opts, config, out=out, device=device),
            (grad_out, mc_ms_feat, sampling_location, weights), devices, out, n_outputs=3,
            device=device, queue=queue)
    return BACKWARD((mc_ms_feat, sampling_location, weights, grad_out), opts, config,
                    out=out, device=device, queue=queue)


# ----------------------------------------------------------------------------- PyTorch

_NAMES = ("mc_ms_feat", "spatial_shape", "scale_start_index", "sampling_location", "weights")


def _torch_function():
    return torch_autograd.autograd_function(
        "DeformableAggregationFunction", deformable_aggregation, deformable_aggregation_backward,
        (True, False, False, True, True))


def deformable_aggregation_torch(mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights, *,
                                 out=None, allow_host_copy=False):
    """:func:`deformable_aggregation` on torch tensors, differentiable with ``torch.autograd``: CPU
    tensors, or CUDA tensors on the OpenCL device of their GPU with a CUDA result (as
    :func:`clkernels.torch_dcnv4`; ``allow_host_copy`` and ``out``, not differentiable, likewise)."""
    tensors = (mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights)
    return torch_autograd.apply(_torch_function(), tensors, {}, "deformable_aggregation_torch", _NAMES,
                                allow_host_copy, out=out)


def __getattr__(name):
    if name == "DeformableAggregationFunction":  # defined on first use: torch is optional
        return _torch_function()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
