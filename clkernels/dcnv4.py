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
- float32 or float16 storage, float arithmetic. numpy in, numpy out; pyopencl arrays in,
  device arrays out. The input gradient is accumulated with float atomics (see the template
  for why), so its last bits may vary between runs; the offset and mask gradients do not.

The kernel's speed switches are those of the paper's ablation (its Table 10): channels per
work-item, bilinear coefficients reused across them, vector width, storage type. They are
chosen from the device unless a :class:`KernelConfig` is given; :data:`LADDER` lists the
paper's rungs for ``benchmarks/bench_dcnv4.py``. :func:`torch_dcnv4` is an autograd wrapper
for CPU torch tensors (torch is imported only when it is used).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Optional

import numpy as np
import pyopencl as cl

from . import arrays
from .runtime import get_runtime
from .templates import BuildError, Storage, get_program, kernel

__all__ = ["dcnv4", "dcnv4_backward", "Options", "KernelConfig", "LADDER", "offset_mask_channels",
           "forward_config", "backward_config", "launch_forward", "launch_backward", "used_ptx",
           "torch_dcnv4"]

TEMPLATE = "clkernels/dcnv4.cl.mako"
DTYPES = (np.float32, np.float16)
_INT_LIMIT = 2 ** 31 - 1  # kernels index with int


@dataclasses.dataclass(frozen=True)
class Options:
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
class KernelConfig:
    """The speed switches of the paper's ablation. ``work_group_size`` 0: from the device.
    ``scatter`` (backward only): "atomic" (GPUs), "owner" (CPUs), "" from the device."""
    channels_per_item: int
    vector_width: int
    reuse: bool = True
    work_group_size: int = 0
    scatter: str = ""


# The paper's Table 10 rungs, in order (A100, N=64, 56x56, 128 channels, G=4: 1.45, 1.53,
# 1.51, 0.606 ms; then the last rung with float16 storage: 0.404 ms).
LADDER = (
    ("DCNv3-style (1 channel per work-item)", KernelConfig(1, 1, reuse=False)),
    ("8 channels per work-item", KernelConfig(8, 1, reuse=False)),
    ("+ bilinear coefficients reused", KernelConfig(8, 1, reuse=True)),
    ("+ vector loads and stores", KernelConfig(8, 8, reuse=True)),
)


def _largest_divisor(c: int, candidates) -> int:
    return next(v for v in candidates if c % v == 0)


def forward_config(info, group_channels: int, dtype) -> KernelConfig:
    """Channels per work-item from the device: GPUs take 8 (one 32- or 16-byte vector load
    per corner, the official choice); CPUs a whole group's channels in vectors of 8, so
    each work-item amortises its coefficients over more loads (measured faster on PoCL)."""
    vw = _largest_divisor(group_channels, (8, 4, 2, 1))
    if info.is_cpu:
        return KernelConfig(group_channels if group_channels <= 64 else vw, vw, True, 0)
    if np.dtype(dtype) == np.float16 and group_channels % 16 == 0:
        # Half storage: 16 channels (two 16-byte loads per corner) per work-item measured
        # 1.35x faster than 8 on an H200 at the paper's shape.
        return KernelConfig(16, 8, True, 0)
    return KernelConfig(vw, vw, True, 0)


