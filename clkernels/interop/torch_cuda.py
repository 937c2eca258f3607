"""PyTorch CUDA tensors in and out of the OpenCL ops, with no host round trip.

One :class:`CudaBridge` per CUDA device: the OpenCL device with the same UUID
(``cl_khr_device_uuid`` against ``torch.cuda.get_device_properties(i).uuid``), its own in-order
queue, and a :class:`~clkernels.interop.pool.SharedPool` of memory that both APIs address. A call
(:meth:`CudaBridge.run`):

1. takes each input tensor as it is where it already lives in the pool (contiguous, at a block's
   start), else copies it into a pool tensor: one device-to-device copy on the tensor's current
   stream (integer tables, a few numbers each, go to the host instead: the ops read them there);
2. waits for the current CUDA stream (a host wait: the inputs are written), acquires the pool
   buffers for OpenCL, runs the op with its outputs allocated in the pool (no copy), releases the
   buffers and waits for the queue (a host wait: the outputs are written before torch reads them);
3. returns the outputs as tensors over their pool blocks.

The two host waits stand in for external semaphores (``cl_khr_external_semaphore``). A semaphore
would need one side to make and export it: NVIDIA's OpenCL driver (580) imports opaque-fd
semaphores but exports none (``CL_DEVICE_SEMAPHORE_EXPORT_HANDLE_TYPES_KHR`` is empty), and CUDA
only imports them (from Vulkan, Direct3D 12 or NvSciSync). ``benchmarks/bench_torch_interop.py``
measures the waits. Neither is what a call costs most: NVIDIA's OpenCL runs in a CUDA context of
its own, and every hand-over of the GPU between PyTorch's context and it is a context switch
(about 0.13 ms each way on the H200, the benchmark's "context hand-over" rows), which no
synchronisation scheme avoids. So a call costs about 0.3-0.5 ms more than the op on device
arrays: negligible beside a large op, and the reason to keep small tensors on one side.

A GPU or driver without what this needs raises :class:`InteropUnavailable`, naming it.
"""
from __future__ import annotations

import threading
import warnings
import weakref
from typing import Dict, Sequence

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from .. import dtypes
from ..runtime import get_runtime, list_devices, runtime_for_queue
from . import cuda_driver, opencl_external
from .pool import CudaView, SharedPool

__all__ = ["InteropUnavailable", "CudaBridge", "bridge_for", "host_copy_warning"]


class InteropUnavailable(RuntimeError):
    """CUDA tensors cannot reach the OpenCL device of their GPU (the message says why and what to do)."""


class _Outputs:
    """A launch's output allocator during one call (Runtime.output_pool): pool blocks, each
    acquired for OpenCL as it is handed out, listed so that unclaimed ones go back."""

    def __init__(self, bridge: "CudaBridge"):
        self.bridge, self.blocks = bridge, []

    def allocate(self, nbytes: int):
        block = self.bridge.pool.allocate(nbytes)
        self.blocks.append(block)
        self.bridge.acquire.acquire(self.bridge.queue, [block.buffer])
        return block.buffer


