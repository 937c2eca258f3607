"""Argument checking and host/device movement shared by every launcher.

The rule: numpy in, numpy out; ``pyopencl.array.Array`` in, device array out with no copy.
Nothing is converted silently: a dtype the kernel does not take is an error that names
the argument and the fix.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from . import dtypes as dtypes_      # (check_array has an argument named dtypes)
from . import simulator
from .runtime import Runtime

__all__ = ["is_device_array", "check_array", "to_device", "upload", "write_async", "to_host_like", "empty",
           "scratch", "keep_on_simulator", "zeros", "zero_fill_program", "check_context",
           "work_group_size", "round_up"]


def is_device_array(a) -> bool:
    return isinstance(a, cla.Array)


def check_array(a, name: str, dtypes: Iterable, ndim: Optional[int] = None,
                shape: Optional[Sequence[Optional[int]]] = None):
    """Validate an argument; returns it unchanged (numpy or device array).

    ``dtypes``: allowed dtypes; ``shape``: expected sizes, None for "any". Lists and
    scalars are turned into numpy arrays (that is not a silent copy of user data).
    """
    if not is_device_array(a) and not isinstance(a, np.ndarray):
        try:
            a = np.asarray(a)
        except Exception:
            raise TypeError(f"{name} must be a numpy array or pyopencl.array.Array, "
                            f"not {type(a).__name__}") from None
    dtypes_.require(name, a.dtype, dtypes)
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(a.shape)}")
    if shape is not None:
        if len(shape) != a.ndim or any(s is not None and s != t for s, t in zip(shape, a.shape)):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise ValueError(f"{name} has shape {tuple(a.shape)}, expected {want}")
    return a


def check_context(runtime: Runtime, a, name: str) -> None:
    """A device array on another context than the call's is an error that names it."""
    if a.context != runtime.context:
        raise ValueError(
            f"{name} lives on another OpenCL context than the one this call runs on "
            f"({runtime.info.name}, chosen by device= or queue=): leave device= and queue= out "
            f"to run where the arrays live, or copy {name} to that context")


def to_device(runtime: Runtime, a, name: str = "array") -> cla.Array:
    """A device array for ``a``: device arrays pass through (must be contiguous and on
    the runtime's context), numpy arrays are copied over once."""
    if is_device_array(a):
        check_context(runtime, a, name)
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous on the device")
        return a
    return cla.to_device(runtime.queue, np.ascontiguousarray(a))


# upload(): on GPUs, arrays of at least STAGED_UPLOAD_MIN_BYTES cross in chunks of STAGE_CHUNK_BYTES
# through two pinned staging buffers (H200 machine, 2.32 GB of indices and observations: 0.34-0.38 s
# against 0.43-0.47 s as one write from pageable memory). STAGED_UPLOAD None: on GPUs only;
# True / False: always / never (the tests force it on CPU devices).
STAGED_UPLOAD = None
STAGED_UPLOAD_MIN_BYTES = 64 << 20
STAGE_CHUNK_BYTES = 16 << 20


