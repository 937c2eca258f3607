"""DCNv4 deformable convolution (Xiong et al., "Efficient Deformable ConvNets", CVPR 2024).

The same math as the official CUDA operator (OpenGVLab/DCNv4, softmax off), on any OpenCL
device, for any kernel size, stride, padding, dilation, group count, channel count and
batch size::

    out = dcnv4(input, offset_mask, kernel_h=3, kernel_w=3, stride_h=1, stride_w=1,
                pad_h=1, pad_w=1, dilation_h=1, dilation_w=1, group=4, group_channels=32,
                offset_scale=1.0, remove_center=False)
    g_input, g_offset_mask = dcnv4_backward(grad_out, input, offset_mask, ...same options)

- ``input`` ``[N, H, W, G*C]`` (channels last); ``offset_mask`` ``[N, H_out, W_out, P]``,
  P >= G*K*3 (the official layout pads it to ceil(G*K*3/8)*8; the tail is ignored). Per
  group g the block at g*K*3 holds K interleaved (dx, dy) pairs, then K mask values, used
  raw (no softmax). K = kernel_h*kernel_w, minus one under ``remove_center``.
- Tap (i along the width, j along the height; i outer) of output (y, x) samples
  w = x*stride_w - pad_w + half_w + (i*dil_w - half_w + dx)*offset_scale with
  half_w = dil_w*(kernel_w-1)//2, likewise h; it counts when -1 < h < H and -1 < w < W
  (NaN never does); corners outside the input read as zero.
- float32, float16 or bfloat16 (``ml_dtypes.bfloat16``) storage, float arithmetic. numpy in, numpy out; pyopencl arrays in,
  device arrays out. The backward is deterministic by default, the same bits on every run: on
  GPUs each input pixel gathers the taps that land near it (taps far from their nominal place
  are summed in 64-bit fixed point; see the template), on CPUs one work-item owns each slice of
  the input gradient. ``deterministic=False`` allows float atomics on GPUs without 64-bit
  atomics; where the gather runs it is the faster (H100 and H200) and serves both.

The kernel's speed switches are those of the paper's ablation (its Table 10): channels per
work-item, bilinear coefficients reused across them, vector width, storage type. They are
chosen from the device unless a :class:`DCNv4Config` is given; :data:`LADDER` lists the
paper's rungs for ``benchmarks/bench_dcnv4.py``. :func:`torch_dcnv4` is an autograd wrapper
for CPU torch tensors (torch is imported only when it is used).
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Optional

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from . import arrays, autotune, config_check, dtypes, launch, multi_device, torch_autograd
from .launch import In, Out, Tmp
from .templates import BuildError, Storage

__all__ = ["dcnv4", "dcnv4_backward", "DCNv4Options", "DCNv4Config", "LADDER", "offset_mask_channels",
           "forward_config", "backward_config", "float_atomics_config", "enqueue_forward", "enqueue_backward",
           "used_ptx", "torch_dcnv4"]

TEMPLATE = "clkernels/dcnv4.cl.mako"
DTYPES = (np.float32, np.float16, dtypes.BFLOAT16)
_INT_LIMIT = 2 ** 31 - 1  # kernels index with int


@dataclasses.dataclass(frozen=True)
class DCNv4Options:
    """The operator's geometry (the official operator's arguments, softmax off)."""
    kernel_h: int = 3
    kernel_w: int = 3
    stride_h: int = 1
    stride_w: int = 1
    pad_h: int = 1
    pad_w: int = 1
    dilation_h: int = 1
    dilation_w: int = 1
    group: int = 4
    group_channels: int = 32
    offset_scale: float = 1.0
    remove_center: bool = False

    def __post_init__(self):
        for name in ("kernel_h", "kernel_w", "stride_h", "stride_w", "dilation_h", "dilation_w",
                     "group", "group_channels", "pad_h", "pad_w"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < (0 if name.startswith("pad") else 1):
                raise ValueError(f"{name} must be >= {0 if name.startswith('pad') else 1}, got {value}")
        if not math.isfinite(float(self.offset_scale)):
            raise ValueError(f"offset_scale must be finite, got {self.offset_scale}")
        if self.taps < 1:
            raise ValueError("remove_center=True with a 1x1 kernel leaves no tap; use a larger kernel")

    @property
    def taps(self) -> int:
        """K: sampling points per group."""
        return self.kernel_h * self.kernel_w - (1 if self.remove_center else 0)

    def out_size(self, H: int, W: int):
        """(H_out, W_out), or ValueError naming the arguments when either is < 1."""
        ho = (H + 2 * self.pad_h - (self.dilation_h * (self.kernel_h - 1) + 1)) // self.stride_h + 1
        wo = (W + 2 * self.pad_w - (self.dilation_w * (self.kernel_w - 1) + 1)) // self.stride_w + 1
        if ho < 1 or wo < 1:
            raise ValueError(
                f"output size would be {ho}x{wo} for input {H}x{W} with kernel "
                f"{self.kernel_h}x{self.kernel_w}, pad ({self.pad_h}, {self.pad_w}), dilation "
                f"({self.dilation_h}, {self.dilation_w}), stride ({self.stride_h}, {self.stride_w}): "
                "increase pad_h/pad_w or reduce kernel_h/kernel_w or dilation")
        return ho, wo


def offset_mask_channels(group: int, kernel_h: int = 3, kernel_w: int = 3,
                         remove_center: bool = False) -> int:
    """P of the official layout: G*K*3 rounded up to a multiple of 8."""
    k = kernel_h * kernel_w - (1 if remove_center else 0)
    return -(-group * k * 3 // 8) * 8


@dataclasses.dataclass(frozen=True)
class DCNv4Config:
    """The speed switches of the paper's ablation. ``work_group_size`` 0: from the device.
    ``scatter`` (backward only): "gather" (deterministic, GPUs: the input pixels gather the
    taps near them, farther taps are summed in 64-bit fixed point), "fixed" (everything in
    fixed point, deterministic), "atomic" (float atomics, the last bits vary from run to run),
    "owner" (no atomics, deterministic: CPUs), "" from the device and ``deterministic``.
    ``gather_channels`` ("gather" only): channels per work-item of the kernel that gathers the
    input gradient (a multiple of ``vector_width`` dividing group_channels); 0: from the
    device. ``gather_margin``
    ("gather" only): taps landing within this many whole pixels of their nominal place (zero
    offset) are gathered, farther ones summed in fixed point; offsets in [-1, 1] at
    offset_scale 1 are all within 1. ``interleave`` (forward; backward but "owner"): the work-items sharing a
    (pixel, group) take its channels in turns of ``vector_width`` (work-item s reads chunks
    s, s + slots, ...) rather than each a contiguous run, so one load instruction of theirs
    reads one contiguous run of memory; the results are the same bits either way.
    ``prefetch``: loads issued ahead of their use, all in flight together: a (pixel, group)'s
    offsets and masks before the unrolled tap loop (forward and the scattering backward), and
    the gather's tap codes of a tap's candidates before it visits them; the same bits.
    ``tile_rows`` x ``tile_cols`` (forward only; both 0, the default: pixels in rows): the
    work-items take the output pixels in tiles of that many rows and columns, so that a
    work-group's pixels are neighbours in both directions and more of their taps read the same
    cache lines; the same bits. No device default uses tiles (not yet measured on a GPU:
    ``benchmarks/bench_dcnv4.py --sections tiles`` does); :mod:`clkernels.autotune` measures them
    among its candidates."""
    channels_per_item: int
    vector_width: int
    reuse: bool = True
    work_group_size: int = 0
    scatter: str = ""
    gather_channels: int = 0
    gather_margin: int = 1
    interleave: bool = False
    prefetch: bool = False
    tile_rows: int = 0
    tile_cols: int = 0

    def __post_init__(self):
        # What depends on the call (channels dividing group_channels, the device's limits) is
        # checked when a plan is made; what no call could accept, here.
        name = "DCNv4Config"
        config_check.integer(name, "channels_per_item", self.channels_per_item)
        config_check.integer(name, "vector_width", self.vector_width, allowed=(1, 2, 4, 8, 16))
        config_check.boolean(name, "reuse", self.reuse)
        config_check.integer(name, "work_group_size", self.work_group_size, minimum=0,
                             meaning=" (0: chosen from the device)")
        config_check.choice(name, "scatter", self.scatter, ("", "gather", "fixed", "atomic", "owner"))
        config_check.integer(name, "gather_channels", self.gather_channels, minimum=0,
                             meaning=" (0: chosen from the device)")
        config_check.integer(name, "gather_margin", self.gather_margin, minimum=0)
        config_check.boolean(name, "interleave", self.interleave)
        config_check.boolean(name, "prefetch", self.prefetch)
        config_check.integer(name, "tile_rows", self.tile_rows, minimum=0, meaning=" (0: rows of pixels)")
        config_check.integer(name, "tile_cols", self.tile_cols, minimum=0, meaning=" (0: rows of pixels)")
        if (self.tile_rows == 0) != (self.tile_cols == 0):
            raise ValueError(f"DCNv4Config: tile_rows={self.tile_rows} and tile_cols={self.tile_cols} "
                             "must both be 0 (pixels in rows) or both at least 1 (tiles of pixels)")


# The paper's Table 10 rungs, in order (A100, N=64, 56x56, 128 channels, G=4: 1.45, 1.53,
# 1.51, 0.606 ms; then the last rung with float16 storage: 0.404 ms).
LADDER = (
    ("DCNv3-style (1 channel per work-item)", DCNv4Config(1, 1, reuse=False)),
    ("8 channels per work-item", DCNv4Config(8, 1, reuse=False)),
    ("+ bilinear coefficients reused", DCNv4Config(8, 1, reuse=True)),
    ("+ vector loads and stores", DCNv4Config(8, 8, reuse=True)),
)


def _largest_divisor(c: int, candidates) -> int:
    return next(v for v in candidates if c % v == 0)


# GPU work-items per compute unit below which a float32 forward spreads a group's channels
# over more work-items (see forward_config).
_FEW_ITEMS_PER_CU = 4 * 2048


def forward_config(info, group_channels: int, dtype, pixel_groups: int = 0, taps: int = 9) -> DCNv4Config:
    """Channels per work-item from the device: GPUs take 8 (one 32- or 16-byte vector load
    per corner, the official choice); CPUs a whole group's channels in vectors of 8, so
    each work-item amortises its coefficients over more loads (measured faster on PoCL).
    ``pixel_groups`` (output pixels times groups), when given, lets a small float32 problem
    on a GPU with at most 16 channels per group (where it was measured) use 4 channels per
    work-item instead, for more work-items in flight. float32 on GPUs with at most ``taps``
    9 (a 3x3 kernel, where it was measured) prefetches the offsets and masks, and from 64
    channels per group interleaves the work-items' channels in 16-byte chunks."""
    vw = _largest_divisor(group_channels, (8, 4, 2, 1))
    if info.is_cpu:
        return DCNv4Config(group_channels if group_channels <= 64 else vw, vw, True, 0)
    if np.dtype(dtype).itemsize == 2 and group_channels % 16 == 0:
        # Half (and bfloat16) storage: 16 channels (two 16-byte loads per corner) per work-item measured
        # 1.35x faster than 8 on an H200 at the paper's shape, and fastest at N=1 200x320 too.
        # Neither prefetch nor interleave paid there (H100: 0.17-0.19 against 0.17 ms).
        return DCNv4Config(16, 8, True, 0)
    # H100, kernel events, float32 (a sweep like bench_dcnv4.py --sections loads): prefetch
    # 0.276 against 0.299 ms at the paper's shape, 0.055 against 0.062 ms at N=1 200x320;
    # with 64 channels per group, interleaved 16-byte chunks too, 0.118 against 0.148 ms.
    # 16-bit storage lost with prefetch (its 27 values converted to floats in registers).
    prefetch = taps <= 9 and np.dtype(dtype).itemsize == 4
    if vw == 8 and group_channels <= 16 and pixel_groups and \
            pixel_groups * group_channels // 8 < _FEW_ITEMS_PER_CU * info.compute_units:
        # H200, N=1 200x320, G=4, C=16 (512k work-items at 8 channels, under two waves):
        # 4 channels per work-item took 57.6 us against 70.2 us; from N=64 28x28 up, 8 stays
        # fastest (benchmarks/bench_dcnv4.py, tuning).
        return DCNv4Config(4, 4, True, 0, prefetch=prefetch)
    if vw == 8 and group_channels >= 64 and prefetch:
        return DCNv4Config(8, 4, True, 0, interleave=True, prefetch=True)
    return DCNv4Config(vw, vw, True, 0, prefetch=prefetch)


