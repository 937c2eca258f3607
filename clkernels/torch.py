"""``torch.nn`` modules over the ops, for CPU and CUDA tensors (imports torch; the rest of
clkernels does not).

- :class:`DCNv4`: the official DCNv4 module's constructor and ``forward(input, shape=None)``:
  ``input`` (N, L, C) with L = H W, a value projection, offsets and masks from a linear layer
  (after a depthwise convolution when ``dw_kernel_size`` is given), the deformable convolution
  (:func:`clkernels.torch_dcnv4`), the optional centre feature scale, and an output projection.
  The parameters have the official names and initialisation, so a state dict of the official
  module loads into it.
- :class:`DeformableAggregation`: ``forward(mc_ms_feat, spatial_shape, scale_start_index,
  sampling_location, weights)``, Sparse4D's ``DeformableAggregationFunction.apply`` as a module.
- :func:`letterbox` and :func:`warp_affine`: :func:`clkernels.letterbox` and
  :func:`clkernels.warp_affine` on uint8 image tensors (not differentiable), their results on the
  images' device.
- :func:`empty`: a tensor in memory that the ops share (on CUDA, the interop's pool), for their
  ``out=`` and inputs with no copy.

CUDA tensors run on the OpenCL device of their GPU (:mod:`clkernels.interop.torch_cuda`);
``allow_host_copy=True`` lets them take the host path where that is not possible.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from . import dtypes, torch_autograd
from .dcnv4 import torch_dcnv4
from .deformable_aggregation import deformable_aggregation_torch
from .warp_affine import letterbox as _letterbox_arrays, warp_affine as _warp_affine_arrays

__all__ = ["DCNv4", "DeformableAggregation", "empty", "letterbox", "warp_affine"]


class DCNv4(nn.Module):
    """DCNv4 as a module, with the official module's constructor, parameter names and
    initialisation (a state dict of the official module loads into it).

    ``forward(input, shape=None)`` takes ``input`` (N, L, C) with L = H W and returns (N, L, C):
    a value projection, offsets and masks from a linear layer (after a depthwise convolution when
    ``dw_kernel_size`` is given), the deformable convolution, the optional centre feature scale,
    and an output projection. CPU or CUDA tensors; float32, float16 or bfloat16.

    Args:
        channels: C; must divide into ``group`` groups of any width (the official kernel wants
            a multiple of 16).
        kernel_size: the square kernel's side.
        stride: the convolution's stride, the same along both axes.
        pad: its padding.
        dilation: its dilation.
        group: the number of groups.
        offset_scale: the factor on the offsets.
        dw_kernel_size: a depthwise convolution of this size before the offsets' projection
            (None: none).
        center_feature_scale: a learnt per-group gate between the convolution and the projected
            value.
        remove_center: skip the kernel's centre tap.
        output_bias: the output projection's bias.
        without_pointwise: no value and output projections.
        allow_host_copy: CUDA tensors may take the host path where the GPU's OpenCL device
            cannot share their memory (with a warning) instead of raising.

    Raises:
        ValueError: ``channels`` is not a multiple of ``group``; in ``forward``, L is not H W.
    """

    def __init__(self, channels=64, kernel_size=3, stride=1, pad=1, dilation=1, group=4, offset_scale=1.0,
                 dw_kernel_size=None, center_feature_scale=False, remove_center=False, output_bias=True,
                 without_pointwise=False, allow_host_copy=False, **kwargs):
        super().__init__()
        if channels % group:
            raise ValueError(f"channels ({channels}) must be a multiple of group ({group})")
        self.channels, self.kernel_size, self.stride, self.pad = channels, kernel_size, stride, pad
        self.dilation, self.group, self.group_channels = dilation, group, channels // group
        self.offset_scale, self.dw_kernel_size = offset_scale, dw_kernel_size
        self.center_feature_scale, self.remove_center = center_feature_scale, int(remove_center)
        self.without_pointwise, self.allow_host_copy = without_pointwise, allow_host_copy
        taps = group * (kernel_size * kernel_size - self.remove_center)
        if dw_kernel_size is not None:
            self.offset_mask_dw = nn.Conv2d(channels, channels, dw_kernel_size, stride=1,
                                            padding=(dw_kernel_size - 1) // 2, groups=channels)
        # Offsets (2 per tap) and masks (1 per tap), padded to a multiple of 8 as the official layout.
        self.offset_mask = nn.Linear(channels, int(math.ceil(taps * 3 / 8) * 8))
        if not without_pointwise:
            self.value_proj = nn.Linear(channels, channels)
            self.output_proj = nn.Linear(channels, channels, bias=output_bias)
        self.reset_parameters()
        if center_feature_scale:
            self.center_feature_scale_proj_weight = nn.Parameter(torch.zeros(group, channels))
            self.center_feature_scale_proj_bias = nn.Parameter(torch.zeros(group))

    def reset_parameters(self):
        """Offsets and masks start at zero; the projections Xavier-uniform with zero bias."""
        nn.init.zeros_(self.offset_mask.weight)
        nn.init.zeros_(self.offset_mask.bias)
        if not self.without_pointwise:
            for layer in (self.value_proj, self.output_proj):
                nn.init.xavier_uniform_(layer.weight)
                if layer.bias is not None:
                    nn.init.zeros_(layer.bias)

    def forward(self, input, shape=None):
        """``input`` (N, L, C) -> (N, L, C); ``shape`` = (H, W) with H W = L (default: a square)."""
        n, length, c = input.shape
        if shape is not None:
            h, w = (int(v) for v in shape)
        else:
            h = w = int(round(length ** 0.5))
        if h * w != length:
            raise ValueError(f"input has L = {length} positions, not H x W = {h} x {w}; pass shape=(H, W)")
        x = input if self.without_pointwise else self.value_proj(input)
        x = x.reshape(n, h, w, -1)
        source = input
        if self.dw_kernel_size is not None:
            image = input.reshape(n, h, w, c).permute(0, 3, 1, 2)
            source = self.offset_mask_dw(image).permute(0, 2, 3, 1).reshape(n, length, c)
        offset_mask = self.offset_mask(source).reshape(n, h, w, -1)
        projected = x
        x = torch_dcnv4(x.contiguous(), offset_mask.contiguous(), kernel_h=self.kernel_size, kernel_w=self.kernel_size,
                        stride_h=self.stride, stride_w=self.stride, pad_h=self.pad, pad_w=self.pad,
                        dilation_h=self.dilation, dilation_w=self.dilation, group=self.group,
                        group_channels=self.group_channels, offset_scale=self.offset_scale,
                        remove_center=bool(self.remove_center), allow_host_copy=self.allow_host_copy)
        if self.center_feature_scale:
            # Per group, a sigmoid gate between the convolution and the projected value.
            gate = torch.sigmoid(nn.functional.linear(x, self.center_feature_scale_proj_weight,
                                                      self.center_feature_scale_proj_bias))
            gate = gate.repeat_interleave(self.group_channels, dim=-1)
            x = x * (1 - gate) + projected * gate
        x = x.reshape(n, length, -1)
        return x if self.without_pointwise else self.output_proj(x)


class DeformableAggregation(nn.Module):
    """Sparse4D's deformable aggregation as a module: ``forward(mc_ms_feat, spatial_shape,
    scale_start_index, sampling_location, weights)`` -> (bs, anchors, channels)."""

    def __init__(self, allow_host_copy=False):
        super().__init__()
        self.allow_host_copy = allow_host_copy

    def forward(self, mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights):
        return deformable_aggregation_torch(mc_ms_feat, spatial_shape, scale_start_index, sampling_location,
                                            weights, allow_host_copy=self.allow_host_copy)


def empty(*size, dtype=torch.float32, device=None):
    """An uninitialised tensor whose memory the ops' OpenCL device shares, for their ``out=``
    and their inputs.

    On a CUDA device it is a block of the shared pool (:mod:`clkernels.interop.torch_cuda`):
    an op writes its ``out=`` there in place, and takes it as an input without the
    device-to-device copy that other CUDA tensors cost. So a model whose activations are made
    here passes them between the ops and torch with no copy. The block returns to the pool
    when the tensor (and every view of it) is gone, after the work that reads it. On the CPU it
    is ``torch.empty``: CPU tensors already share their memory with the ops.

    Args:
        *size: the shape, as ints or one sequence (as ``torch.empty``).
        dtype: a torch dtype (default float32).
        device: ``"cpu"`` (default: the CPU), ``"cuda"``, ``"cuda:1"`` or a ``torch.device``.

    Returns:
        The tensor, contiguous.

    Raises:
        ValueError: a device other than the CPU or a CUDA GPU.
        clkernels.interop.torch_cuda.InteropUnavailable: a CUDA device whose GPU's OpenCL
            device cannot share its memory (the message says what is missing).

    Example:
        >>> blob = clkernels.torch.empty(1, 3, 640, 640, device="cuda")       # doctest: +SKIP
        >>> blob, d2i = clkernels.torch.letterbox(image, out=blob)             # doctest: +SKIP
    """
    shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else size
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cpu":
        return torch.empty(shape, dtype=dtype)
    if device.type != "cuda":
        raise ValueError(f"device is {device}; clkernels.torch.empty makes CPU or CUDA tensors")
    return torch_autograd.cuda_bridge(device, "clkernels.torch.empty").empty(shape, dtype)


def _on_images_device(fn, images, wrapper: str, n_outputs: int, allow_host_copy: bool, out=None, dtype=None):
    """``fn(images as an array, out=array or None)`` with its results as tensors on the images'
    device; ``out`` (for the first result, of ``dtype``) as in :func:`clkernels.torch_autograd.call_into`."""
    if out is not None:
        return torch_autograd.call_into(fn, [images], ["images"], wrapper, out, dtype=dtype,
                                        allow_host_copy=allow_host_copy, n_outputs=n_outputs, host_ints=False)
    cuda = torch_autograd.check_devices([images], ["images"], wrapper)
    if cuda is not None:
        bridge = torch_autograd.cuda_bridge(cuda, wrapper, allow_host_copy)
        if bridge is not None:
            return bridge.run(fn, [images], n_outputs=n_outputs, host_ints=False)
        images = images.cpu()
    results = fn(torch_autograd.numpy_of(images))
    results = results if isinstance(results, tuple) else (results,)
    out = tuple(torch_autograd.tensor_of(r) for r in results)
    if cuda is not None:
        out = tuple(t.to(cuda) for t in out)
    return out if n_outputs > 1 else out[0]


def letterbox(images, size=(640, 640), *, dtype=torch.float32, out=None, allow_host_copy=False, **options):
    """:func:`clkernels.letterbox` on a uint8 BGR image tensor: ``(blob, d2i)`` as tensors on the
    images' device.

    CPU tensors run on the selected OpenCL device; CUDA tensors on the OpenCL device of their
    GPU, with no host round trip (:mod:`clkernels.interop.torch_cuda`). Not differentiable.

    Args:
        images: a uint8 BGR image tensor, ``[H, W, 3]`` or ``[N, H, W, 3]``, on the CPU or a
            CUDA GPU.
        size: the blob's ``(width, height)``.
        dtype: the blob's torch dtype: ``torch.float32`` (default), ``torch.float16`` or
            ``torch.bfloat16``.
        out: a tensor of the blob's shape and dtype, on the images' device, to write the blob
            into (reused across calls); returned as ``blob``. A CUDA one from :func:`empty` is
            written in place, any other by one copy.
        allow_host_copy: CUDA tensors may take the host path where the GPU's OpenCL device
            cannot share their memory (with a warning once) instead of raising, as in
            :func:`clkernels.torch_dcnv4`.
        **options: :func:`clkernels.letterbox`'s other options: ``fill``, ``swap_rb``,
            ``mean``, ``std``, ``alpha``, ``beta``.

    Returns:
        ``(blob, d2i)``: ``blob`` ``[N, 3, height, width]`` of ``dtype`` (N = 1 for one image),
        and ``d2i`` the float64 destination-to-source matrices, ``[2, 3]`` for one image or
        ``[N, 2, 3]``; both on the images' device.

    Raises:
        TypeError: images that are not uint8, a ``dtype`` other than those above, or an
            ``out`` that is not a tensor.
        ValueError: images on a device other than the CPU or a CUDA GPU, or an ``out`` on
            another device, of another shape or dtype than the blob, or sharing the images'
            memory.
        clkernels.interop.torch_cuda.InteropUnavailable: CUDA images whose GPU's OpenCL device
            cannot share their memory, without ``allow_host_copy``.
    """
    np_dtype = dtypes.from_torch(dtype)
    return _on_images_device(lambda im, out=None: _letterbox_arrays(im, size, dtype=np_dtype, out=out, **options),
                             images, "clkernels.torch.letterbox", 2, allow_host_copy, out, dtype)


def warp_affine(image, M, dsize, border_value=114, *, out=None, allow_host_copy=False):
    """:func:`clkernels.warp_affine` on a uint8 ``[H, W, 3]`` image tensor: OpenCV's
    ``warpAffine`` with bilinear interpolation and a constant border, the result on the image's
    device.

    CPU tensors run on the selected OpenCL device; CUDA tensors on the OpenCL device of their
    GPU, with no host round trip (:mod:`clkernels.interop.torch_cuda`). Not differentiable.

    Args:
        image: a uint8 ``[H, W, 3]`` image tensor, on the CPU or a CUDA GPU.
        M: the 2x3 affine matrix, source to destination, as ``cv2.warpAffine`` takes it: a
            sequence, numpy array or tensor.
        dsize: the result's ``(width, height)``.
        border_value: the level of pixels that map outside the image: an integer in
            [0, 255], or three of them in BGR order.
        out: a uint8 ``[height, width, 3]`` tensor on the image's device to write the result
            into, returned. A CUDA one from :func:`empty` is written in place, any other by one
            copy.
        allow_host_copy: CUDA tensors may take the host path where the GPU's OpenCL device
            cannot share their memory (with a warning once) instead of raising, as in
            :func:`clkernels.torch_dcnv4`.

    Returns:
        The warped image, a uint8 ``[height, width, 3]`` tensor on the image's device.

    Raises:
        TypeError: an image that is not uint8, or an ``out`` that is not a tensor.
        ValueError: an image that is not ``[H, W, 3]``, a singular ``M``, a ``border_value``
            outside [0, 255], an image on a device other than the CPU or a CUDA GPU, or an
            ``out`` on another device, of another shape or dtype than the result, or sharing
            the image's memory.
        clkernels.interop.torch_cuda.InteropUnavailable: a CUDA image whose GPU's OpenCL device
            cannot share its memory, without ``allow_host_copy``.
    """
    M = M.detach().cpu().numpy() if isinstance(M, torch.Tensor) else M
    return _on_images_device(lambda im, out=None: _warp_affine_arrays(im, M, dsize, border_value, out=out), image,
                             "clkernels.torch.warp_affine", 1, allow_host_copy, out, torch.uint8)