def upload(runtime: Runtime, a, dtype=None) -> cla.Array:
    """A new device array holding ``a`` converted to ``dtype`` (``a``'s own by default) as
    ``a.astype(dtype)`` converts it (e.g. checked int64 indices to int32).

    A large array on a GPU crosses in chunks through two pinned buffers of the driver's
    (``CL_MEM_ALLOC_HOST_PTR``, mapped): the host converts chunk k into one while chunk k - 1
    crosses from the other, so the conversion costs no pass of its own and the transfer runs at
    the bus' speed rather than pageable memory's. Small arrays and CPU devices take one write."""
    a = np.asarray(a)
    dt = np.dtype(dtype) if dtype is not None else a.dtype
    staged = (not runtime.info.is_cpu and not runtime.info.is_simulator) if STAGED_UPLOAD is None \
        else STAGED_UPLOAD
    if not staged or a.size * dt.itemsize < STAGED_UPLOAD_MIN_BYTES:
        return cla.to_device(runtime.queue, np.ascontiguousarray(a, dt))
    out = cla.empty(runtime.queue, a.shape, dt)
    flat = a.reshape(-1)
    q, per = runtime.queue, max(1, STAGE_CHUNK_BYTES // dt.itemsize)
    stages, writes = [], [None, None]
    try:
        for _ in range(2):
            buf = cl.Buffer(runtime.context, cl.mem_flags.ALLOC_HOST_PTR | cl.mem_flags.READ_ONLY,
                            per * dt.itemsize)
            host, _ = cl.enqueue_map_buffer(q, buf, cl.map_flags.WRITE, 0, (per,), dt, is_blocking=True)
            stages.append((buf, host))
        for k, start in enumerate(range(0, flat.size, per)):
            part = flat[start:start + per]
            host = stages[k % 2][1]
            if writes[k % 2] is not None:
                writes[k % 2].wait()            # the write that read this staging buffer is done
            np.copyto(host[:part.size], part, casting="unsafe")     # as astype
            writes[k % 2] = cl.enqueue_copy(q, out.data, host[:part.size], dst_offset=start * dt.itemsize,
                                            is_blocking=False)
    finally:
        for w in writes:
            if w is not None:
                w.wait()
        for buf, host in stages:
            host.base.release(q)
            buf.release()
    return out


def write_async(runtime: Runtime, dest: cla.Array, host, pending: list) -> cla.Array:
    """Copy ``host`` (converted to ``dest``'s dtype) into ``dest`` by a non-blocking write and
    return ``dest``. The transfer's event goes to ``pending``, which must live until a later
    wait on the (in-order) queue: pyopencl's transfer events keep the host array alive and,
    when released, wait for the transfer."""
    host = np.ascontiguousarray(host, dtype=dest.dtype)
    if host.size:
        pending.append(cl.enqueue_copy(runtime.queue, dest.data, host, is_blocking=False))
    return dest


def to_host_like(result: cla.Array, like_device: bool):
    """Return ``result`` as a device array if the caller gave device arrays, else numpy."""
    return result if like_device else result.get()


def empty(runtime: Runtime, shape, dtype) -> cla.Array:
    shape = (shape,) if np.isscalar(shape) else shape
    return cla.empty(runtime.queue, tuple(int(s) for s in shape), np.dtype(dtype))


def scratch(runtime: Runtime, shape, dtype) -> cla.Array:
    """A buffer that kernels write and later kernels read: ``empty``, except on the Oclgrind
    simulator, where it is written from the host (see :func:`simulator.zeros_from_host`)."""
    if simulator.zeros_from_host(runtime):
        shape = (shape,) if np.isscalar(shape) else tuple(shape)
        return cla.to_device(runtime.queue, np.zeros(shape, dtype))
    return empty(runtime, shape, dtype)


def keep_on_simulator(runtime: Runtime, *objects) -> None:
    """Never release these device arrays on the simulator (see :func:`simulator.keep`)."""
    simulator.keep(runtime, *objects)


def zeros(runtime: Runtime, shape, dtype) -> cla.Array:
    """A zero-filled device array, filled by a kernel. (pyopencl's ``zeros`` may use
    clEnqueueFillBuffer, whose result Oclgrind's checks do not count as initialised.)
    The fill writes integers of the element's size: all-zero bits are 0 in every type, and
    no device needs cl_khr_fp16 to zero a half buffer. On the simulator the zeros are written
    from the host (see :func:`simulator.zeros_from_host`)."""
    from .templates import kernel
    if simulator.zeros_from_host(runtime):
        return scratch(runtime, shape, dtype)
    out = empty(runtime, shape, dtype)
    if out.size:
        k = kernel(zero_fill_program(runtime, out.dtype.itemsize), "zero_fill")
        out.add_event(k(runtime.queue, (out.size,), None, out.data))
    return out


def zero_fill_program(runtime: Runtime, itemsize: int) -> cl.Program:
    """The program of ``zero_fill(a)``: a[i] = 0 in integers of ``itemsize`` bytes (all-zero bits
    are 0 in every type; no device needs cl_khr_fp16 to zero a half buffer)."""
    from .templates import build
    bits = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}[itemsize]
    return build(f"__kernel void zero_fill(__global {bits} *a) {{ a[get_global_id(0)] = 0; }}", runtime)


def round_up(n: int, multiple: int) -> int:
    return -(-int(n) // multiple) * multiple


def work_group_size(runtime: Runtime, kernel: cl.Kernel = None, wanted: int = 256) -> int:
    """A work-group size within the device's and the kernel's limits (never a fixed 1024)."""
    limit = runtime.info.max_work_group_size
    if kernel is not None:
        limit = min(limit, kernel.get_work_group_info(
            cl.kernel_work_group_info.WORK_GROUP_SIZE, runtime.device))
    size = 1
    while size * 2 <= min(wanted, limit):
        size *= 2
    return size