def backward_config(info, group_channels: int, dtype, batch: int = 1, group: int = 1,
                    deterministic: bool = True, taps: int = 9) -> DCNv4Config:
    """GPUs: the "gather" (input pixels gather the taps near them; far taps in 64-bit fixed
    point), which needs 64-bit atomics, whether ``deterministic`` or not (the faster there); a
    GPU without them gets the "owner" scatter, or with ``deterministic=False`` float atomics
    (:func:`float_atomics_config`). CPUs: the atomic-free "owner" scatter (deterministic as
    well) with channel runs as wide as still gives every core two work-items. The gather
    prefetches in float32 with at most ``taps`` 9 (a 3x3 kernel, where it was measured)."""
    # deterministic=False takes the gather too where it runs: float atomics were slower at every
    # as-called shape and storage type on the H100 and the H200 (H100, float32: 2.73 against
    # 1.64 ms at the paper's shape, 1.35 against 0.85, 0.59 against 0.45 ms at N=1 200x320;
    # benchmarks/results/bench_dcnv4-as-called-h100-far-marks.md).
    if not info.is_cpu and info.int64_atomics:
        # The gather: its first kernel (offset and mask gradients) reads like the forward, so
        # vector loads pay. H200, kernel events at the three as-called shapes: at least 4
        # work-items share a group's channels in float32 (8 channels per work-item at 32 and
        # 64 channels per group, 4 at 16), 2 with 16-bit storage (16 at 32 and 64, 8 at 16:
        # 1.39 against 1.51 ms at the paper's shape, 0.33 against 0.39 ms at N=1 200x320).
        itemsize = np.dtype(dtype).itemsize
        share, widths = (2, (16, 8, 4, 2, 1)) if itemsize == 2 else (4, (8, 4, 2, 1))
        cpw = _largest_divisor(group_channels, tuple(v for v in widths if share * v <= group_channels) or (1,))
        vw = _largest_divisor(cpw, (8, 4, 2, 1))
        # Prefetch (offsets and masks ahead of the first kernel's taps, the tap codes ahead of
        # the gather's candidates), H200 kernel events of the whole backward in float32:
        # 1.62 against 1.76 ms at the paper's shape, 0.78 against 0.86 ms at N=64 28x28 C=64,
        # 0.373 against 0.388 ms at N=1 200x320 C=16; with 16-bit storage 0.84-0.91x at the
        # first two, 1.03-1.05x at the third (benchmarks/results/bench_dcnv4-loads-nvidia-full.md).
        prefetch = itemsize == 4 and taps <= 9
        return DCNv4Config(cpw, vw, True, 0, "gather", gather_channels=_gather_channels(group_channels, vw, itemsize),
                           prefetch=prefetch)
    if not info.is_cpu and not deterministic:
        return float_atomics_config(group_channels)
    vw = _largest_divisor(group_channels, (8, 4, 2, 1))
    runs = [d for d in range(group_channels, 0, -vw) if group_channels % d == 0]
    cpw = next((d for d in runs if batch * group * (group_channels // d) >= 2 * info.compute_units),
               runs[-1])
    return DCNv4Config(cpw, vw, True, 0, "owner")


def float_atomics_config(group_channels: int) -> DCNv4Config:
    """The float-atomics backward ("atomic") on GPUs: 2 channels per work-item, 1.5x faster than
    1 on an H200 at the paper's shape. The default only with ``deterministic=False`` on GPUs
    without 64-bit atomics; elsewhere for comparisons (benchmarks/bench_dcnv4.py)."""
    cpw = 2 if group_channels % 2 == 0 else 1
    return DCNv4Config(cpw, cpw, True, 0, "atomic")


_ptx_refused: dict = {}  # device -> the build log, when its compiler refused inline PTX


def _program(rt, info, direction, dtype, opts: DCNv4Options, cfg: DCNv4Config, slots_p2=1, scatter="",
             gather_cpw=0, weights=False):
    """Render + build; on NVIDIA try the inline-PTX variant first, and fall back to the
    portable one (remembered per device) if the driver refuses it."""
    params = dict(direction=direction, info=info, st=Storage(dtype), scatter=scatter,
                  margin=cfg.gather_margin, gather_cpw=gather_cpw, weights=bool(weights),
                  group=opts.group, channels=opts.group_channels, kernel_h=opts.kernel_h,
                  kernel_w=opts.kernel_w, remove_center=bool(opts.remove_center),
                  cpw=cfg.channels_per_item, vw=cfg.vector_width, reuse=bool(cfg.reuse),
                  interleave=direction != "backward_owner" and bool(cfg.interleave),
                  prefetch=direction != "backward_owner" and bool(cfg.prefetch), slots_p2=slots_p2,
                  tile_rows=cfg.tile_rows if direction == "forward" else 0,
                  tile_cols=cfg.tile_cols if direction == "forward" else 0)
    key = rt.device.int_ptr
    if info.vendor == "nvidia" and key not in _ptx_refused:
        try:
            return launch.program(rt, TEMPLATE, ptx=True, **params)
        except BuildError as exc:
            _ptx_refused[key] = exc.log
            warnings.warn(f"dcnv4: {info.name} refused inline PTX; using portable half "
                          f"conversions and CAS atomics. Build log:\n{exc.log[:2000]}")
    return launch.program(rt, TEMPLATE, ptx=False, **params)


def used_ptx(runtime) -> bool:
    """Whether kernels on this runtime's device use the inline-PTX paths."""
    return runtime.info.vendor == "nvidia" and runtime.device.int_ptr not in _ptx_refused


def _check_config(cfg: DCNv4Config, opts: DCNv4Options, dtype, runtime) -> DCNv4Config:
    c, cpw, vw = opts.group_channels, cfg.channels_per_item, cfg.vector_width
    if cpw < 1 or c % cpw:
        raise ValueError(f"config.channels_per_item={cpw} must divide group_channels={c}")
    if vw not in (1, 2, 4, 8, 16) or cpw % vw:
        raise ValueError(f"config.vector_width={vw} must be 1, 2, 4, 8 or 16 and divide "
                         f"channels_per_item={cpw}")
    widest = runtime.info.widest_vector("float")
    if widest is not None and vw > widest:
        # Wider than the CPU compiler's target: PoCL 3.0 on an AVX-2 target aborts the process on
        # a 16-wide half conversion, so such vectors are refused up front.
        raise ValueError(f"config.vector_width={vw}: this CPU device compiles vectors of at most "
                         f"{widest} floats; use a vector_width up to that")
    if vw * np.dtype(dtype).itemsize * 8 > runtime.device.mem_base_addr_align:
        raise ValueError(f"config.vector_width={vw} exceeds the buffer alignment of "
                         f"{runtime.info.name}; use a smaller vector_width")
    return cfg


def _geometry(input, offset_mask, opts: DCNv4Options, grad_out=None):
    """Check the arrays' shapes against the options (their dtypes are checked already);
    returns (N, H, W, H_out, W_out, P)."""
    n, h, w, ch = (int(s) for s in input.shape)
    if h < 1 or w < 1:
        raise ValueError(f"input has shape {tuple(input.shape)}: height and width (axes 1, 2) "
                         "must be at least 1 (layout [N, H, W, group*group_channels])")
    if ch != opts.group * opts.group_channels:
        raise ValueError(f"input has {ch} channels but group*group_channels = {opts.group}*"
                         f"{opts.group_channels} = {opts.group * opts.group_channels}; "
                         "set group/group_channels to match input.shape[3]")
    ho, wo = opts.out_size(h, w)
    if tuple(offset_mask.shape[:3]) != (n, ho, wo):
        raise ValueError(f"offset_mask has shape {tuple(offset_mask.shape)}, expected "
                         f"({n}, {ho}, {wo}, *)")
    p = int(offset_mask.shape[3])
    need = opts.group * opts.taps * 3
    if p < need:
        raise ValueError(f"offset_mask has {p} channels, too few for group*K*3 = {opts.group}*"
                         f"{opts.taps}*3 = {need}; the official layout uses "
                         f"{offset_mask_channels(opts.group, opts.kernel_h, opts.kernel_w, opts.remove_center)}")
    if grad_out is not None and tuple(grad_out.shape) != (n, ho, wo, ch):
        raise ValueError(f"grad_out has shape {tuple(grad_out.shape)}, expected {(n, ho, wo, ch)}")
    for name, size in (("input", n * h * w * ch), ("offset_mask", n * ho * wo * p),
                       ("output", n * ho * wo * ch)):
        if size > _INT_LIMIT // 2:  # index arithmetic stays in int with headroom
            raise ValueError(f"{name} has {size} elements, more than these kernels index "
                             f"(2^30); split the batch")
    return n, h, w, ho, wo, p


def _geometry_args(opts: DCNv4Options, h, w, ho, wo, p):
    i32 = np.int32
    return (i32(h), i32(w), i32(ho), i32(wo), i32(p), i32(opts.stride_h), i32(opts.stride_w),
            i32(opts.pad_h), i32(opts.pad_w), i32(opts.dilation_h), i32(opts.dilation_w),
            np.float32(opts.offset_scale))


def _work_group(rt, kernel, cfg: DCNv4Config, wanted: int) -> int:
    """The config's work-group size, checked against this kernel on this device (registers
    bound it below the device's maximum), or one from the device."""
    limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, rt.device)
    wg = cfg.work_group_size or arrays.work_group_size(rt, kernel, wanted)
    if wg > limit:
        raise ValueError(f"config.work_group_size={wg} exceeds this kernel's limit of {limit} "
                         f"work-items on {rt.info.name}; use a smaller size or leave it 0")
    return wg


def _split_options(options):
    """Plan options: the forward's DCNv4Options or the backward's (DCNv4Options, deterministic),
    or either paired with a DeviceInfo, (options, info), when a test pretends a vendor."""
    if isinstance(options, DCNv4Options) or (len(options) == 2 and isinstance(options[1], bool)):
        return options, None
    return options


def _forward_plan(rt, args, options, config) -> launch.LaunchPlan:
    opts, info = _split_options(options)
    info = info or rt.info
    input, offset_mask = args
    n, h, w, ho, wo, p = _geometry(input, offset_mask, opts)
    out = launch.Buffer("out", (n, ho, wo, input.shape[3]), input.dtype)
    if out.size == 0:
        return launch.LaunchPlan([out])
    geometry = (n, h, w, ho, wo, p)
    cfg = config
    if cfg is None:
        cfg = forward_config(info, opts.group_channels, input.dtype, n * ho * wo * opts.group, opts.taps)
        if info is rt.info:     # (not where a test pretends another device)
            cfg = autotune.choose(rt, "dcnv4_forward", (np.dtype(input.dtype).name, opts, geometry), cfg,
                                  lambda: forward_candidates(info, opts.group_channels, input.dtype, cfg),
                                  _forward_timer(rt, info, args, opts, geometry, out.nbytes))
    cfg = _check_config(cfg, opts, input.dtype, rt)
    return launch.LaunchPlan([out], [_forward_step(rt, info, input.dtype, opts, cfg, geometry)])


def _forward_step(rt, info, dtype, opts: DCNv4Options, cfg: DCNv4Config, geometry) -> launch.Step:
    """The forward's one launch with ``cfg`` (checked) at ``geometry`` (N, H, W, H_out, W_out, P)."""
    n, h, w, ho, wo, p = geometry
    kernel = launch.kernel_for_plan(_program(rt, info, "forward", dtype, opts, cfg), "dcnv4_forward")
    pixels = n * ho * wo
    if cfg.tile_rows:   # whole tiles, the items past the output's edges idle
        pixels = n * -(-ho // cfg.tile_rows) * cfg.tile_rows * -(-wo // cfg.tile_cols) * cfg.tile_cols
    items = pixels * opts.group * (opts.group_channels // cfg.channels_per_item)
    if items > _INT_LIMIT // 2:
        raise ValueError(f"config.tile_rows={cfg.tile_rows}, tile_cols={cfg.tile_cols}: {items} work-items, "
                         "more than the kernel indexes; use smaller tiles or split the batch")
    wg = _work_group(rt, kernel, cfg, 64 if info.is_cpu else 256)
    return launch.step(kernel, (arrays.round_up(items, wg),), (wg,),
                       [In(0), In(1), Out(0), np.int32(items), *_geometry_args(opts, h, w, ho, wo, p)])


def forward_candidates(info, group_channels: int, dtype, default: DCNv4Config) -> list:
    """What :mod:`clkernels.autotune` measures beside ``default`` for the forward: pixels in rows
    or in tiles of 2x8, 4x8 and 8x8, in work-groups of two sizes; with 16-bit storage on GPUs
    also 8 and 32 channels per work-item (where they divide the group's), which the per-vendor
    defaults trade against each other. Every candidate gives the default's bits."""
    sizes = (32, 64) if info.is_cpu else (128, 256)
    tiles = ((0, 0), (2, 8)) if info.is_cpu else ((0, 0), (2, 8), (4, 8), (8, 8))
    out = [dataclasses.replace(default, tile_rows=r, tile_cols=c, work_group_size=wg)
           for r, c in tiles for wg in sizes]
    if not info.is_cpu and np.dtype(dtype).itemsize == 2:
        for cpw in (8, 32):
            if group_channels % cpw == 0 and cpw != default.channels_per_item:
                other = dataclasses.replace(default, channels_per_item=cpw, vector_width=8, interleave=False)
                out += [dataclasses.replace(other, tile_rows=r, tile_cols=c, work_group_size=256)
                        for r, c in ((0, 0), (4, 8))]
    return out


def _forward_timer(rt, info, args, opts: DCNv4Options, geometry, out_bytes: int):
    """``candidate -> seconds`` on the call's own values (they set where the taps land, hence the
    speed): its device arrays, or copies of its host arrays made for the measuring; None where
    a device array is of another context or not a whole contiguous buffer (the call refuses it)."""
    if not all(not isinstance(a, cla.Array) or (a.context == rt.context and not a.offset and a.flags.c_contiguous)
               for a in args):
        return None
    ins = []
    scratch = []

    def seconds(cfg: DCNv4Config) -> float:
        cfg = _check_config(cfg, opts, args[0].dtype, rt)
        step = _forward_step(rt, info, args[0].dtype, opts, cfg, geometry)
        if not scratch:
            rt.queue.finish()               # the inputs' writes, on the call's queue
            flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
            ins.extend(a.base_data if isinstance(a, cla.Array) else
                       cl.Buffer(rt.context, flags, hostbuf=np.ascontiguousarray(a)) for a in args)
            scratch.append(cl.Buffer(rt.context, cl.mem_flags.READ_WRITE, max(out_bytes, 1)))
        queue = rt.profiled().queue
        return autotune.event_seconds(lambda: step.launch(queue, ([*ins], [scratch[0]], ()), None), queue)
    return seconds


# The backward's inputs, in its Op's parameter order.
GRAD_OUT, INPUT_, OFFSET_MASK = In(0), In(1), In(2)


def _backward_plan(rt, args, options, config) -> launch.LaunchPlan:
    opts, info = _split_options(options)
    info = info or rt.info
    grad_out, input, offset_mask = args
    opts, deterministic = opts
    n, h, w, ho, wo, p = _geometry(input, offset_mask, opts, grad_out)
    outputs = [launch.Buffer("g_input", input.shape, input.dtype),
               launch.Buffer("g_offset_mask", offset_mask.shape, offset_mask.dtype)]
    default = backward_config(info, opts.group_channels, input.dtype, n, opts.group, deterministic, opts.taps)
    cfg = _check_config(config or default, opts, input.dtype, rt)
    if n == 0:
        return launch.LaunchPlan(outputs)
    scatter = cfg.scatter or default.scatter
    if scatter == "owner":
        if cfg.interleave or cfg.prefetch:
            raise ValueError("config.interleave and config.prefetch do not apply to scatter='owner' "
                             "(each work-item owns contiguous channels and walks every pixel); leave "
                             "them False or pick another scatter")
        return _backward_owner_plan(rt, info, outputs, input, offset_mask, opts, cfg)
    if scatter in ("fixed", "gather") and not info.int64_atomics:
        raise ValueError(f"config.scatter={scatter!r} needs 64-bit atomics (cl_khr_int64_base_atomics), "
                         f"which {info.name} lacks; use scatter='owner' (deterministic) or 'atomic'")
    gather_cpw = 0
    # The gather's corner weights handed over by the first kernel, with 16-bit storage only.
    # H200, kernel events of the whole backward: float16 1.08 against 1.20 ms at the paper's
    # shape, 0.55 against 0.59 ms at N=64 28x28; float32 1.66 against 1.54 ms and 0.82 against
    # 0.75 ms there (both its kernels slower with them),
    # 0.353 against 0.372 ms at N=1 200x320 (one H200 run timing both versions by kernel events,
    # a script outside the repository; not a result file).
    weights = scatter == "gather" and Storage(input.dtype).narrow
    if scatter == "gather":
        gather_cpw = cfg.gather_channels or _gather_channels(opts.group_channels, cfg.vector_width,
                                                             np.dtype(input.dtype).itemsize)
        if opts.group_channels % gather_cpw or gather_cpw % cfg.vector_width:
            raise ValueError(f"config.gather_channels={gather_cpw} must divide group_channels="
                             f"{opts.group_channels} and be a multiple of vector_width={cfg.vector_width}")
        if cfg.gather_margin > 7:
            raise ValueError(f"config.gather_margin={cfg.gather_margin}: the gather takes margins up to 7 "
                             "(a tap's place is kept in 4 bits per axis); larger offsets are summed in "
                             "fixed point, so use 7 or less, or scatter='fixed'")
    while True:
        slots_p2 = 1 << (opts.group_channels // cfg.channels_per_item - 1).bit_length()
        program = _program(rt, info, "backward", input.dtype, opts, cfg, slots_p2, scatter, gather_cpw, weights)
        kernel = launch.kernel_for_plan(program, "dcnv4_backward")
        # 64 for the gather's first kernel on GPUs (H200: 1.87 against 2.00 ms at the paper's
        # shape in float32, 0.91 against 0.96 ms at N=64 28x28), 256 for the float atomics.
        wanted = 64 if info.is_cpu or scatter == "gather" else 256
        wg = _work_group(rt, kernel, cfg, max(slots_p2, wanted))
        if wg % slots_p2 == 0:
            break
        if cfg.work_group_size:
            raise ValueError(f"config.work_group_size={wg} must be a multiple of {slots_p2}, "
                             "the work-items that share one (pixel, group)")
        # The device cannot hold a group's slots in one work-group: wider work-items.
        cpw = next(d for d in range(cfg.channels_per_item + 1, opts.group_channels + 1)
                   if opts.group_channels % d == 0)
        cfg = dataclasses.replace(cfg, channels_per_item=cpw,
                                  vector_width=math.gcd(cpw, cfg.vector_width))
    pix_groups = n * ho * wo * opts.group
    local = (cl.LocalMemory(2 * 3 * wg * 4),) if slots_p2 > 1 else ()
    temps, steps, codes = [], [], ()
    if scatter in ("fixed", "gather"):
        # The input gradient as 64-bit fixed-point sums (common.cl.mako's fixed_point), then
        # converted to its storage: see _fixed_point_steps. "gather": only the taps far from
        # their nominal place, added by the far kernels after the first; the gathering kernel
        # adds the rest and converts.
        marks, n_marks = None, n * h * w * opts.group
        if scatter == "gather":
            # A uint per (input pixel, group) that a far tap reaches (the template's far_zero).
            temps.append(launch.Buffer("far_marks", (n_marks,), np.uint32))
            marks = Tmp(len(temps) - 1)
        acc, to_storage = _fixed_point_steps(rt, program, outputs[0], grad_out, pix_groups, p,
                                             ho * wo * opts.taps, temps, steps, scatter == "fixed",
                                             marks, n_marks)
        if scatter == "gather":
            # A byte per tap from the first kernel: where it landed (see the template's tap_codes),
            # and 8 bytes past the last that the gather's word loads may read (CODES_TAIL).
            temps.append(launch.Buffer("tap_codes", (pix_groups * opts.taps + 8,), np.uint8))
            # A near tap's four mask * weight products for the gather (the template's tap_weights).
            codes = (Tmp(len(temps) - 1),)
            if weights:
                temps.append(launch.Buffer("tap_weights", (pix_groups * opts.taps, 4), np.float32))
                codes += (Tmp(len(temps) - 1),)
            sums, side, bound, terms_log2 = acc
            acc = (marks,)
            geometry = _geometry_args(opts, h, w, ho, wo, p)
            zero = launch.kernel_for_plan(program, "far_zero")
            zwg = arrays.work_group_size(rt, zero, 256)
            far = launch.kernel_for_plan(program, "dcnv4_far_input")
            fwg = arrays.work_group_size(rt, far, 128)
            far_items = pix_groups * (opts.group_channels // cfg.channels_per_item)
            gather = launch.kernel_for_plan(program, "dcnv4_gather_input")
            items = n * h * w * opts.group * (opts.group_channels // gather_cpw)
            gwg = arrays.work_group_size(rt, gather, 256)
            to_storage = [launch.step(zero, (arrays.round_up(n_marks, zwg),), (zwg,),
                                      [marks, sums, side, bound, np.int32(n_marks)]),
                          launch.step(far, (arrays.round_up(far_items, fwg),), (fwg,),
                                      [OFFSET_MASK, codes[0], GRAD_OUT, sums, side, bound, terms_log2,
                                       np.int32(pix_groups), *geometry]),
                          launch.step(gather, (arrays.round_up(items, gwg),), (gwg,),
                                      [OFFSET_MASK, *codes[1:], codes[0], GRAD_OUT, sums, side, bound, terms_log2, marks,
                                       Out(0), np.int32(items), *geometry])]
    else:
        # Float atomics in float32: in the output itself for float32, else in a temporary
        # converted to its 16-bit storage at the end.
        acc, to_storage = launch.accumulator(rt, input.dtype, outputs[0], 0, temps, steps)
        acc, to_storage = (acc,), [to_storage] if to_storage is not None else []
    steps.append(launch.step(kernel, (arrays.round_up(pix_groups * slots_p2, wg),), (wg,),
                             [INPUT_, OFFSET_MASK, GRAD_OUT, *acc, Out(1), *codes, np.int32(pix_groups),
                              *_geometry_args(opts, h, w, ho, wo, p), *local]))
    steps += to_storage
    return launch.LaunchPlan(outputs, steps, temps)


def _gather_channels(group_channels: int, vector_width: int, itemsize: int = 4) -> int:
    """Channels per work-item of the gathering kernel, each work-item finding its taps once for
    all its channels: up to 16 in float32, 32 with 16-bit storage (H200, kernel events of the
    whole backward: float32 1.87 against 2.12 ms with 32 at the paper's shape, 0.91 against
    1.06 ms at N=64 28x28; float16 1.39 against 1.53 ms with 16 at the paper's shape)."""
    widest = 32 if itemsize == 2 else 16
    return next(d for d in range(min(group_channels, widest), 0, -1)
                if group_channels % d == 0 and d % vector_width == 0)


def _fixed_point_steps(rt, program, g_input: launch.Buffer, grad_out, pix_groups: int, p: int,
                       taps_per_image: int, temps: list, steps: list, convert: bool = True,
                       marks: Optional[Tmp] = None, n_marks: int = 0):
    """The deterministic scatter's steps before the backward kernel (appended to ``steps``),
    its temporaries (to ``temps``), the backward kernel's accumulator arguments, and the steps
    after it. The bound kernel finds the scale and zeroes the sums; the side buffer for
    non-finite terms is the float32 output itself, or a float32 temporary for 16-bit storage,
    zeroed only when needed; the last step converts sums (and side) into the output (none with
    ``convert=False``: the gather converts them itself). ``marks``: the gather's far marks
    (``n_marks`` uints), which the bound kernel zeroes instead of the sums (the template's
    far_zero then zeroes the marked pixels' sums and side entries alone, so no fill of the
    side buffer)."""
    terms_log2 = (taps_per_image - 1).bit_length()   # 2^terms_log2 >= taps adding to one sum
    size = g_input.size
    temps += [launch.Buffer("g_input_fixed", g_input.shape, np.int64), launch.Buffer("bound", (4,), np.uint32)]
    sums, bound = Tmp(len(temps) - 2), Tmp(len(temps) - 1)
    if Storage(g_input.dtype).narrow:
        temps.append(launch.Buffer("g_input_side", g_input.shape, np.float32))
        side = Tmp(len(temps) - 1)
    else:
        side = Out(0)
    steps.append(launch.ZeroStep(rt, launch.TEMP, bound.position, temps[bound.position]))
    k_bound = launch.kernel_for_plan(program, "fixed_bound")
    wg = arrays.work_group_size(rt, k_bound, 256)
    # Enough work-groups to fill the device; each loops over its share.
    spread = arrays.round_up(min(max(int(grad_out.size), size), rt.info.compute_units * 8 * wg), wg)
    steps.append(launch.step(k_bound, (spread,), (wg,),
                             [GRAD_OUT, np.int32(grad_out.size), OFFSET_MASK, np.int32(pix_groups),
                              np.int32(p), bound, *((sums, np.int32(size)) if marks is None
                                                    else (marks, np.int32(n_marks))),
                              cl.LocalMemory(3 * 4 * wg)]))
    if marks is None:
        k_fill = launch.kernel_for_plan(program, "fixed_side_fill")
        wg = arrays.work_group_size(rt, k_fill, 256)
        steps.append(launch.step(k_fill, (arrays.round_up(min(size, rt.info.compute_units * 4 * wg), wg),),
                                 (wg,), [bound, side, np.int32(size)]))
    acc = (sums, side, bound, np.int32(terms_log2))
    if not convert:
        return acc, []
    k_conv = launch.kernel_for_plan(program, "fixed_to_storage")
    wg = arrays.work_group_size(rt, k_conv, 256)
    return acc, [launch.step(k_conv, (arrays.round_up(size, wg),), (wg,),
                             [sums, bound, side, Out(0), np.int32(size), np.int32(terms_log2)])]


def _backward_owner_plan(rt, info, outputs, input, offset_mask, opts: DCNv4Options, cfg: DCNv4Config):
    n, h, w, ho, wo, p = (int(s) for s in (*input.shape[:3], *offset_mask.shape[1:]))
    slots = opts.group_channels // cfg.channels_per_item
    program = _program(rt, info, "backward_owner", input.dtype, opts, cfg)
    narrow = Storage(input.dtype).narrow
    # Each work-item zeroes its own slice of the float32 accumulator; for 16-bit storage the
    # kernel also writes the converted gradient.
    temps = [launch.Buffer("g_input_float32", input.shape, np.float32)] if narrow else []
    if slots > 1:
        temps.append(launch.Buffer("partial", (slots, n * ho * wo, opts.group * opts.taps * 3), np.float32))
    outs = [Tmp(0), Out(0)] if narrow else [Out(0)]
    outs.append(Tmp(len(temps) - 1) if slots > 1 else Out(1))   # offset gradients, or their partials
    owner = launch.kernel_for_plan(program, "dcnv4_backward_owner")
    # Each work-item's sums run in its own fixed order: the work-group size changes no bit.
    items, wg = n * opts.group * slots, cfg.work_group_size or None
    if wg is not None:
        wg = _work_group(rt, owner, cfg, wg)
    steps = [launch.step(owner, ((arrays.round_up(items, wg) if wg else items),), (wg,) if wg else None,
                         [INPUT_, OFFSET_MASK, GRAD_OUT, *outs, np.int32(n * opts.group),
                          *_geometry_args(opts, h, w, ho, wo, p)])]
    if slots > 1:
        reduce = launch.kernel_for_plan(program, "reduce_offset_gradients")
        wg = arrays.work_group_size(rt, reduce, 64)
        size = outputs[1].size
        steps.append(launch.step(reduce, (arrays.round_up(size, wg),), (wg,),
                                 [Tmp(len(temps) - 1), OFFSET_MASK, Out(1), np.int32(n * ho * wo),
                                  np.int32(p), np.float32(opts.offset_scale)]))
    return launch.LaunchPlan(outputs, steps, temps)


FORWARD = launch.LaunchOp("dcnv4", [launch.Param("input", DTYPES, 4), launch.Param("offset_mask", like="input", ndim=4)],
                    _forward_plan)
BACKWARD = launch.LaunchOp("dcnv4_backward", [launch.Param("grad_out", like="input", ndim=4),
                                        launch.Param("input", DTYPES, 4),
                                        launch.Param("offset_mask", like="input", ndim=4)],
                     _backward_plan, output_names=("g_input", "g_offset_mask"))


def enqueue_forward(rt, input, offset_mask, opts: DCNv4Options, config: Optional[DCNv4Config] = None,
                    out=None, info=None):
    """Enqueue the forward on device arrays; returns ``(output, events)``. ``info`` pretends
    another device's capabilities (tests of vendor paths)."""
    (output,), events = FORWARD.run((input, offset_mask), opts if info is None else (opts, info),
                                    config, out=out, queue=rt.queue)
    return output, events


def enqueue_backward(rt, grad_out, input, offset_mask, opts: DCNv4Options,
                     config: Optional[DCNv4Config] = None, out=None, info=None, deterministic=True):
    """Enqueue the backward on device arrays. Returns ``((g_input, g_offset_mask), events)``;
    the events span all of its work (fills, kernels, conversion to float16), as the official
    operator's time does."""
    options = (opts, bool(deterministic))
    return BACKWARD.run((grad_out, input, offset_mask), options if info is None else (options, info),
                        config, out=out, queue=rt.queue)


_checked_options: dict = {}


def _options(*values) -> DCNv4Options:
    """The DCNv4Options of these arguments, checked once per distinct set (the checks cost more
    than a launch; a process uses a handful of geometries)."""
    key = (values, tuple(map(type, values)))   # 3 and 3.0 are equal keys but not equal input
    try:
        return _checked_options[key]
    except KeyError:
        pass
    except TypeError:   # an unhashable argument: DCNv4Options reports what is wrong with it
        return DCNv4Options(*values[:-1], bool(values[-1]))
    opts = DCNv4Options(*values[:-1], bool(values[-1]))
    if len(_checked_options) < 1024:
        _checked_options[key] = opts
    return opts


def dcnv4(input, offset_mask, kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, pad_h=1, pad_w=1,
          dilation_h=1, dilation_w=1, group=4, group_channels=32, offset_scale=1.0,
          remove_center=False, *, out=None, device=None, queue=None,
          config: Optional[DCNv4Config] = None, devices=None):
    """DCNv4 forward: ``[N, H_out, W_out, group*group_channels]`` in the input's dtype.

    numpy in, numpy out; ``pyopencl.array.Array`` in (on any context and queue), device array
    out. The geometry arguments are the official operator's (softmax off); where each tap
    samples the input is in the docstring of the module :mod:`clkernels.dcnv4`.

    Args:
        input: ``[N, H, W, group*group_channels]`` (channels last), float32, float16 or
            bfloat16 (``ml_dtypes.bfloat16``).
        offset_mask: ``[N, H_out, W_out, P]`` in the input's dtype, P >= group*K*3 (K =
            kernel_h*kernel_w, minus one under ``remove_center``; the official layout pads P to
            a multiple of 8, :func:`offset_mask_channels`, and the tail is ignored): per group,
            K interleaved (dx, dy) pairs, then K mask values, used raw (no softmax).
        kernel_h: the kernel's height (>= 1).
        kernel_w: its width (>= 1).
        stride_h: the stride along the height (>= 1).
        stride_w: along the width (>= 1).
        pad_h: the padding along the height (>= 0).
        pad_w: along the width (>= 0).
        dilation_h: the dilation along the height (>= 1).
        dilation_w: along the width (>= 1).
        group: the number of groups G (>= 1).
        group_channels: the channels per group C (>= 1).
        offset_scale: the factor on the offsets (finite).
        remove_center: leave out the kernel's centre tap.
        out: an array of the result's shape and dtype to write into, in that form (numpy for
            numpy inputs, a device array for device inputs).
        device: where to run (default: where the device inputs live, else the selected device).
        queue: a ``pyopencl.CommandQueue`` to run on, instead of ``device``.
        config: the kernel's speed switches, a :class:`DCNv4Config` (default: from the device,
            :func:`forward_config`).
        devices: several devices (or ``"all"``) that share the batch N, for host arrays
            (:mod:`clkernels.multi_device`).

    Returns:
        The output ``[N, H_out, W_out, group*group_channels]`` in the input's dtype: a numpy
        array for numpy inputs, else a device array on the inputs' context and queue.

    Raises:
        TypeError: a geometry argument that is not an int, an input that is neither a
            pyopencl array nor something numpy makes an array of, a dtype other than those
            above (or ``offset_mask``'s not the input's), or an ``out`` of the other form.
        ValueError: a geometry argument out of range, ``remove_center`` with a 1x1 kernel,
            arrays whose number of dimensions or shapes do not match the arguments (an output
            size below 1, too few offset_mask channels), more elements than the kernels index
            (2^30), a ``config`` the call cannot use, an ``out`` of the wrong shape or dtype, or
            ``devices`` together with ``device`` or ``queue``.
        DeviceMemoryError: the outputs, temporaries and uploaded inputs do not fit the device.
    """
    opts = _options(kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                    group, group_channels, offset_scale, remove_center)
    if devices is not None:
        return multi_device.batched(
            "dcnv4", lambda x, om, out, device: FORWARD((x, om), opts, config, out=out, device=device)[0],
            (input, offset_mask), devices, out, device=device, queue=queue)
    return FORWARD((input, offset_mask), opts, config, out=out, device=device, queue=queue)[0]


def dcnv4_backward(grad_out, input, offset_mask, kernel_h=3, kernel_w=3, stride_h=1, stride_w=1,
                   pad_h=1, pad_w=1, dilation_h=1, dilation_w=1, group=4, group_channels=32,
                   offset_scale=1.0, remove_center=False, *, out=None, device=None, queue=None,
                   config: Optional[DCNv4Config] = None, devices=None, deterministic=True):
    """Gradients of sum(grad_out * dcnv4(input, offset_mask, ...)): ``(g_input,
    g_offset_mask)`` shaped and typed like ``input`` and ``offset_mask`` (zero in the
    padding tail of offset_mask's last axis).

    numpy in, numpy out; ``pyopencl.array.Array`` in, device arrays out, as :func:`dcnv4`. The
    geometry arguments, ``kernel_h`` to ``remove_center``, are the forward's (see :func:`dcnv4`).

    ``deterministic`` (default True): the same bits on every run and for every launch
    configuration of a device. On GPUs each input pixel then gathers the taps that land within
    ``DCNv4Config.gather_margin`` pixels of their nominal place, summing in one order, and
    farther taps are summed in 64-bit fixed point (integer sums, the same whatever the order).
    ``False`` allows float atomics (``DCNv4Config(scatter="atomic")``, whose last bits vary
    from run to run) on GPUs without 64-bit atomics only: where the gather runs it was the
    faster at every shape measured (H100, H200), so it serves both. CPUs are deterministic
    either way. The offset and mask gradients always are.

    Args:
        grad_out: ``[N, H_out, W_out, group*group_channels]``, the gradient of the forward's
            output, in the input's dtype.
        input: the forward's input, ``[N, H, W, group*group_channels]``, float32, float16 or
            bfloat16 (``ml_dtypes.bfloat16``).
        offset_mask: the forward's ``[N, H_out, W_out, P]``, in the input's dtype.
        out: a tuple of two arrays (or None entries) to write ``g_input`` and ``g_offset_mask``
            into, in the form the results take; or None.
        device: where to run, as in :func:`dcnv4`.
        queue: a ``pyopencl.CommandQueue`` to run on, instead of ``device``.
        config: the kernels' speed switches, a :class:`DCNv4Config`; its ``scatter`` chooses how
            the input gradient is summed (default: from the device and ``deterministic``,
            :func:`backward_config`).
        devices: as in :func:`dcnv4`.
        deterministic: True (default) or False, as above.

    Returns:
        ``(g_input, g_offset_mask)``: numpy arrays for numpy inputs, else device arrays on the
        inputs' context and queue.

    Raises:
        TypeError: ``deterministic`` not a bool, and as :func:`dcnv4` (``grad_out``'s dtype
            must be the input's).
        ValueError: as :func:`dcnv4`, a ``grad_out`` whose shape is not the forward output's,
            or a ``config.scatter`` of ``"fixed"`` or ``"gather"`` on a device without 64-bit
            atomics.
        DeviceMemoryError: the outputs, temporaries and uploaded inputs do not fit the device.
    """
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be True or False, not {deterministic!r}")
    opts = (_options(kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                     group, group_channels, offset_scale, remove_center), deterministic)
    if devices is not None:
        return multi_device.batched(
            "dcnv4_backward",
            lambda g, x, om, out, device: BACKWARD((g, x, om), opts, config, out=out, device=device),
            (grad_out, input, offset_mask), devices, out, n_outputs=2, device=device, queue=queue)
    return BACKWARD((grad_out, input, offset_mask), opts, config, out=out, device=device, queue=queue)


# ---------------------------------------------------------------- torch autograd wrapper

def _torch_function():
    return torch_autograd.autograd_function("DCNv4Function", dcnv4, dcnv4_backward, (True, True))


def torch_dcnv4(input, offset_mask, *, out=None, device=None, allow_host_copy=False, **options):
    """:func:`dcnv4` on torch tensors, differentiable with respect to both (autograd). CPU tensors
    run on ``device`` (an OpenCL device); CUDA tensors on the OpenCL device of their GPU, in memory
    shared with CUDA, and the result is a CUDA tensor (:mod:`clkernels.interop.torch_cuda`). Where
    that is not possible, an :class:`~clkernels.interop.torch_cuda.InteropUnavailable` says why;
    ``allow_host_copy=True`` then takes the host path instead, with a warning once.

    ``out``: a tensor of the result's shape, dtype and device to write it into, returned; as
    torch's own ``out=`` functions, not differentiable (an error if grad mode is on and an input
    requires grad). A CUDA ``out`` from :func:`clkernels.torch.empty` is in the shared pool and
    is written in place; any other is written by one device-to-device copy. The ``options`` are
    :func:`dcnv4`'s geometry arguments."""
    opts = dataclasses.asdict(DCNv4Options(**options))  # checks the options now, not in backward
    return torch_autograd.apply(_torch_function(), (input, offset_mask), dict(opts, device=device), "torch_dcnv4",
                                ("input", "offset_mask"), allow_host_copy, out=out)
