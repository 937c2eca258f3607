"""The images side of warp_affine: checking, batching and packing the source images.

What :mod:`clkernels.warp_affine.ops` does with its ``images`` argument around a launch: check
each image (uint8 ``[H, W, 3]``, channels consecutive, rows and pixels possibly spaced) into
its ``(height, width, pitch, step)`` geometry, split a call's images into a list, lay them out
in packed buffers (64-byte aligned, in chunks that each fit one buffer), see when host images
share one allocation (one transfer then covers them all), pack a chunk's host or device images
into its input buffer, and own a host result that is a mapping of a pooled buffer. None of it
depends on the options, the kernel or the plans, so it lives apart from the call
(:mod:`.ops`) and the plans (:mod:`.plan`), which use it.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from .. import arrays, launch, simulator


_ALIGN = 64           # byte alignment of each image inside a packed buffer
INT_MAX = 2**31 - 1  # per-image byte offsets and pixel counts are int in the kernel
_MAX_SIDE = 2**22     # the kernel's float floor is exact below this


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
    if span_of(geom) > INT_MAX:
        raise ValueError(f"{name} spans {span_of(geom)} bytes; images over 2 GiB are not supported "
                         "(split or resize it first)")
    if len(_geometries) < 4096:
        _geometries[(tuple(img.shape), tuple(img.strides))] = geom
    return img, geom


def split_batch(images, name: str):
    """(images as a list, their geometries, is_device, was_single)."""
    if type(images) is np.ndarray and images.ndim == 3:   # one host image: the common call
        return [images], (_check_image(images, name)[1],), False, True
    if type(images) is cla.Array and images.ndim == 3:    # one device image
        return [images], (_check_image(images, name)[1],), True, True
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


def span_of(geom) -> int:
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


def aligned_offsets(spans):
    offsets, total = [], 0
    for span in spans:
        offsets.append(total)
        total += arrays.round_up(span, _ALIGN)
    return tuple(offsets), total


def chunk_runs(spans, out_bytes_per_image: int, limit: int, name: str):
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


def pack_host(rt, items, chunk, zero_copy: bool, limit: int, pending: list):
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


def pack_device(rt, items, chunk, wait: list):
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


class MappedResult:
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
        # (its base is the owner; the array interface spells bfloat16 as raw '<V2': viewed back)
        return np.asarray(owner).view(spec.dtype)

    def __del__(self):
        try:
            self.view.base.release(self.queue)   # unmap before the buffer returns to the pool
        except Exception:   # interpreter shutdown: the queue may be gone already
            pass