def backward_config(info, group_channels: int, dtype, batch: int = 1, group: int = 1) -> KernelConfig:
    """GPUs: the official 1 or 2 channels per work-item, so a group's channels spread over
    lanes and the scatter's atomics run in parallel. CPUs: the atomic-free "owner" scatter
    with channel runs as wide as still gives every core two work-items."""
    if not info.is_cpu:
        # 2 channels per work-item: 1.5x faster than 1 on an H200 at the paper's shape.
        cpw = 2 if group_channels % 2 == 0 else 1
        return KernelConfig(cpw, cpw, True, 0, "atomic")
    vw = _largest_divisor(group_channels, (8, 4, 2, 1))
    runs = [d for d in range(group_channels, 0, -vw) if group_channels % d == 0]
    cpw = next((d for d in runs if batch * group * (group_channels // d) >= 2 * info.compute_units),
               runs[-1])
    return KernelConfig(cpw, vw, True, 0, "owner")


_ptx_refused: dict = {}  # device -> the build log, when its compiler refused inline PTX


def _program(runtime, info, direction, dtype, opts: Options, cfg: KernelConfig, slots_p2=1):
    """Render + build; on NVIDIA try the inline-PTX variant first, and fall back to the
    portable one (remembered per device) if the driver refuses it."""
    params = dict(direction=direction, info=info, st=Storage(dtype),
                  group=opts.group, channels=opts.group_channels, kernel_h=opts.kernel_h,
                  kernel_w=opts.kernel_w, remove_center=bool(opts.remove_center),
                  cpw=cfg.channels_per_item, vw=cfg.vector_width, reuse=bool(cfg.reuse),
                  slots_p2=slots_p2)
    # Oclgrind checks unoptimised code: its uninitialised-value checker cannot follow the
    # `freeze` that LLVM's optimiser puts on paired / and % (and optimised code could hide
    # what it is there to find).
    options = ("-cl-opt-disable",) if runtime.info.is_simulator else ()
    key = runtime.device.int_ptr
    if info.vendor == "nvidia" and key not in _ptx_refused:
        try:
            return get_program(TEMPLATE, runtime, options, ptx=True, **params)
        except BuildError as exc:
            _ptx_refused[key] = exc.log
            warnings.warn(f"dcnv4: {info.name} refused inline PTX; using portable half "
                          f"conversions and CAS atomics. Build log:\n{exc.log[:2000]}")
    return get_program(TEMPLATE, runtime, options, ptx=False, **params)


_kernel = kernel  # one kernel object per (program, name), from clkernels.templates


def used_ptx(runtime) -> bool:
    """Whether kernels on this runtime's device use the inline-PTX paths."""
    return runtime.info.vendor == "nvidia" and runtime.device.int_ptr not in _ptx_refused


def _check_config(cfg: KernelConfig, opts: Options, dtype, runtime) -> KernelConfig:
    c, cpw, vw = opts.group_channels, cfg.channels_per_item, cfg.vector_width
    if cpw < 1 or c % cpw:
        raise ValueError(f"config.channels_per_item={cpw} must divide group_channels={c}")
    if vw not in (1, 2, 4, 8, 16) or cpw % vw:
        raise ValueError(f"config.vector_width={vw} must be 1, 2, 4, 8 or 16 and divide "
                         f"channels_per_item={cpw}")
    if vw * np.dtype(dtype).itemsize * 8 > runtime.device.mem_base_addr_align:
        raise ValueError(f"config.vector_width={vw} exceeds the buffer alignment of "
                         f"{runtime.info.name}; use a smaller vector_width")
    return cfg


def _geometry(input, offset_mask, opts: Options, grad_out=None):
    """Validate the arrays against the options; returns them (lists made arrays) and
    (N, H, W, H_out, W_out, P)."""
    input = arrays.check_array(input, "input", DTYPES, ndim=4)
    n, h, w, ch = (int(s) for s in input.shape)
    if h < 1 or w < 1:
        raise ValueError(f"input has shape {tuple(input.shape)}: height and width (axes 1, 2) "
                         "must be at least 1 (layout [N, H, W, group*group_channels])")
    if ch != opts.group * opts.group_channels:
        raise ValueError(f"input has {ch} channels but group*group_channels = {opts.group}*"
                         f"{opts.group_channels} = {opts.group * opts.group_channels}; "
                         "set group/group_channels to match input.shape[3]")
    ho, wo = opts.out_size(h, w)
    offset_mask = arrays.check_array(offset_mask, "offset_mask", [input.dtype], ndim=4,
                                     shape=(n, ho, wo, None))
    p = int(offset_mask.shape[3])
    need = opts.group * opts.taps * 3
    if p < need:
        raise ValueError(f"offset_mask has {p} channels, too few for group*K*3 = {opts.group}*"
                         f"{opts.taps}*3 = {need}; the official layout uses "
                         f"{offset_mask_channels(opts.group, opts.kernel_h, opts.kernel_w, opts.remove_center)}")
    if grad_out is not None:
        grad_out = arrays.check_array(grad_out, "grad_out", [input.dtype], ndim=4, shape=(n, ho, wo, ch))
    for name, size in (("input", n * h * w * ch), ("offset_mask", n * ho * wo * p),
                       ("output", n * ho * wo * ch)):
        if size > _INT_LIMIT // 2:  # index arithmetic stays in int with headroom
            raise ValueError(f"{name} has {size} elements, more than these kernels index "
                             f"(2^30); split the batch")
    return input, offset_mask, grad_out, (n, h, w, ho, wo, p)


def _device_array(runtime, a, name):
    a = arrays.to_device(runtime, a, name)
    if a.offset:
        raise ValueError(f"{name} is a view with an offset into its buffer; pass {name}.copy()")
    return a


def _geometry_args(opts: Options, h, w, ho, wo, p):
    i32 = np.int32
    return (i32(h), i32(w), i32(ho), i32(wo), i32(p), i32(opts.stride_h), i32(opts.stride_w),
            i32(opts.pad_h), i32(opts.pad_w), i32(opts.dilation_h), i32(opts.dilation_w),
            np.float32(opts.offset_scale))


def _check_work_group(runtime, kernel, wg):
    """An explicit work-group size must fit this kernel on this device (registers bound it
    below the device's maximum); the default sizes always do."""
    limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, runtime.device)
    if wg > limit:
        raise ValueError(f"config.work_group_size={wg} exceeds this kernel's limit of {limit} "
                         f"work-items on {runtime.info.name}; use a smaller size or leave it 0")


def launch_forward(runtime, input, offset_mask, output, opts: Options,
                   config: Optional[KernelConfig] = None, info=None) -> cl.Event:
    """Enqueue the forward kernel on device arrays (already validated); returns its event."""
    info = info or runtime.info
    n, h, w, ho, wo, p = (int(s) for s in (*input.shape[:3], *offset_mask.shape[1:]))
    cfg = _check_config(config or forward_config(info, opts.group_channels, input.dtype),
                        opts, input.dtype, runtime)
    program = _program(runtime, info, "forward", input.dtype, opts, cfg)
    kernel = _kernel(program, "dcnv4_forward")
    items = n * ho * wo * opts.group * (opts.group_channels // cfg.channels_per_item)
    wg = cfg.work_group_size or arrays.work_group_size(runtime, kernel, 256 if not info.is_cpu else 64)
    _check_work_group(runtime, kernel, wg)
    return kernel(runtime.queue, (arrays.round_up(items, wg),), (wg,), input.data, offset_mask.data,
                  output.data, np.int32(items), *_geometry_args(opts, h, w, ho, wo, p),
                  wait_for=input.events + offset_mask.events)


def launch_backward(runtime, grad_out, input, offset_mask, opts: Options,
                    config: Optional[KernelConfig] = None, info=None):
    """Enqueue the backward pass on device arrays (already validated). Returns
    ``(g_input, g_offset_mask, events)``; the events span all of its work (fills, kernels,
    conversion to float16), as the official operator's time does."""
    info = info or runtime.info
    n, h, w, ho, wo, p = (int(s) for s in (*input.shape[:3], *offset_mask.shape[1:]))
    cfg = _check_config(config or backward_config(info, opts.group_channels, input.dtype, n, opts.group),
                        opts, input.dtype, runtime)
    if n == 0:
        return (arrays.empty(runtime, input.shape, input.dtype),
                arrays.empty(runtime, offset_mask.shape, offset_mask.dtype), [])
    scatter = cfg.scatter or ("owner" if info.is_cpu else "atomic")
    if scatter == "owner":
        return _backward_owner(runtime, info, grad_out, input, offset_mask, opts, cfg)
    if scatter != "atomic":
        raise ValueError(f"config.scatter must be 'atomic', 'owner' or '', not {cfg.scatter!r}")
    while True:
        slots_p2 = 1 << (opts.group_channels // cfg.channels_per_item - 1).bit_length()
        program = _program(runtime, info, "backward", input.dtype, opts, cfg, slots_p2)
        kernel = _kernel(program, "dcnv4_backward")
        wg = cfg.work_group_size or arrays.work_group_size(
            runtime, kernel, max(slots_p2, 64 if info.is_cpu else 256))
        if wg % slots_p2 == 0:
            _check_work_group(runtime, kernel, wg)
            break
        if cfg.work_group_size:
            raise ValueError(f"config.work_group_size={wg} must be a multiple of {slots_p2}, "
                             "the work-items that share one (pixel, group)")
        # The device cannot hold a group's slots in one work-group: wider work-items.
        cpw = next(d for d in range(cfg.channels_per_item + 1, opts.group_channels + 1)
                   if opts.group_channels % d == 0)
        cfg = dataclasses.replace(cfg, channels_per_item=cpw,
                                  vector_width=math.gcd(cpw, cfg.vector_width))
    g_in32 = arrays.zeros(runtime, input.shape, np.float32)
    g_om = arrays.empty(runtime, offset_mask.shape, offset_mask.dtype)  # the kernel writes all
    events = list(g_in32.events)
    pix_groups = n * ho * wo * opts.group
    local = (cl.LocalMemory(2 * 3 * wg * 4),) if slots_p2 > 1 else ()
    events.append(kernel(
        runtime.queue, (arrays.round_up(pix_groups * slots_p2, wg),), (wg,),
        input.data, offset_mask.data, grad_out.data, g_in32.data, g_om.data,
        np.int32(pix_groups), *_geometry_args(opts, h, w, ho, wo, p), *local,
        wait_for=input.events + offset_mask.events + grad_out.events + events))
    g_om.add_event(events[-1])
    if input.dtype == np.float32:
        g_in32.add_event(events[-1])
        return g_in32, g_om, events
    g_in = arrays.convert(runtime, g_in32, input.dtype, wait_for=events[-1:])
    events.extend(g_in.events)
    return g_in, g_om, events


def _backward_owner(runtime, info, grad_out, input, offset_mask, opts: Options, cfg: KernelConfig):
    n, h, w, ho, wo, p = (int(s) for s in (*input.shape[:3], *offset_mask.shape[1:]))
    slots = opts.group_channels // cfg.channels_per_item
    program = _program(runtime, info, "backward_owner", input.dtype, opts, cfg)
    half = input.dtype == np.float16
    g_acc = arrays.empty(runtime, input.shape, np.float32)  # each work-item zeroes its slice
    g_in = arrays.empty(runtime, input.shape, input.dtype) if half else g_acc
    g_om = arrays.empty(runtime, offset_mask.shape, offset_mask.dtype)
    partial = arrays.empty(runtime, (slots, n * ho * wo, opts.group * opts.taps * 3), np.float32) \
        if slots > 1 else None
    outputs = [g_acc] + ([g_in] if half else []) + [partial if slots > 1 else g_om]
    events = [_kernel(program, "dcnv4_backward_owner")(
        runtime.queue, (n * opts.group * slots,), None, input.data, offset_mask.data,
        grad_out.data, *(a.data for a in outputs), np.int32(n * opts.group),
        *_geometry_args(opts, h, w, ho, wo, p),
        wait_for=input.events + offset_mask.events + grad_out.events)]
    if slots > 1:
        reduce = _kernel(program, "reduce_offset_gradients")
        wg = arrays.work_group_size(runtime, reduce, 64)
        events.append(reduce(runtime.queue, (arrays.round_up(g_om.size, wg),), (wg,), partial.data,
                             offset_mask.data, g_om.data, np.int32(n * ho * wo), np.int32(p),
                             np.float32(opts.offset_scale), wait_for=events))
    g_om.add_event(events[-1])
    g_in.add_event(events[0])
    return g_in, g_om, events


def dcnv4(input, offset_mask, kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, pad_h=1, pad_w=1,
          dilation_h=1, dilation_w=1, group=4, group_channels=32, offset_scale=1.0,
          remove_center=False, *, device=None, config: Optional[KernelConfig] = None):
    """DCNv4 forward: ``[N, H_out, W_out, group*group_channels]`` in the input's dtype.
    ``device``: a device spec or Runtime (default: the selected device); ``config``: the
    kernel's speed switches (default: chosen from the device)."""
    opts = Options(kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                   group, group_channels, offset_scale, bool(remove_center))
    input, offset_mask, _, (n, h, w, ho, wo, p) = _geometry(input, offset_mask, opts)
    runtime = get_runtime(device)
    like_device = arrays.is_device_array(input)
    x = _device_array(runtime, input, "input")
    om = _device_array(runtime, offset_mask, "offset_mask")
    out = arrays.empty(runtime, (n, ho, wo, x.shape[3]), x.dtype)
    if out.size:
        out.add_event(launch_forward(runtime, x, om, out, opts, config))
    return arrays.to_host_like(out, like_device)


def dcnv4_backward(grad_out, input, offset_mask, kernel_h=3, kernel_w=3, stride_h=1, stride_w=1,
                   pad_h=1, pad_w=1, dilation_h=1, dilation_w=1, group=4, group_channels=32,
                   offset_scale=1.0, remove_center=False, *, device=None,
                   config: Optional[KernelConfig] = None):
    """Gradients of sum(grad_out * dcnv4(input, offset_mask, ...)): ``(g_input,
    g_offset_mask)`` shaped and typed like ``input`` and ``offset_mask`` (zero in the
    padding tail of offset_mask's last axis)."""
    opts = Options(kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                   group, group_channels, offset_scale, bool(remove_center))
    input, offset_mask, grad_out = _geometry(input, offset_mask, opts, grad_out)[:3]
    runtime = get_runtime(device)
    like_device = arrays.is_device_array(input)
    x = _device_array(runtime, input, "input")
    om = _device_array(runtime, offset_mask, "offset_mask")
    go = _device_array(runtime, grad_out, "grad_out")
    g_in, g_om, _ = launch_backward(runtime, go, x, om, opts, config)
    return arrays.to_host_like(g_in, like_device), arrays.to_host_like(g_om, like_device)


# ---------------------------------------------------------------- torch autograd wrapper

@functools.lru_cache(maxsize=None)
def _torch_function():
    import torch  # optional dependency, imported on first use only

    class DCNv4Function(torch.autograd.Function):
        """DCNv4 on CPU torch tensors through the OpenCL kernels (float32/float16)."""

        @staticmethod
        def forward(ctx, input, offset_mask, options, device):
            ctx.save_for_backward(input, offset_mask)
            ctx.options, ctx.device = options, device
            out = dcnv4(input.detach().contiguous().numpy(), offset_mask.detach().contiguous().numpy(),
                        **dataclasses.asdict(options), device=device)
            return torch.from_numpy(out)

        @staticmethod
        def backward(ctx, grad_out):
            input, offset_mask = ctx.saved_tensors
            g_in, g_om = dcnv4_backward(
                grad_out.detach().contiguous().numpy(), input.detach().contiguous().numpy(),
                offset_mask.detach().contiguous().numpy(), **dataclasses.asdict(ctx.options),
                device=ctx.device)
            return torch.from_numpy(g_in), torch.from_numpy(g_om), None, None

    return DCNv4Function


def torch_dcnv4(input, offset_mask, *, device=None, **options):
    """:func:`dcnv4` on CPU torch tensors, differentiable with respect to both (autograd)."""
    for name, t in (("input", input), ("offset_mask", offset_mask)):
        if t.device.type != "cpu":
            raise ValueError(f"{name} is on {t.device}; torch_dcnv4 takes CPU tensors "
                             f"(use {name}.cpu())")
    return _torch_function().apply(input, offset_mask, Options(**options), device)
