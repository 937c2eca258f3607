"""Fused warp-affine preprocessing: letterbox + BGR->RGB + normalise + HWC->CHW in one kernel.

``letterbox(images, size=(640, 640), ...)`` turns uint8 BGR images (one, a list that may mix
sizes, a ``[N, H, W, 3]`` batch, or device arrays) into the planar float blob a detector
eats, plus the destination-to-source matrices ``d2i`` that ``scale_boxes`` uses to map boxes
back. ``warp_affine(image, M, dsize)`` is OpenCV's ``warpAffine`` alone (uint8 HWC out).

Sampling is OpenCV's INTER_LINEAR with BORDER_CONSTANT, computed the way OpenCV >= 4.11
computes it for 8-bit images (float coordinates, one fma per lerp, round half to even), so
results equal OpenCV's on all but a few values per million and never differ by more than one
level. The kernel is ``warp_affine.cl.mako`` beside this file; the image handling is in
:mod:`clkernels.warp_affine_images` and the plans in :mod:`clkernels.warp_affine_plan`.

Built on :mod:`clkernels.launch`: the images' lists of mixed sizes do not fit an ``Op``'s
fixed parameters, so this module uses its pieces. The runtime comes from the images (or
``device=`` / ``queue=``); a plan is cached per call signature (images' geometry, options,
output size, kernel mapping) in ``runtime.plans`` and holds its own kernel objects with every
fixed argument set, the letterbox matrices and the batch's table already on the device. A
repeat call checks the images, wraps or packs them, sets the buffers and enqueues. One image
takes its geometry and matrix as scalar arguments (no table); packed inputs, device outputs
and host-copy outputs come from the queue's memory pool.
"""
from __future__ import annotations

from typing import NamedTuple, Tuple

import numpy as np
import pyopencl as cl

from . import arrays, launch, multi_device, simulator
from .warp_affine_images import _INT_MAX, _MappedResult, _pack_device, _pack_host, _split_batch
# _run reads the per-device choices (_lanes, _fma_name, _unaligned_io, _alloc_limit) through
# these names: tests and benchmarks override them on this module.
from .warp_affine_plan import (TEMPLATE, _alloc_limit, _fma_name, _lanes, _matrix_arg, _Plan,
                               _unaligned_io)

__all__ = ["letterbox", "warp_affine", "scale_boxes", "letterbox_matrix"]


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


# ----------------------------------------------------------------------------- options

class _Spec(NamedTuple):
    """What a call computes besides its images (hashable: part of the plan's key)."""
    kernel: str       # "letterbox_blob" or "warp_hwc"
    dst_w: int
    dst_h: int
    border: tuple     # 3 levels, BGR
    values: tuple     # letterbox: scale0-2, shift0-2 per blob channel; warp: ()
    swap_rb: bool
    dtype: np.dtype   # of the result


_specs: dict = {}


def _cached_spec(make, *values) -> _Spec:
    """``make(*values)``, checked once per distinct set of option values (the checks cost
    more than a launch; a process uses a handful of option sets)."""
    key = (make, values, tuple(map(type, values)))
    try:
        return _specs[key]
    except KeyError:
        pass
    except TypeError:   # an unhashable option (a numpy array): checked on every call
        return make(*values)
    spec = make(*values)
    if len(_specs) < 1024:
        _specs[key] = spec
    return spec


def _channels(value, name: str, default=None) -> np.ndarray:
    """A scalar or 3 values, as float64 [3]."""
    v = np.asarray(default if value is None else value, dtype=np.float64).reshape(-1)
    if v.size == 1:
        v = np.repeat(v, 3)
    if v.size != 3 or not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be a finite number or 3 finite numbers, got {value!r}")
    return v


def _border(value, name: str) -> tuple:
    v = _channels(value, name)
    if np.any(v != np.round(v)) or np.any(v < 0) or np.any(v > 255):
        raise ValueError(f"{name} must be integers in [0, 255] (one, or three in the image's "
                         f"BGR order), got {value!r}")
    return tuple(float(b) for b in v)


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


def _letterbox_spec(size, fill, swap_rb, mean, std, alpha, beta, dtype) -> _Spec:
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
        scale, shift = np.full(3, alpha), _channels(beta, "beta")
    else:
        mean, std = _channels(mean, "mean", 0), _channels(std, "std", 1)
        if np.any(std == 0):
            raise ValueError(f"std must not contain 0, got {std.tolist()}")
        scale, shift = alpha / std, -mean / std
    values = tuple(float(np.float32(v)) for v in (*scale, *shift))
    return _Spec("letterbox_blob", dst_w, dst_h, border, values, bool(swap_rb), dtype)


def _warp_spec(dsize, border_value) -> _Spec:
    dst_w, dst_h = _size(dsize, "dsize")
    return _Spec("warp_hwc", dst_w, dst_h, _border(border_value, "border_value"), (), False,
                 np.dtype(np.uint8))


