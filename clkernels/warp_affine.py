"""Fused warp-affine preprocessing: letterbox + BGR->RGB + normalise + HWC->CHW in one kernel.

``letterbox(images, size=(640, 640), ...)`` turns uint8 BGR images (one, a list that may mix
sizes, a ``[N, H, W, 3]`` batch, or device arrays) into the planar float blob a detector
eats, plus the destination-to-source matrices ``d2i`` that ``scale_boxes`` uses to map boxes
back. ``warp_affine(image, M, dsize)`` is OpenCV's ``warpAffine`` alone (uint8 HWC out).

Sampling is OpenCV's INTER_LINEAR with BORDER_CONSTANT, computed the way OpenCV >= 4.11
computes it for 8-bit images (float coordinates, one fma per lerp, round half to even), so
results equal OpenCV's on all but a few values per million and never differ by more than one
level. The kernel is ``warp_affine.cl.mako`` beside this file.

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
import pyopencl.array as cla

from . import arrays, launch, simulator
from .launch import INPUT, OUTPUT, TEMP
from .templates import Storage

__all__ = ["letterbox", "warp_affine", "scale_boxes", "letterbox_matrix"]

TEMPLATE = "clkernels/warp_affine.cl.mako"
_ALIGN = 64           # byte alignment of each image inside a packed buffer
_INT_MAX = 2**31 - 1  # per-image byte offsets and pixel counts are int in the kernel
_MAX_SIDE = 2**22     # the kernel's float floor is exact below this
_TABLE_INTS = 16      # per image in a batch's table: ulong offset, H, W, pitch, step, d2i, pad


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

_UINT8 = np.dtype(np.uint8)
_geometries: dict = {}   # (shape, strides) of images that passed the checks -> geometry


def _check_image(img, name: str):
    """(image, its (height, width, row pitch, pixel step) in bytes) of a uint8 [H, W, 3] host
    or device array whose channels are consecutive bytes; errors name the image."""
    if (type(img) is np.ndarray or isinstance(img, cla.Array)) and img.dtype == _UINT8:
        geom = _geometries.get((img.shape, img.strides))
        if geom is not None:   # checked before: the checks depend on nothing else
            return img, geom
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
    geom = (h, w, pitch, step)
    if _span(geom) > _INT_MAX:
        raise ValueError(f"{name} spans {_span(geom)} bytes; images over 2 GiB are not supported "
                         "(split or resize it first)")
    if len(_geometries) < 4096:
        _geometries[(tuple(img.shape), tuple(img.strides))] = geom
    return img, geom


def _split_batch(images, name: str):
    """(images as a list, their geometries, is_device, was_single)."""
    if type(images) is np.ndarray and images.ndim == 3:   # one host image: the common call
        return [images], (_check_image(images, name)[1],), False, True
    if isinstance(images, (list, tuple)):
        if not images:
            raise ValueError(f"{name} is an empty list")
        checked, single = [_check_image(im, f"{name}[{i}]") for i, im in enumerate(images)], False
    else:
        if not arrays.is_device_array(images) and not isinstance(images, np.ndarray):
            images = np.asarray(images)
        if images.ndim == 4:
            if images.shape[0] == 0:
                raise ValueError(f"{name} is an empty batch (shape {tuple(images.shape)})")
            checked = [_check_image(images[i], f"{name}[{i}]") for i in range(images.shape[0])]
            single = False
        else:
            checked, single = [_check_image(images, name)], True
    items = [im for im, _ in checked]
    kinds = {arrays.is_device_array(im) for im in items}
    if len(kinds) > 1:
        raise TypeError(f"{name} mixes numpy and device arrays; pass all of one kind")
    return items, tuple(g for _, g in checked), kinds.pop(), single


def _span(geom) -> int:
    """Bytes from an image's first byte to its last, of its (h, w, pitch, step)."""
    h, w, pitch, step = geom
    return (h - 1) * pitch + (w - 1) * step + 3


def _host_span(img: np.ndarray, size: int) -> np.ndarray:
    """``size`` bytes from the image's first byte, as a 1-D view of the same memory (no copy)."""
    if img.flags.c_contiguous and img.nbytes == size:
        return img.reshape(-1)   # already one run of bytes (as_strided costs microseconds)
    return np.lib.stride_tricks.as_strided(img, shape=(size,), strides=(1,))


