"""Fused warp-affine preprocessing: letterbox + BGR->RGB + normalise + HWC->CHW in one kernel.

``letterbox(images, size=(640, 640), ...)`` turns uint8 BGR images (one, a list that may mix
sizes, a ``[N, H, W, 3]`` batch, or device arrays) into the planar float blob a detector
eats, plus the destination-to-source matrices ``d2i`` that ``scale_boxes`` uses to map boxes
back. ``warp_affine(image, M, dsize)`` is OpenCV's ``warpAffine`` alone (uint8 HWC out).

Sampling is OpenCV's INTER_LINEAR with BORDER_CONSTANT, computed the way OpenCV >= 4.11
computes it for 8-bit images (float coordinates, one fma per lerp, round half to even), so
results equal OpenCV's on all but a few values per million and never differ by more than one
level. The kernel is ``warp_affine.cl.mako`` beside this file.
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
import pyopencl as cl

from . import arrays
from .runtime import get_runtime
from . import templates
from .templates import get_program, storage

__all__ = ["letterbox", "warp_affine", "scale_boxes", "letterbox_matrix"]

TEMPLATE = "clkernels/warp_affine.cl.mako"
_ALIGN = 64           # byte alignment of each image inside a packed buffer
_INT_MAX = 2**31 - 1  # per-image byte offsets and pixel counts are int in the kernel
_MAX_SIDE = 2**22     # the kernel's float floor is exact below this


# ----------------------------------------------------------------------------- geometry

def letterbox_matrix(src_size: Tuple[int, int], dst_size: Tuple[int, int]) -> np.ndarray:
    """The image-to-blob matrix ``i2d`` (2x3, float64) of a centred letterbox.

    ``src_size`` and ``dst_size`` are ``(width, height)``. The scale is
    ``s = min(dst_w / src_w, dst_h / src_h)``; the ``s/2 - 1/2`` terms make it map pixel
    centres to pixel centres, so the image covers ``s * src`` pixels in the middle.
    """
    (sw, sh), (dw, dh) = src_size, dst_size
    s = min(dw / sw, dh / sh)
    return np.array([[s, 0.0, -s * sw / 2 + dw / 2 + s / 2 - 0.5],
                     [0.0, s, -s * sh / 2 + dh / 2 + s / 2 - 0.5]])


def _invert_affine(M: np.ndarray, name: str) -> np.ndarray:
    """The inverse of a 2x3 affine matrix, in float64; a singular one is an error. NaN
    entries are allowed: they give a NaN inverse, which samples the border everywhere."""
    a, b, c = (float(v) for v in M[0])
    d, e, f = (float(v) for v in M[1])
    det = a * e - b * d
    if det == 0:
        raise ValueError(f"{name} is singular (its 2x2 part has determinant 0): {M.tolist()}; "
                         "an affine warp needs an invertible matrix")
    # The same operations, in the same order, as OpenCV's inversion inside warpAffine, so
    # that both round to the same float matrix.
    r = 1.0 / det
    a11, a12, a21, a22 = e * r, -b * r, -d * r, a * r
    return np.array([[a11, a12, -a11 * c - a12 * f], [a21, a22, -a21 * c - a22 * f]])


def scale_boxes(boxes, d2i, shape=None) -> np.ndarray:
    """Map boxes found on the blob back to the source image.

    ``boxes``: ``[..., 4]`` as ``x1, y1, x2, y2`` in continuous pixel coordinates of the blob
    (pixel ``i`` covers ``[i, i + 1)``, the convention detectors predict in). ``d2i``: the
    2x3 matrix ``letterbox`` returned for that image. Returns float64 boxes in source pixel
    coordinates: the blob area covered by the image maps to ``[0, 0, src_w, src_h]``. For a
    matrix with rotation the result is the axis-aligned box around the four mapped corners.
    ``shape=(height, width)`` clips the result to the source image.
    """
    boxes = np.asarray(boxes, dtype=np.float64)
    d2i = np.asarray(d2i, dtype=np.float64)
    if boxes.shape[-1:] != (4,):
        raise ValueError(f"boxes must have shape [..., 4] (x1, y1, x2, y2), got {boxes.shape}")
    if d2i.shape != (2, 3):
        raise ValueError(f"d2i must be one image's 2x3 matrix, got shape {d2i.shape}; "
                         "for a batch pass d2i[i] with that image's boxes")
    x1, y1, x2, y2 = np.moveaxis(boxes, -1, 0)
    # d2i maps pixel indices (centres); a continuous coordinate u is the index u - 1/2.
    xs = np.stack([x1, x2, x2, x1]) - 0.5
    ys = np.stack([y1, y1, y2, y2]) - 0.5
    sx = d2i[0, 0] * xs + d2i[0, 1] * ys + d2i[0, 2] + 0.5
    sy = d2i[1, 0] * xs + d2i[1, 1] * ys + d2i[1, 2] + 0.5
    out = np.stack([sx.min(0), sy.min(0), sx.max(0), sy.max(0)], axis=-1)
    if shape is not None:
        h, w = shape
        out[..., 0::2] = out[..., 0::2].clip(0, w)
        out[..., 1::2] = out[..., 1::2].clip(0, h)
    return out


# ----------------------------------------------------------------------------- images

def _check_image(img, name: str):
    """A uint8 [H, W, 3] host or device array whose channels are consecutive bytes."""
    img = arrays.check_array(img, name, [np.uint8])
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"{name} must be an [H, W, 3] BGR image, got shape {tuple(img.shape)}"
                         + ("; convert grey or BGRA with cv2.cvtColor first"
                            if img.ndim in (2, 3) else ""))
    h, w = int(img.shape[0]), int(img.shape[1])
    if h == 0 or w == 0:
        raise ValueError(f"{name} is empty (shape {tuple(img.shape)})")
    pitch, step, chan = (int(s) for s in img.strides)
    if chan != 1 or step < 3 or pitch < step * w:
        raise ValueError(
            f"{name} has strides {tuple(img.strides)}: rows may be padded (any row pitch >= "
            f"width * pixel step) and pixels may be spaced (step >= 3), but channels must be "
            f"consecutive bytes and the strides positive; pass np.ascontiguousarray({name})")
    if h >= _MAX_SIDE or w >= _MAX_SIDE:
        raise ValueError(f"{name} is {w}x{h}; sides of {_MAX_SIDE} pixels or more are not "
                         "supported (resize it first)")
    span = (h - 1) * pitch + (w - 1) * step + 3
    if span > _INT_MAX:
        raise ValueError(f"{name} spans {span} bytes; images over 2 GiB are not supported "
                         "(split or resize it first)")
    return img


def _split_batch(images, name: str) -> Tuple[list, bool, bool]:
    """(list of checked images, is_device, was_single)."""
    if isinstance(images, (list, tuple)):
        if not images:
            raise ValueError(f"{name} is an empty list")
        items = [_check_image(im, f"{name}[{i}]") for i, im in enumerate(images)]
        single = False
    else:
        if not arrays.is_device_array(images) and not isinstance(images, np.ndarray):
            images = np.asarray(images)
        if images.ndim == 4:
            if images.shape[0] == 0:
                raise ValueError(f"{name} is an empty batch (shape {tuple(images.shape)})")
            items = [_check_image(images[i], f"{name}[{i}]") for i in range(images.shape[0])]
            single = False
        else:
            items = [_check_image(images, name)]
            single = True
    kinds = {arrays.is_device_array(im) for im in items}
    if len(kinds) > 1:
        raise TypeError(f"{name} mixes numpy and device arrays; pass all of one kind")
    return items, kinds.pop(), single


def _alloc_limit(runtime) -> int:
    """The largest buffer one launch may use (the device's max allocation)."""
    return int(runtime.info.max_alloc_bytes)


def _span(img) -> int:
    h, w = img.shape[:2]
    return (h - 1) * img.strides[0] + (w - 1) * img.strides[1] + 3


def _chunks(items, out_bytes_per_image: int, limit: int, name: str) -> List[Tuple[int, int]]:
    """Split the batch into runs whose packed input and output each fit one buffer."""
    runs, start, used = [], 0, 0
    for i, im in enumerate(items):
        need = arrays.round_up(_span(im), _ALIGN)
        if need > limit or out_bytes_per_image > limit:
            raise ValueError(
                f"{name}[{i}] needs {max(need, out_bytes_per_image)} bytes in one buffer, more "
                f"than this device allows ({limit} bytes, CL_DEVICE_MAX_MEM_ALLOC_SIZE); "
                "resize it on the host first or pick a device with more memory")
        if i > start and (used + need > limit or (i - start + 1) * out_bytes_per_image > limit):
            runs.append((start, i))
            start, used = i, 0
        used += need
    runs.append((start, len(items)))
    return runs


class _Packed:
    """Images of one launch in one buffer: offsets and geometry for the kernel."""

    def __init__(self, buffer, offsets, items, keep=()):
        self.buffer = buffer
        self.offsets = np.asarray(offsets, dtype=np.uint64)
        self.geom = np.array([[im.shape[0], im.shape[1], im.strides[0], im.strides[1]]
                              for im in items], dtype=np.int32)
        self.keep = keep  # host memory a USE_HOST_PTR buffer reads, alive until the launch ends
        for off, im in zip(self.offsets, items):
            if int(off) + _span(im) > buffer.size:  # a pack bug must never become a stray read
                raise AssertionError("image outside its packed buffer")


def _host_span(img: np.ndarray, size: int = None) -> np.ndarray:
    """``size`` bytes (default: the image's span) from the image's first byte, as a 1-D view
    of the same memory (no copy)."""
    return np.lib.stride_tricks.as_strided(img, shape=(size or _span(img),), strides=(1,))


def _address(img: np.ndarray) -> int:
    return img.__array_interface__["data"][0]


def _owner(img: np.ndarray):
    while isinstance(img.base, np.ndarray):
        img = img.base
    return img if img.base is None else img.base


def _shared_span(items):
    """(view, offsets) when every image lies in one numpy allocation (a batch array, views or
    crops of one image) and the bytes between them are few: one transfer then covers them
    all. None otherwise."""
    owner = _owner(items[0])
    if any(_owner(im) is not owner for im in items[1:]):
        return None
    starts = [_address(im) for im in items]
    lo = min(starts)
    hi = max(a + _span(im) for a, im in zip(starts, items))
    if hi - lo > 2 * sum(_span(im) for im in items):
        return None
    first = items[starts.index(lo)]
    return _host_span(first, hi - lo), [a - lo for a in starts]


def _aligned_offsets(items):
    offsets, total = [], 0
    for im in items:
        offsets.append(total)
        total += arrays.round_up(_span(im), _ALIGN)
    return offsets, total


def _pack_host(runtime, items, zero_copy: bool) -> _Packed:
    ctx, queue = runtime.context, runtime.queue
    mf = cl.mem_flags
    shared = _shared_span(items)
    if shared is not None:
        view, offsets = shared
        if zero_copy:
            # CPU device: the kernel reads the numpy memory in place, padding and all.
            try:
                buf = cl.Buffer(ctx, mf.READ_ONLY | mf.USE_HOST_PTR, hostbuf=view)
                return _Packed(buf, offsets, items, keep=(view, items))
            except (cl.Error, TypeError, ValueError, BufferError):
                pass  # read-only or otherwise unusable memory: copy it instead
        buf = cl.Buffer(ctx, mf.READ_ONLY, view.nbytes)
        cl.enqueue_copy(queue, buf, view, is_blocking=False)
        return _Packed(buf, offsets, items, keep=(view, items))
    offsets, total = _aligned_offsets(items)
    buf = cl.Buffer(ctx, mf.READ_ONLY, total)
    if runtime.info.is_simulator:
        # Oclgrind 21.10 marks bytes written at a non-zero buffer offset (write or copy) as
        # uninitialised, and clobbers what earlier writes marked: one write from offset 0.
        stage = np.zeros(total, np.uint8)
        for off, im in zip(offsets, items):
            stage[off:off + _span(im)] = _host_span(im)
        cl.enqueue_copy(queue, buf, stage, is_blocking=True)
        return _Packed(buf, offsets, items)
    for off, im in zip(offsets, items):
        cl.enqueue_copy(queue, buf, _host_span(im), dst_offset=off, is_blocking=False)
    return _Packed(buf, offsets, items, keep=tuple(items))


def _pack_device(runtime, items) -> _Packed:
    for i, im in enumerate(items):
        if im.context != runtime.context:
            raise ValueError(f"image {i} lives on another OpenCL context than the selected device "
                             f"({runtime.info.name}); pass device=... to match")
    base = items[0].base_data
    if all(im.base_data == base for im in items):
        # One device allocation (a batch array or views of it): read it in place.
        return _Packed(base, [im.offset for im in items], items)
    offsets, total = _aligned_offsets(items)
    buf = cl.Buffer(runtime.context, cl.mem_flags.READ_ONLY, total)
    if runtime.info.is_simulator:  # see _pack_host: through the host, one write from 0
        stage = np.zeros(total, np.uint8)
        for off, im in zip(offsets, items):
            cl.enqueue_copy(runtime.queue, stage[off:off + _span(im)], im.base_data,
                            src_offset=im.offset, is_blocking=True)
        cl.enqueue_copy(runtime.queue, buf, stage, is_blocking=True)
        return _Packed(buf, offsets, items)
    for off, im in zip(offsets, items):
        cl.enqueue_copy(runtime.queue, buf, im.base_data, byte_count=_span(im),
                        src_offset=im.offset, dst_offset=off)
    return _Packed(buf, offsets, items)


# ----------------------------------------------------------------------------- launching

def _lanes(runtime, dst_w: int) -> int:
    """Destination pixels per work-item: explicit SIMD on CPUs (PoCL does not vectorise
    this gather-heavy kernel across work-items by itself); two on GPUs (on an H200, 1.23x
    faster than one for a batch of 1080p images, and faster than four)."""
    want = 8 if runtime.info.is_cpu else 2
    while dst_w % want:
        want //= 2
    return want


def _fma_name(runtime) -> str:
    """PoCL's library fma is an opaque call that keeps its work-item loops scalar; the
    compiler builtin is the same correctly rounded operation, inlined."""
    return "__builtin_fmaf" if runtime.info.vendor == "pocl" else "fma"


def _launch(runtime, program_name, program, packed: _Packed, d2i: np.ndarray, out_buf,
            dst_w: int, dst_h: int, n_first: int, vec: int, extra_args) -> cl.Event:
    queue = runtime.queue
    n = len(packed.offsets)

    def table(values):  # copied when the buffer is created: no queued transfer per table
        return cl.Buffer(runtime.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                         hostbuf=np.ascontiguousarray(values))

    offs, geom = table(packed.offsets), table(packed.geom)
    mats = table(np.asarray(d2i, dtype=np.float32).reshape(n, 6))
    kernel = templates.kernel(program, program_name)
    gx = dst_w // vec
    wg = arrays.work_group_size(runtime, kernel, 16 if runtime.info.is_cpu else 128)
    lx = min(wg, 1 << max(0, (gx - 1).bit_length()))  # no wider than a row needs
    ly = max(1, wg // lx)
    global_size = (arrays.round_up(gx, lx), arrays.round_up(dst_h, ly), n)
    return kernel(queue, global_size, (lx, ly, 1), packed.buffer, offs, geom, mats, out_buf,
                  np.int32(dst_w), np.int32(dst_h), np.int32(n_first), *extra_args)


def _channels(value, name: str, default=None) -> np.ndarray:
    """A scalar or 3 values, as float64 [3]."""
    v = np.asarray(default if value is None else value, dtype=np.float64).reshape(-1)
    if v.size == 1:
        v = np.repeat(v, 3)
    if v.size != 3 or not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be a finite number or 3 finite numbers, got {value!r}")
    return v


def _border(value, name: str) -> np.ndarray:
    v = _channels(value, name)
    if np.any(v != np.round(v)) or np.any(v < 0) or np.any(v > 255):
        raise ValueError(f"{name} must be integers in [0, 255] (one, or three in the image's "
                         f"BGR order), got {value!r}")
    return v.astype(np.float32)


def _size(size, name: str) -> Tuple[int, int]:
    if np.isscalar(size):
        size = (size, size)
    try:
        w, h = (int(s) for s in size)
        ok = all(float(s) == int(s) for s in size)
    except (TypeError, ValueError):
        w = h = 0
        ok = False
    if not ok or w <= 0 or h <= 0:
        raise ValueError(f"{name} must be (width, height) with positive integers, got {size!r}")
    if 3 * w * h > _INT_MAX:
        raise ValueError(f"{name}={size!r} is too large (over 2^31 values per image)")
    return w, h


def _check_out(out, on_device: bool, shape, dtype, runtime):
    """A caller's output array: exactly the shape and dtype, whole and C-contiguous, on the
    same side (host or device) as the images."""
    out = arrays.check_array(out, "out", [dtype], shape=shape)
    if arrays.is_device_array(out) != on_device:
        raise TypeError("out must be a " + ("pyopencl.array.Array, as the images are"
                                           if on_device else "numpy array, as the images are"))
    if not out.flags.c_contiguous or (on_device and out.offset != 0):
        raise ValueError("out must be a whole C-contiguous array (not a view with an offset)")
    if on_device and out.context != runtime.context:
        raise ValueError(f"out lives on another OpenCL context than {runtime.info.name}")
    if not on_device and not out.flags.writeable:
        raise ValueError("out is read-only")
    return out


def _run(images, name, d2i_of, dst_w, dst_h, border, device, program_name, params,
         out_dtype, out_shape_of, extra_args, zero_copy=None, out=None):
    """Shared by letterbox and warp_affine: pack, launch per chunk, return host or device."""
    runtime = get_runtime(device)
    items, on_device, single = _split_batch(images, name)
    n = len(items)
    if out is not None:
        out = _check_out(out, on_device, out_shape_of(n), out_dtype, runtime)
    d2i = np.stack([d2i_of(im, i) for i, im in enumerate(items)])
    vec = _lanes(runtime, dst_w)
    program = get_program(TEMPLATE, runtime, fma=_fma_name(runtime), vec=vec, **params)
    out_shape = out_shape_of(n)
    per_image = int(np.prod(out_shape[1:])) * np.dtype(out_dtype).itemsize
    limit = _alloc_limit(runtime)
    if zero_copy is None:
        # A CPU device reads and writes numpy memory in place (USE_HOST_PTR): no copies.
        # Not on Oclgrind, whose checks count host-pointer memory as uninitialised.
        zero_copy = runtime.info.is_cpu and not runtime.info.is_simulator
    bargs = tuple(np.float32(b) for b in border) + tuple(extra_args)

    if on_device:
        if n * per_image > limit:
            raise ValueError(f"the output ({n * per_image} bytes) is larger than one buffer may "
                             f"be on {runtime.info.name} ({limit} bytes); pass fewer images")
        if out is None:
            out = arrays.empty(runtime, out_shape, out_dtype)
        for a, b in _chunks(items, per_image, limit, name):
            packed = _pack_device(runtime, items[a:b])
            out.add_event(_launch(runtime, program_name, program, packed, d2i[a:b], out.data,
                                  dst_w, dst_h, a, vec, bargs))
        return out, d2i, single

    result = np.empty(out_shape, out_dtype) if out is None else out
    for a, b in _chunks(items, per_image, limit, name):
        packed = _pack_host(runtime, items[a:b], zero_copy)
        target = result[a:b]
        mf = cl.mem_flags
        if zero_copy:
            out_buf = cl.Buffer(runtime.context, mf.WRITE_ONLY | mf.USE_HOST_PTR, hostbuf=target)
        else:
            out_buf = cl.Buffer(runtime.context, mf.WRITE_ONLY, target.nbytes)
        evt = _launch(runtime, program_name, program, packed, d2i[a:b], out_buf,
                      dst_w, dst_h, 0, vec, bargs)
        if zero_copy:
            # Mapping makes the device's writes visible in host memory (a no-op on PoCL).
            mapped, _ = cl.enqueue_map_buffer(runtime.queue, out_buf, cl.map_flags.READ, 0,
                                              target.shape, target.dtype, wait_for=[evt],
                                              is_blocking=True)
            mapped.base.release(runtime.queue)
        else:
            cl.enqueue_copy(runtime.queue, target, out_buf, wait_for=[evt], is_blocking=True)
        del packed  # the launch is complete: the host memory it read may go
    return result, d2i, single


# ----------------------------------------------------------------------------- public API

def letterbox(images, size=(640, 640), fill=114, swap_rb: bool = True, mean=(0, 0, 0),
              std=(1, 1, 1), alpha: float = 1 / 255, beta=None, dtype=np.float32, out=None,
              device=None, _zero_copy=None):
    """Letterbox uint8 BGR images into a planar float blob, in one kernel launch.

    ``images``: one ``[H, W, 3]`` uint8 BGR image, a list of them (sizes may differ), a
    ``[N, H, W, 3]`` batch, or the same as ``pyopencl.array.Array`` (then the blob stays on
    the device). Rows may be padded and pixels spaced (e.g. ``bgra[..., :3]``): strided numpy
    views are read in place. ``size``: blob ``(width, height)``. ``fill``: the border level
    (one or three, BGR). ``swap_rb``: blob channels RGB. Each value is ``(v * alpha - mean) /
    std`` per blob channel (``mean`` and ``std`` in blob channel order), or ``v * alpha + beta``
    when ``beta`` is given; ``v`` is the warped level, an integer as in OpenCV's uint8 output.
    ``dtype``: float32, or float16 storage. ``out``: an array to write the blob into (the
    exact shape and dtype, on the host or device like the images), reused across calls.

    Returns ``(blob, d2i)``: ``blob`` is ``[N, 3, height, width]`` (N = 1 for one image), and
    ``d2i`` the destination-to-source matrices, ``[2, 3]`` for one image or ``[N, 2, 3]``,
    float64; ``scale_boxes(boxes, d2i)`` maps detections back.
    """
    dst_w, dst_h = _size(size, "size")
    border = _border(fill, "fill")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float16):
        raise TypeError(f"dtype must be np.float32 or np.float16 (storage), not {dtype}")
    alpha = float(alpha)
    if not np.isfinite(alpha):
        raise ValueError(f"alpha must be finite, got {alpha}")
    if beta is not None:
        mean_given = np.any(_channels(mean, "mean", 0) != 0)
        std_given = np.any(_channels(std, "std", 1) != 1)
        if mean_given or std_given:
            raise ValueError("give either beta (v * alpha + beta) or mean/std "
                             "((v * alpha - mean) / std), not both")
        scale = np.full(3, alpha)
        shift = _channels(beta, "beta")
    else:
        mean = _channels(mean, "mean", 0)
        std = _channels(std, "std", 1)
        if np.any(std == 0):
            raise ValueError(f"std must not contain 0, got {std.tolist()}")
        scale, shift = alpha / std, -mean / std

    def d2i_of(im, i):
        h, w = im.shape[:2]
        i2d = letterbox_matrix((w, h), (dst_w, dst_h))
        return _invert_affine(i2d, f"the letterbox matrix of image {i}")

    runtime = get_runtime(device)
    st = storage(dtype, runtime)  # compares by dtype: the render cache still hits
    out, d2i, single = _run(
        images, "images", d2i_of, dst_w, dst_h, border, runtime, "letterbox_blob",
        dict(mode="blob", st=st, swap_rb=bool(swap_rb)), dtype,
        lambda n: (n, 3, dst_h, dst_w),
        tuple(np.float32(v) for v in scale) + tuple(np.float32(v) for v in shift),
        zero_copy=_zero_copy, out=out)
    return out, (d2i[0] if single else d2i)


def warp_affine(image, M, dsize, border_value=114, device=None, _zero_copy=None):
    """OpenCV's ``warpAffine(image, M, dsize, INTER_LINEAR, BORDER_CONSTANT, border_value)``.

    ``image``: uint8 ``[H, W, 3]`` (host or device; strided views read in place). ``M``: 2x3,
    source to destination, as ``cv2.warpAffine`` takes it. ``dsize``: ``(width, height)``.
    Returns uint8 ``[height, width, 3]``, on the device if ``image`` was.
    """
    dst_w, dst_h = _size(dsize, "dsize")
    border = _border(border_value, "border_value")
    M = arrays.check_array(M, "M", [np.float64, np.float32, np.int64, np.int32], shape=(2, 3))
    if arrays.is_device_array(M):
        raise TypeError("M must be a host array (2x3 numbers), not a device array")
    d2i = _invert_affine(M.astype(np.float64), "M")
    if isinstance(image, (list, tuple)):
        raise TypeError("image must be one [H, W, 3] array; warp a list image by image")
    if arrays.is_device_array(image) or isinstance(image, np.ndarray):
        if image.ndim != 3:
            raise ValueError(f"image must be one [H, W, 3] image, got shape {tuple(image.shape)}")
    out, _, _ = _run(image, "image", lambda im, i: d2i, dst_w, dst_h, border, device,
                     "warp_hwc", dict(mode="hwc", st=None, swap_rb=False), np.uint8,
                     lambda n: (n, dst_h, dst_w, 3), (), zero_copy=_zero_copy)
    return out[0] if not arrays.is_device_array(out) else out.reshape(dst_h, dst_w, 3)