_inverses: dict = {}


def _inverse_of(M) -> np.ndarray:
    """warp_affine's destination-to-source matrix for ``M``, checked and inverted once per
    distinct matrix (a video pipeline warps with the same one again and again)."""
    if type(M) is np.ndarray and M.shape == (2, 3):
        key = (M.dtype.str, M.tobytes())
        d2i = _inverses.get(key)
        if d2i is None:
            d2i = _invert_affine(_checked_matrix(M), "M")
            if len(_inverses) > 256:
                _inverses.clear()
            _inverses[key] = d2i
        return d2i
    return _invert_affine(_checked_matrix(M), "M")


def _checked_matrix(M):
    M = arrays.check_array(M, "M", [np.float64, np.float32, np.int64, np.int32], shape=(2, 3))
    if arrays.is_device_array(M):
        raise TypeError("M must be a host array (2x3 numbers), not a device array")
    return M


# ----------------------------------------------------------------------------- a call

def _check_out(out, on_device: bool, shape, dtype, runtime):
    """A caller's output array: exactly the shape and dtype, whole and C-contiguous, on the
    same side (host or device) as the images."""
    if (not on_device and type(out) is np.ndarray and out.shape == shape and out.dtype == dtype
            and out.flags.c_contiguous and out.flags.writeable):
        return out   # the common case, in a few attribute reads
    out = arrays.check_array(out, "out", [dtype], shape=shape)
    if arrays.is_device_array(out) != on_device:
        raise TypeError("out must be a " + ("pyopencl.array.Array, as the images are"
                                           if on_device else "numpy array, as the images are"))
    if not out.flags.c_contiguous or (on_device and out.offset != 0):
        raise ValueError("out must be a whole C-contiguous array (not a view with an offset)")
    if on_device and out.context != runtime.context:
        raise ValueError(f"out lives on another OpenCL context than the images' "
                         f"({runtime.info.name}); make it on their context")
    if not on_device and not out.flags.writeable:
        raise ValueError("out is read-only")
    return out


def _run(images, name: str, spec: _Spec, out, device, queue, zero_copy, d2i=None):
    """Shared by letterbox and warp_affine: returns (result, plan, single)."""
    items, geoms, on_device, single = _split_batch(images, name)
    rt = launch.runtime_for(items, device, queue)
    if on_device:
        for i, im in enumerate(items):
            arrays.check_context(rt, im, f"{name}[{i}]")
    # The plan by the call's own key first: the device-derived parts of the full key (lanes,
    # FMA, alignment, allocation limit) are the same for every call on this runtime.
    plan = rt.plans.get((_run, spec, geoms, on_device))
    if plan is None:
        key = (TEMPLATE, spec, geoms, on_device, _lanes(rt, spec.dst_w), _fma_name(rt),
               _unaligned_io(rt), _alloc_limit(rt))
        plan = rt.plans.get(key)
        if plan is None:
            plan = rt.plans[key] = _Plan(rt, spec, geoms, on_device, *key[4:], name)
        rt.plans[_run, spec, geoms, on_device] = plan
    limit = plan.alloc_limit
    if out is not None:
        out = _check_out(out, on_device, plan.out.shape, plan.out.dtype, rt)
    matrix = _matrix_arg(d2i) if plan.matrix_per_call else None
    inputs, outputs, temps, wait, pending = [], [], [], [], []
    q = rt.queue
    if on_device:
        if out is None:   # pooled, and back to the pool when the caller drops it
            out = launch._wrap(rt, plan.out, rt.pool.allocate(plan.out.nbytes))
        for chunk in plan.chunks:
            buf, offsets = _pack_device(rt, items[chunk.start:chunk.stop], chunk, wait)
            inputs.append(buf)
            outputs.append(out.base_data)
            temps.append(None if plan.single else chunk.device_table(rt, offsets))
        events = plan.enqueue(q, inputs, outputs, temps, wait or None, offsets[0], matrix)
        out.add_event(events[-1])
        return out, plan, single

    if zero_copy is None:
        zero_copy = simulator.zero_copy_ok(rt)
    whole = len(plan.chunks) == 1
    # Zero-copy and no out=: the result is a mapping of a pooled buffer (a fresh numpy array
    # per call would be fresh memory, and its page faults cost more than the kernel).
    mapped = zero_copy and out is None and whole
    if not mapped and out is None:
        out = np.empty(plan.out.shape, plan.out.dtype)
    mf, targets = cl.mem_flags, []
    for chunk in plan.chunks:
        items_c = items[chunk.start:chunk.stop]
        buf, offsets = _pack_host(rt, items_c, chunk, zero_copy, limit, pending)
        inputs.append(buf)
        target = None if mapped else out if whole else out[chunk.start:chunk.stop]
        if mapped:
            outputs.append(rt.pool.allocate(plan.out.nbytes))
        elif zero_copy:   # the kernel writes the numpy memory in place
            outputs.append(cl.Buffer(rt.context, mf.WRITE_ONLY | mf.USE_HOST_PTR, hostbuf=target))
        else:
            outputs.append(rt.pool.allocate(target.nbytes))
        temps.append(None if plan.single else chunk.device_table(rt, offsets))
        targets.append(target)
    plan.enqueue(q, inputs, outputs, temps, None, offsets[0], matrix)
    if mapped:
        out = _MappedResult.array(q, outputs[0], plan.out)
    elif zero_copy:
        for target, buf in zip(targets, outputs):
            # Mapping makes the device's writes visible in host memory (a no-op on PoCL).
            view, _ = cl.enqueue_map_buffer(q, buf, cl.map_flags.READ, 0, target.shape,
                                            target.dtype, is_blocking=True)
            view.base.release(q)
    else:
        for i, (target, buf) in enumerate(zip(targets, outputs)):
            cl.enqueue_copy(q, target, buf, is_blocking=i == len(targets) - 1)
    del pending   # the transfers are complete: the host memory they read may go
    return out, plan, single


