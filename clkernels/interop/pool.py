"""A pool of device memory that CUDA (PyTorch) and OpenCL share: blocks made by the CUDA driver,
exported as file descriptors and imported into the OpenCL context once each.

A block is handed out whole (sizes rounded up to the driver's granularity, 2 MiB on the H200)
and comes back to a free list of its size when its owner lets go: a torch tensor's storage
(:class:`CudaView`) or a launch's unclaimed output. A returned block is reused only after the
work that may still read it has ended: the OpenCL queue's marker and the CUDA stream's event,
both recorded when it came back ("freed while a kernel still reads it" stays valid).
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Tuple

import pyopencl as cl

from . import cuda_driver, opencl_external

__all__ = ["Block", "SharedPool", "CudaView"]


class Block:
    """One allocation: CUDA address :attr:`ptr`, OpenCL buffer :attr:`buffer`, :attr:`size` bytes."""

    __slots__ = ("alloc", "buffer", "size", "ptr")

    def __init__(self, alloc: cuda_driver.ExportableAllocation, buffer: cl.Buffer):
        self.alloc, self.buffer, self.size, self.ptr = alloc, buffer, alloc.size, alloc.ptr.value


class SharedPool:
    """Blocks on CUDA device ``ordinal`` imported into ``context`` for ``device``; ``queue`` is the
    OpenCL queue whose work a returned block waits for."""

    def __init__(self, ordinal: int, context: cl.Context, device: cl.Device, queue: cl.CommandQueue):
        self.ordinal, self.context, self.device, self.queue = ordinal, context, device, queue
        self.granularity = cuda_driver.driver().granularity(ordinal)
        self._lock = threading.Lock()
        self._free: Dict[int, List[Block]] = {}          # size -> blocks ready for reuse
        self._returned: List[Tuple[Block, object, object]] = []   # (block, OpenCL marker, CUDA event)
        self._by_buffer: Dict[int, Block] = {}           # OpenCL buffer handle -> block
        self._by_ptr: Dict[int, Block] = {}              # CUDA address -> block
        self.bytes_held = 0                              # every block made, in use or free

    def round(self, nbytes: int) -> int:
        g = self.granularity
        return max(g, -(-int(nbytes) // g) * g)

    def allocate(self, nbytes: int) -> Block:
        """A block of at least ``nbytes``: a free one of that size whose readers are done, else a new one."""
        size = self.round(nbytes)
        with self._lock:
            self._collect()
            free = self._free.get(size)
            if free:
                return free.pop()
        alloc = cuda_driver.ExportableAllocation(self.ordinal, size)
        try:
            buffer = opencl_external.import_fd(self.context, self.device, alloc.fd, size)
        except Exception:
            alloc.free()
            raise
        block = Block(alloc, buffer)
        with self._lock:
            self._by_buffer[buffer.int_ptr] = block
            self._by_ptr[block.ptr] = block
            self.bytes_held += size
        return block

    def give_back(self, block: Block, cuda_event=None, settled: bool = False) -> None:
        """``block`` is no longer owned; reusable once the OpenCL queue's work so far and
        ``cuda_event`` (a torch.cuda.Event recorded on the stream that last used it) are done, or
        at once where the caller knows that no work reads it (``settled``)."""
        if settled:
            with self._lock:
                self._free.setdefault(block.size, []).append(block)
            return
        try:
            marker = cl.enqueue_marker(self.queue)
        except cl.Error:        # the context is going away with the process: nothing to wait for
            marker = None
        with self._lock:
            self._returned.append((block, marker, cuda_event))

    def _collect(self) -> None:
        """Move returned blocks whose readers are done to the free lists (the lock is held)."""
        still = []
        for block, marker, event in self._returned:
            done = (marker is None or marker.command_execution_status == cl.command_execution_status.COMPLETE) \
                and (event is None or event.query())
            if done:
                self._free.setdefault(block.size, []).append(block)
            else:
                still.append((block, marker, event))
        self._returned = still

    def block_of_buffer(self, buffer) -> Optional[Block]:
        return self._by_buffer.get(getattr(buffer, "int_ptr", None))

    def block_of_ptr(self, ptr: int) -> Optional[Block]:
        return self._by_ptr.get(ptr)

    def stats(self) -> dict:
        with self._lock:
            free = sum(len(v) for v in self._free.values())
            return {"blocks": len(self._by_ptr), "free": free, "returned": len(self._returned),
                    "bytes_held": self.bytes_held}


class CudaView:
    """A block (or its first bytes) as a CUDA array (``__cuda_array_interface__``) that
    ``torch.as_tensor`` views without a copy; the tensor keeps this object, and with it the block,
    alive. When it goes, the block returns to the pool."""

    def __init__(self, pool: SharedPool, block: Block, shape, typestr: str, event_factory=None,
                 settled: bool = False):
        """``settled``: the owner waits for all work on the block before letting it go (a call's
        own copy of an input), so it returns to the free list at once."""
        self.pool, self.block, self._event_factory, self._settled = pool, block, event_factory, settled
        self.__cuda_array_interface__ = {"shape": tuple(int(s) for s in shape), "typestr": typestr,
                                         "data": (block.ptr, False), "version": 3, "strides": None}

    def __del__(self):
        block, self.block = self.block, None
        if block is not None and self._settled:
            self.pool.give_back(block, settled=True)
        elif block is not None:
            event = None
            if self._event_factory is not None:
                try:
                    event = self._event_factory()
                except Exception:       # torch shutting down with the process: nothing runs any more
                    event = None
            self.pool.give_back(block, event)