class CudaBridge:
    """CUDA device ``index`` and the OpenCL device of the same GPU (see the module docstring)."""

    def __init__(self, index: int):
        import torch
        self.index = int(index)
        self.torch_device = torch.device("cuda", self.index)
        if not torch.cuda.is_available():
            raise InteropUnavailable("this PyTorch has no CUDA device (torch.cuda.is_available() is False); "
                                     "pass CPU tensors (or a torch wrapper allow_host_copy=True)")
        uuid = str(torch.cuda.get_device_properties(self.index).uuid).replace("-", "").lower()
        if uuid.startswith("gpu"):
            uuid = uuid[3:]
        seen, match = [], None
        for d in list_devices():
            u = opencl_external.device_uuid(d) if "cl_khr_device_uuid" in d.extensions else None
            seen.append(f"{d.platform.name.strip()}: {d.name} ({u.hex() if u else 'no UUID'})")
            if u is not None and u.hex() == uuid and match is None:
                match = d
        if match is None:
            raise InteropUnavailable(
                f"no OpenCL device is the GPU of cuda:{self.index} (UUID {uuid}); OpenCL devices: "
                f"{'; '.join(seen) or 'none'}. Install the GPU vendor's OpenCL driver (NVIDIA's ICD, "
                "libnvidia-opencl, or ROCm's OpenCL), or pass a torch wrapper allow_host_copy=True to take the host path")
        missing = opencl_external.missing_extensions(match)
        if missing:
            raise InteropUnavailable(
                f"the OpenCL driver of {match.name!r} lacks {', '.join(missing)}, which sharing CUDA memory "
                "needs; update the driver, or pass a torch wrapper allow_host_copy=True to take the host path")
        self.cl_device = match
        context = get_runtime(match).context
        self.queue = cl.CommandQueue(context, match)
        self.rt = runtime_for_queue(self.queue)
        try:
            self.pool = SharedPool(self.index, context, match, self.queue)
            self.acquire = opencl_external.Acquire(match.platform)
        except (cuda_driver.CudaError, opencl_external.ExternalMemoryError) as exc:
            raise InteropUnavailable(f"CUDA memory cannot be shared with {match.name!r}: {exc}") from exc
        self._lock = threading.Lock()
        self._tables: Dict[tuple, np.ndarray] = {}

    # -- tensors and the pool ------------------------------------------------------------------
    def _event(self):
        import torch
        e = torch.cuda.Event()
        e.record(torch.cuda.current_stream(self.index))
        return e

    def view(self, block, shape, dtype, settled: bool = False):
        """A tensor of ``shape`` and ``dtype`` over ``block`` (from its start), owning it: the block
        returns to the pool when the tensor and its views are gone (at once where ``settled``:
        no work reads it then)."""
        import torch
        np_dtype = dtypes.from_torch(dtype)
        # (the array interface has no bfloat16: its bits as uint16, viewed back below)
        typestr = "<u2" if dtypes.is_bfloat16(np_dtype) else np_dtype.str
        view = CudaView(self.pool, block, shape, typestr, None if settled else self._event, settled)
        t = torch.as_tensor(view, device=self.torch_device)
        return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t

    def host_table(self, t):
        """An integer tensor's values on the host, read once per tensor and version: the ops' index
        tables (a few numbers) are the same tensors call after call, and each read is a sync."""
        # Keyed by the tensor object itself (a weak reference), not its address: a new tensor at a
        # freed one's address is another table.
        entry = self._tables.get(id(t))
        if entry is not None and entry[0]() is t and entry[1] == t._version:
            return entry[2]
        if len(self._tables) > 64:
            self._tables.clear()
        values = t.detach().cpu().numpy()
        self._tables[id(t)] = (weakref.ref(t), t._version, values)
        return values

    def empty(self, shape, dtype, settled: bool = False):
        """A tensor of ``shape`` and ``dtype`` in the pool (its values undefined; ``settled`` as in
        :meth:`view`)."""
        import torch
        shape = tuple(int(s) for s in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype, device=self.torch_device)
        return self.view(self.pool.allocate(nbytes), shape, dtype, settled)

    def block_of(self, t):
        """The pool block that ``t`` covers from its start, contiguously; None for any other tensor."""
        if t.is_contiguous() and t.numel():
            block = self.pool.block_of_ptr(t.untyped_storage().data_ptr())
            if block is not None and t.data_ptr() == block.ptr:
                return block
        return None

    def in_pool(self, t, settled: bool = False):
        """``t`` itself where it is a contiguous tensor at the start of a pool block, else a copy
        into the pool (one device-to-device copy on the current stream; ``settled`` as in
        :meth:`view`, for a caller that waits for all work on the copy before dropping it)."""
        block = self.block_of(t)
        if block is not None:
            return t, block
        new = self.empty(t.shape, t.dtype, settled)
        if not t.numel():
            return new, None
        new.copy_(t)
        return new, self.pool.block_of_ptr(new.data_ptr())

    def _cl_array(self, t, block):
        dtype = dtypes.from_torch(t.dtype)
        shape = tuple(t.shape)
        if block is None:
            return cla.empty(self.queue, shape, dtype)
        # pyopencl's fast constructor (as clkernels.launch.wrap): the shape and strides are a
        # contiguous tensor's, and the checked path costs about 45 us a call.
        strides = tuple(s * dtype.itemsize for s in t.stride())
        return cla.Array(None, shape, dtype, allocator=None, strides=strides, data=block.buffer, offset=0,
                         _fast=True, _context=self.queue.context, _queue=self.queue, _size=t.numel())

    def _tensor(self, a, outputs: _Outputs):
        """An op's output (a device array in a pool block, a numpy array, or a passthrough) as a tensor."""
        import torch
        if isinstance(a, cla.Array):
            dtype = getattr(torch, a.dtype.name)      # (ml_dtypes' bfloat16 is named "bfloat16" too)
            if a.size == 0 or a.base_data is None:
                return torch.empty(a.shape, dtype=dtype, device=self.torch_device)
            block = self.pool.block_of_buffer(a.base_data)
            if block is None or a.offset:
                raise RuntimeError("an op's output is not in the shared pool (an op that ignores its "
                                   "runtime's output_pool); this is a bug in clkernels")
            outputs.blocks.remove(block)
            return self.view(block, a.shape, dtype)
        if isinstance(a, np.ndarray):
            return torch.from_numpy(a).to(self.torch_device)
        return a

    # -- a call ----------------------------------------------------------------------------------
    def run(self, fn, args: Sequence, n_outputs: int = 1, host_ints: bool = True, into=None):
        """``fn(*arrays)`` with the CUDA tensors of ``args`` as OpenCL device arrays over pool
        memory (integer tensors as host arrays where ``host_ints``: the vision ops' index tables);
        its device-array results as CUDA tensors.

        ``into``: a tensor in the pool (:meth:`block_of`) for the (first) result: the op is called
        as ``fn(*arrays, out=array)``, writes into its memory, and ``into`` is returned in the
        result's place. Its shape and dtype must be the result's (the op checks)."""
        import torch
        target = None
        if into is not None:
            block = self.block_of(into) if into.device == self.torch_device else None
            if block is None:
                raise ValueError(f"into must be a contiguous tensor at the start of a block of {self.torch_device}'s "
                                 "shared pool (clkernels.torch.empty); copy the result into other tensors")
            target = self._cl_array(into, block)
        # The call's own copies of inputs are "settled": this call waits for the stream that writes
        # them and for the queue that reads them (on an error too) before dropping them, so their
        # blocks go back to the free list without a marker or an event.
        kept, blocks, arrays = [], [], []
        stream = torch.cuda.current_stream(self.index)
        try:
            for a in args:
                if isinstance(a, torch.Tensor):
                    if a.device != self.torch_device:
                        raise ValueError(f"a tensor is on {a.device}, another on {self.torch_device}; "
                                         "put the op's tensors on one device")
                    if host_ints and not (a.is_floating_point() or a.dtype == torch.bfloat16):
                        arrays.append(self.host_table(a))          # an index table: the ops read it on the host
                        continue
                    t, block = self.in_pool(a.detach(), settled=True)
                    kept.append(t)
                    if block is not None:
                        blocks.append(block.buffer)
                    arrays.append(self._cl_array(t, block))
                else:
                    arrays.append(a)
        except BaseException:
            stream.synchronize()            # the copies made so far are written before they go
            raise
        outputs = _Outputs(self)
        with self._lock:
            stream.synchronize()                                   # the inputs are written
            self.rt.output_pool = outputs
            try:
                if target is not None:
                    blocks.append(target.base_data)
                if blocks:
                    self.acquire.acquire(self.queue, blocks)
                result = fn(*arrays) if target is None else fn(*arrays, out=target)
                used = blocks + [b.buffer for b in outputs.blocks]
                if used:
                    self.acquire.release(self.queue, used)
            finally:
                self.rt.output_pool = None
                self.queue.finish()         # the outputs are written; nothing reads the inputs any more
        try:
            single = n_outputs == 1 and not isinstance(result, (tuple, list))
            results = [result] if single else list(result)
            if target is not None:      # the op wrote into the block of into
                results[0] = into
            tensors = [r if r is into else self._tensor(r, outputs) for r in results]
            return tensors[0] if single else tuple(tensors)
        finally:
            for block in outputs.blocks:        # made but not returned (an error, or outputs dropped)
                self.pool.give_back(block)
            del kept


_bridges: Dict[int, CudaBridge] = {}
_bridges_lock = threading.Lock()


def bridge_for(device) -> CudaBridge:
    """The :class:`CudaBridge` of a CUDA ``torch.device`` (made once per device)."""
    import torch
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _bridges_lock:
        bridge = _bridges.get(index)
        if bridge is None:
            bridge = _bridges[index] = CudaBridge(index)
        return bridge


_warned_host = set()


def host_copy_warning(what: str, why: str) -> None:
    """Warn once per op that CUDA tensors take the host path (allow_host_copy=True)."""
    if what in _warned_host:
        return
    _warned_host.add(what)
    warnings.warn(f"{what}: CUDA tensors go through host memory ({why})", RuntimeWarning, stacklevel=4)