# ----------------------------------------------------------------------------- public API

def letterbox(images, size=(640, 640), fill=114, swap_rb: bool = True, mean=(0, 0, 0),
              std=(1, 1, 1), alpha: float = 1 / 255, beta=None, dtype=np.float32, out=None,
              device=None, queue=None, _zero_copy=None, devices=None):
    """Letterbox uint8 BGR images into a planar float blob, in one kernel launch.

    ``images``: one ``[H, W, 3]`` uint8 BGR image, a list of them (sizes may differ), a
    ``[N, H, W, 3]`` batch, or the same as ``pyopencl.array.Array`` (then the blob stays on
    the device, on the images' context and queue). Rows may be padded and pixels spaced (e.g.
    ``bgra[..., :3]``): strided numpy views are read in place. ``size``: blob ``(width,
    height)``. ``fill``: the border level (one or three, BGR). ``swap_rb``: blob channels RGB.
    Each value is ``(v * alpha - mean) / std`` per blob channel (``mean`` and ``std`` in blob
    channel order), or ``v * alpha + beta`` when ``beta`` is given; ``v`` is the warped level,
    an integer as in OpenCV's uint8 output. ``dtype``: float32, or float16 storage. ``out``:
    an array to write the blob into (the exact shape and dtype, on the host or device like the
    images), reused across calls. ``device``/``queue``: where to run (default: where device
    images live, else the selected device).

    Returns ``(blob, d2i)``: ``blob`` is ``[N, 3, height, width]`` (N = 1 for one image), and
    ``d2i`` the destination-to-source matrices, ``[2, 3]`` for one image or ``[N, 2, 3]``,
    float64; ``scale_boxes(boxes, d2i)`` maps detections back.

    ``devices``: several devices (or ``"all"``) that share the images of a host batch (a list
    or an ``[N, H, W, 3]`` array), each its own range (:mod:`clkernels.multi_device`).
    """
    spec = _cached_spec(_letterbox_spec, size, fill, swap_rb, mean, std, alpha, beta, dtype)
    if devices is not None:
        if isinstance(images, np.ndarray) and images.ndim == 3:
            raise ValueError("devices= shares a batch among devices: pass a list of images or an "
                             "[N, H, W, 3] array (one image runs on one device: device=)")

        def one_range(batch, out, device):
            blob, plan, _ = _run(batch, "images", spec, out[0], device, None, _zero_copy)
            return blob, plan.d2i.copy()
        return multi_device.batched("letterbox", one_range, (images,), devices, out=(out, None),
                                    n_outputs=2, device=device, queue=queue)
    blob, plan, single = _run(images, "images", spec, out, device, queue, _zero_copy)
    return blob, (plan.d2i[0].copy() if single else plan.d2i.copy())


def warp_affine(image, M, dsize, border_value=114, out=None, device=None, queue=None,
                _zero_copy=None):
    """OpenCV's ``warpAffine(image, M, dsize, INTER_LINEAR, BORDER_CONSTANT, border_value)``.

    ``image``: uint8 ``[H, W, 3]`` (host or device; strided views read in place). ``M``: 2x3,
    source to destination, as ``cv2.warpAffine`` takes it. ``dsize``: ``(width, height)``.
    Returns uint8 ``[height, width, 3]``, on the device (the image's context and queue) if
    ``image`` was. ``out``: an array of that shape and dtype to write into, in that form.
    """
    spec = _cached_spec(_warp_spec, dsize, border_value)
    d2i = _inverse_of(M)
    if isinstance(image, (list, tuple)):
        raise TypeError("image must be one [H, W, 3] array; warp a list image by image")
    if arrays.is_device_array(image) or isinstance(image, np.ndarray):
        if image.ndim != 3:
            raise ValueError(f"image must be one [H, W, 3] image, got shape {tuple(image.shape)}")
    return _run(image, "image", spec, out, device, queue, _zero_copy, d2i)[0]