def _address(img: np.ndarray) -> int:
    return img.__array_interface__["data"][0]


def _owner(img: np.ndarray):
    while isinstance(img.base, np.ndarray):
        img = img.base
    return img if img.base is None else img.base


def _shared_span(items, spans, limit: int):
    """(view, offsets) when every image lies in one numpy allocation (a batch array, views or
    crops of one image) and the bytes between them are few: one transfer then covers them
    all. None otherwise."""
    if len(items) == 1:
        return _host_span(items[0], spans[0]), (0,)
    owner = _owner(items[0])
    if any(_owner(im) is not owner for im in items[1:]):
        return None
    starts = [_address(im) for im in items]
    lo = min(starts)
    hi = max(a + s for a, s in zip(starts, spans))
    if hi - lo > 2 * sum(spans) or hi - lo > limit:
        return None
    first = items[starts.index(lo)]
    return _host_span(first, hi - lo), tuple(a - lo for a in starts)


def _aligned_offsets(spans):
    offsets, total = [], 0
    for span in spans:
        offsets.append(total)
        total += arrays.round_up(span, _ALIGN)
    return tuple(offsets), total


def _chunks(spans, out_bytes_per_image: int, limit: int, name: str):
    """Split the batch into runs whose packed input and output each fit one buffer."""
    runs, start, used = [], 0, 0
    for i, span in enumerate(spans):
        need = arrays.round_up(span, _ALIGN)
        if need > limit or out_bytes_per_image > limit:
            raise ValueError(
                f"{name}[{i}] needs {max(need, out_bytes_per_image)} bytes in one buffer, more "
                f"than this device allows ({limit} bytes, CL_DEVICE_MAX_MEM_ALLOC_SIZE); "
                "resize it on the host first or pick a device with more memory")
        if i > start and (used + need > limit or (i - start + 1) * out_bytes_per_image > limit):
            runs.append((start, i))
            start, used = i, 0
        used += need
    runs.append((start, len(spans)))
    return runs


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


# ----------------------------------------------------------------------------- plans

def _lanes(runtime, dst_w: int) -> int:
    """Destination pixels per work-item: explicit SIMD on CPUs (PoCL does not vectorise
    this gather-heavy kernel across work-items by itself; with word loads 16 measured 7%
    faster than 8 on the 2-core EPYC, 8 faster than 16 with byte loads); two on GPUs (on an
    H200, 1.23x faster than one for a batch of 1080p images, and faster than four)."""
    want = 16 if runtime.info.is_cpu else 2
    while dst_w % want:
        want //= 2
    return want


def _fma_name(runtime) -> str:
    """PoCL's library fma is an opaque call that keeps its work-item loops scalar; the
    compiler builtin is the same correctly rounded operation, inlined."""
    return "__builtin_fmaf" if runtime.info.vendor == "pocl" else "fma"


def _unaligned_io(runtime) -> bool:
    """Whether loads and stores at any alignment are single instructions (CPUs): a corner's
    three channels are then read as one 4-byte word and a blob row stored as one vector, both
    through packed structs (PoCL makes vloadn/vstoren library calls). GPUs read bytes and
    store with vstoren. On the 2-core EPYC the two took 25-30% off the 1080p letterbox."""
    return runtime.info.is_cpu


def _alloc_limit(runtime) -> int:
    """The largest buffer one launch may use (the device's max allocation)."""
    return int(runtime.info.max_alloc_bytes)


