"""The calls of letterbox and warp_affine: options checked (:mod:`.options`), images split and
packed (:mod:`.images`), the plan of the call's signature found or made (:mod:`.plan`), buffers
set, and the launch enqueued.

Built on :mod:`clkernels.launch`: the images' lists of mixed sizes do not fit an ``LaunchOp``'s
fixed parameters, so this module uses its pieces. The runtime comes from the images (or
``device=`` / ``queue=``); a plan is cached per call signature (images' geometry, options,
output size, kernel mapping) in ``runtime.plans`` and holds its own kernel objects with every
fixed argument set, the letterbox matrices and the batch's table already on the device. A
repeat call checks the images, wraps or packs them, sets the buffers and enqueues. One image
takes its geometry and matrix as scalar arguments (no table); packed inputs, device outputs
and host-copy outputs come from the queue's memory pool.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from .. import arrays, launch, multi_device, simulator
from .images import MappedResult, pack_device, pack_host, split_batch
from .options import Spec, cached_spec, inverse_of, letterbox_spec, warp_spec
# _run reads the per-device choices through these module names, so tests and benchmarks can
# override them here (monkeypatch clkernels.warp_affine.ops._lanes, ...).
from .plan import TEMPLATE, WarpPlan, matrix_arg
from .plan import alloc_limit as _alloc_limit, fma_name as _fma_name  # noqa: I001
from .plan import lanes as _lanes, unaligned_io as _unaligned_io

__all__ = ["letterbox", "warp_affine"]


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


def _run(images, name: str, spec: Spec, out, device, queue, zero_copy, d2i=None):
    """Shared by letterbox and warp_affine: returns (result, plan, single)."""
    items, geoms, on_device, single = split_batch(images, name)
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
            plan = rt.plans[key] = WarpPlan(rt, spec, geoms, on_device, *key[4:], name)
        rt.plans[_run, spec, geoms, on_device] = plan
    limit = plan.alloc_limit
    if out is not None:
        out = _check_out(out, on_device, plan.out.shape, plan.out.dtype, rt)
    matrix = matrix_arg(d2i) if plan.matrix_per_call else None
    inputs, outputs, temps, wait, pending = [], [], [], [], []
    q = rt.queue
    if on_device:
        if out is None:   # pooled, and back to the pool when the caller drops it
            out = launch.wrap(rt, plan.out, launch.output_buffer(rt, plan.out.nbytes))
        for chunk in plan.chunks:
            buf, offsets = pack_device(rt, items[chunk.start:chunk.stop], chunk, wait)
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
        buf, offsets = pack_host(rt, items_c, chunk, zero_copy, limit, pending)
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
        out = MappedResult.array(q, outputs[0], plan.out)
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
    an integer as in OpenCV's uint8 output. ``dtype``: float32, or float16 or bfloat16
    (``ml_dtypes.bfloat16``, rounded to nearest even) storage. ``out``:
    an array to write the blob into (the exact shape and dtype, on the host or device like the
    images), reused across calls. ``device``/``queue``: where to run (default: where device
    images live, else the selected device).

    Returns ``(blob, d2i)``: ``blob`` is ``[N, 3, height, width]`` (N = 1 for one image), and
    ``d2i`` the destination-to-source matrices, ``[2, 3]`` for one image or ``[N, 2, 3]``,
    float64; ``scale_boxes(boxes, d2i)`` maps detections back.

    ``devices``: several devices (or ``"all"``) that share the images of a host batch (a list
    or an ``[N, H, W, 3]`` array), each its own range (:mod:`clkernels.multi_device`).
    """
    spec = cached_spec(letterbox_spec, size, fill, swap_rb, mean, std, alpha, beta, dtype)
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
    spec = cached_spec(warp_spec, dsize, border_value)
    d2i = inverse_of(M)
    if isinstance(image, (list, tuple)):
        raise TypeError("image must be one [H, W, 3] array; warp a list image by image")
    if arrays.is_device_array(image) or isinstance(image, np.ndarray):
        if image.ndim != 3:
            raise ValueError(f"image must be one [H, W, 3] image, got shape {tuple(image.shape)}")
    return _run(image, "image", spec, out, device, queue, _zero_copy, d2i)[0]