def _work_group(runtime, kernel, gx: int) -> Tuple[int, int]:
    """(lx, ly). CPUs: a destination row of work-items per group (PoCL runs a group as one
    loop; on the 2-core EPYC rows of 80 measured 5% faster than groups of 16, and rows keep
    the groups many enough to balance the cores). GPUs: 128 work-items, a row of them no
    wider than a row needs."""
    limit = min(runtime.info.max_work_group_size, kernel.get_work_group_info(
        cl.kernel_work_group_info.WORK_GROUP_SIZE, runtime.device))
    if runtime.info.is_cpu:
        return min(gx, limit), 1
    wg = arrays.work_group_size(runtime, kernel, 128)
    lx = min(wg, 1 << max(0, (gx - 1).bit_length()))
    return lx, max(1, wg // lx)


class _Chunk:
    """One launch of a plan: images [start, stop), their packing when packed separately,
    and (batches) the table of their offsets, geometry and matrices."""

    __slots__ = ("start", "stop", "spans", "offsets", "total", "table", "uploaded")

    def __init__(self, start, stop, spans, table=None):
        self.start, self.stop, self.spans = start, stop, spans
        self.offsets, self.total = _aligned_offsets(spans)
        self.table = table          # host int32 [k, 16], offsets patched per call
        self.uploaded = None        # (offsets, device table) of the last upload

    def device_table(self, rt, offsets):
        """The device table for these image offsets: the last one uploaded when they are the
        same (every repeat call of a fixed layout), else a new one."""
        uploaded = self.uploaded    # read once: another thread may replace it
        if uploaded is not None and uploaded[0] == offsets:
            return uploaded[1]
        host = self.table.copy()
        host.view(np.uint64)[:, 0] = offsets
        buf = cl.Buffer(rt.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                        hostbuf=host)
        self.uploaded = (offsets, buf)
        return buf


class _Plan:
    """What every call with one signature needs, made on its first call: the chunks with a
    launch each (own kernel, fixed arguments set), the output's spec, the letterbox matrices.

    The buffers of chunk c's launch are set per call from INPUT c (its images), OUTPUT c and
    TEMP c (a batch's table). One image's byte offset in its buffer (0 unless it is a view of
    a device array) and warp_affine's matrix are the only scalars set per call
    (:meth:`enqueue`)."""

    def __init__(self, rt, spec: _Spec, geoms, on_device: bool, vec: int, fma: str,
                 unaligned: bool, limit: int, name: str):
        n = len(geoms)
        self.single = n == 1
        if spec.kernel == "letterbox_blob":
            self.out = launch.Buffer("out", (n, 3, spec.dst_h, spec.dst_w), spec.dtype)
            self.d2i = np.stack([_invert_affine(letterbox_matrix((w, h), (spec.dst_w, spec.dst_h)),
                                                f"the letterbox matrix of image {i}")
                                 for i, (h, w, _, _) in enumerate(geoms)])
            self.matrix_per_call = False
        else:
            self.out = launch.Buffer("out", (spec.dst_h, spec.dst_w, 3), spec.dtype)
            self.d2i, self.matrix_per_call = None, True
        per_image = self.out.nbytes // n
        if on_device and self.out.nbytes > limit:
            raise ValueError(f"the output ({self.out.nbytes} bytes) is larger than one buffer "
                             f"may be on {rt.info.name} ({limit} bytes); pass fewer images")
        spans = [_span(g) for g in geoms]
        st = Storage(spec.dtype) if spec.kernel == "letterbox_blob" else None
        # Letterbox matrices have no rotation or shear: the source row is one per work-item.
        # Word loads need 4 bytes in every image (all but 1x1 images), bytes in little-endian
        # order.
        program = launch.program(rt, TEMPLATE, fma=fma, vec=vec, single=self.single,
                                 mode="blob" if st else "hwc", st=st, swap_rb=spec.swap_rb,
                                 axis_aligned=spec.kernel == "letterbox_blob",
                                 word_loads=unaligned and min(spans) >= 4
                                 and bool(rt.device.endian_little),
                                 packed_stores=unaligned)
        gx = spec.dst_w // vec
        scalars = [np.float32(v) for v in (*spec.border, *spec.values)]
        self.chunks, steps = [], []
        for c, (a, b) in enumerate(_chunks(spans, per_image, limit, name)):
            kernel = launch.kernel_for_plan(program, spec.kernel)
            lx, ly = _work_group(rt, kernel, gx)
            size = (arrays.round_up(gx, lx), arrays.round_up(spec.dst_h, ly), b - a)
            n_first = np.int32(a if on_device else 0)   # host chunks have outputs of their own
            tail = [np.int32(spec.dst_w), np.int32(spec.dst_h), n_first, *scalars]
            if self.single:
                slots = [(0, INPUT, c), (7, OUTPUT, c)]
                fixed = [(1, np.uint64(0))] + [(2 + i, np.int32(v)) for i, v in enumerate(geoms[0])]
                if not self.matrix_per_call:
                    fixed.append((6, _float8(self.d2i[0])))
                fixed += [(8 + i, v) for i, v in enumerate(tail)]
                table = None
            else:
                slots = [(0, INPUT, c), (1, TEMP, c), (2, OUTPUT, c)]
                fixed = [(3 + i, v) for i, v in enumerate(tail)]
                table = np.zeros((b - a, _TABLE_INTS), np.int32)
                table[:, 2:6] = geoms[a:b]
                table[:, 6:12] = self.d2i[a:b].reshape(b - a, 6).astype(np.float32).view(np.int32)
            chunk = _Chunk(a, b, spans[a:b], table)
            if table is not None:
                chunk.device_table(rt, chunk.offsets)   # the layout of separately packed images
            self.chunks.append(chunk)
            steps.append(launch.Step(kernel, size, (lx, ly, 1), slots, fixed))
        self.launch = launch.Plan([self.out], steps)
        # pyopencl's set_arg tries the argument as every kind of object before raw bytes
        # (about 9 us a scalar); the setter its own generated invokers use takes the bytes.
        self.setters = [getattr(s.kernel, "_set_arg_buf", s.kernel.set_arg) for s in steps]
        self.offsets = [0] * len(steps)   # one image's src_off as last set, per launch
        self.matrices = [None] * len(steps)   # and its matrix (the cached float8 object)

    def enqueue(self, queue, inputs, outputs, temps, wait, offset=0, matrix=None):
        """Launch every chunk with these buffers (one image: at byte ``offset`` of its buffer,
        with this float8 ``matrix`` when the plan takes one per call); returns the events."""
        events = []
        sources = (inputs, outputs, temps)
        with self.launch.lock:   # scalars, buffers and enqueue must not interleave across threads
            for c, step in enumerate(self.launch.steps):
                if self.single:
                    if offset != self.offsets[c]:
                        self.setters[c](1, np.uint64(offset))
                        self.offsets[c] = offset
                    if matrix is not None and matrix is not self.matrices[c]:
                        self.setters[c](6, matrix)
                        self.matrices[c] = matrix
                events.append(step.launch(queue, sources, wait if not events else None))
        return events


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


_matrix_args: dict = {}


def _matrix_arg(d2i: np.ndarray) -> np.ndarray:
    """The float8 argument of a matrix, one object per distinct matrix, so that a plan sees by
    identity that the argument it set last is still the one wanted."""
    key = d2i.tobytes()
    arg = _matrix_args.get(key)
    if arg is None:
        if len(_matrix_args) > 256:
            _matrix_args.clear()
        arg = _matrix_args[key] = _float8(d2i)
    return arg


def _float8(d2i) -> np.ndarray:
    """A 2x3 matrix as the kernel's float8 argument (two entries unused)."""
    m = np.zeros(8, np.float32)
    m[:6] = np.asarray(d2i, np.float64).reshape(6)
    return m


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


def _pack_host(rt, items, chunk: _Chunk, zero_copy: bool, limit: int, pending: list):
    """(buffer, offsets) of a chunk's host images: their own memory read in place (CPU), or
    one pooled buffer written by one transfer where they share an allocation, else packed."""
    mf = cl.mem_flags
    shared = _shared_span(items, chunk.spans, limit)
    if shared is not None:
        view, offsets = shared
        if zero_copy:
            # CPU device: the kernel reads the numpy memory in place, padding and all.
            try:
                return cl.Buffer(rt.context, mf.READ_ONLY | mf.USE_HOST_PTR, hostbuf=view), offsets
            except (cl.Error, TypeError, ValueError, BufferError):
                pass  # read-only or otherwise unusable memory: copy it instead
        buf = rt.pool.allocate(view.nbytes)
        pending.append(cl.enqueue_copy(rt.queue, buf, view, is_blocking=False))
        return buf, offsets
    buf = rt.pool.allocate(chunk.total)
    if simulator.single_write_from_offset_zero(rt):
        stage = np.zeros(chunk.total, np.uint8)
        for off, span, im in zip(chunk.offsets, chunk.spans, items):
            stage[off:off + span] = _host_span(im, span)
        cl.enqueue_copy(rt.queue, buf, stage, is_blocking=True)
    else:
        for off, span, im in zip(chunk.offsets, chunk.spans, items):
            pending.append(cl.enqueue_copy(rt.queue, buf, _host_span(im, span), dst_offset=off,
                                           is_blocking=False))
    return buf, chunk.offsets


def _pack_device(rt, items, chunk: _Chunk, wait: list):
    """(buffer, offsets) of a chunk's device images: read in place when they share one
    allocation (a batch array, views of it), else packed into a pooled buffer."""
    base = items[0].base_data
    if all(im.base_data == base for im in items):
        offsets = tuple(int(im.offset) for im in items)
        size = base.size
        if any(off + span > size for off, span in zip(offsets, chunk.spans)):
            raise AssertionError("image outside its buffer")  # must never become a stray read
        for im in items:
            wait.extend(im.events)
        return base, offsets
    buf = rt.pool.allocate(chunk.total)
    q = rt.queue
    if simulator.single_write_from_offset_zero(rt):   # through the host, one write from 0
        stage = np.zeros(chunk.total, np.uint8)
        for off, span, im in zip(chunk.offsets, chunk.spans, items):
            cl.enqueue_copy(q, stage[off:off + span], im.base_data, src_offset=im.offset,
                            wait_for=im.events or None, is_blocking=True)
        cl.enqueue_copy(q, buf, stage, is_blocking=True)
    else:
        for off, span, im in zip(chunk.offsets, chunk.spans, items):
            cl.enqueue_copy(q, buf, im.base_data, byte_count=span, src_offset=im.offset,
                            dst_offset=off, wait_for=im.events or None)
    return buf, chunk.offsets


def _run(images, name: str, spec: _Spec, out, device, queue, zero_copy, d2i=None):
    """Shared by letterbox and warp_affine: returns (result, plan, single)."""
    items, geoms, on_device, single = _split_batch(images, name)
    rt = launch.runtime_for(items, device, queue)
    if on_device:
        for i, im in enumerate(items):
            if im.context != rt.context:
                raise ValueError(
                    f"{name}[{i}] lives on another OpenCL context than the one this call runs on "
                    f"({rt.info.name}, chosen by device= or queue=): leave device= and queue= out "
                    "to run where the images live, or copy them to that context")
    limit = _alloc_limit(rt)
    key = (TEMPLATE, spec, geoms, on_device, _lanes(rt, spec.dst_w), _fma_name(rt),
           _unaligned_io(rt), limit)
    plan = rt.plans.get(key)
    if plan is None:
        plan = rt.plans[key] = _Plan(rt, spec, geoms, on_device, *key[4:], name)
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


class _MappedResult:
    """The owner of a numpy result that is a host mapping of a pooled buffer (CPU devices,
    where mapping is zero-copy): while the array or any view of it lives, the buffer stays
    mapped and out of the pool; then it is unmapped and goes back to the pool, whose blocks
    are memory already paged in."""

    __slots__ = ("buffer", "view", "queue", "__array_interface__", "__weakref__")

    @classmethod
    def array(cls, queue, buffer, spec: launch.Buffer) -> np.ndarray:
        """Map ``buffer`` (after the queue's work so far) as an array of ``spec``."""
        owner = cls()
        owner.view, _ = cl.enqueue_map_buffer(queue, buffer, cl.map_flags.READ | cl.map_flags.WRITE,
                                              0, spec.shape, spec.dtype, is_blocking=True)
        owner.buffer, owner.queue = buffer, queue
        owner.__array_interface__ = dict(owner.view.__array_interface__, version=3)
        return np.asarray(owner)   # its base is the owner

    def __del__(self):
        try:
            self.view.base.release(self.queue)   # unmap before the buffer returns to the pool
        except Exception:   # interpreter shutdown: the queue may be gone already
            pass


# ----------------------------------------------------------------------------- public API

def letterbox(images, size=(640, 640), fill=114, swap_rb: bool = True, mean=(0, 0, 0),
              std=(1, 1, 1), alpha: float = 1 / 255, beta=None, dtype=np.float32, out=None,
              device=None, queue=None, _zero_copy=None):
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
    """
    spec = _cached_spec(_letterbox_spec, size, fill, swap_rb, mean, std, alpha, beta, dtype)
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
