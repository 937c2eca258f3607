"""Device arrays of inputs that kernels only read, without a copy where the device is the CPU.

A CPU OpenCL device (PoCL, not the Oclgrind simulator) reads host memory: a buffer over the host
array itself (``USE_HOST_PTR``, as pyclad's in-place evaluation has them) costs nothing, where a
copy writes fresh memory of the same size (the observation index and observations of a 29M
observation problem: about a gigabyte, and seconds on a machine where new memory faults in
slowly). Other devices get the usual copy.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from clkernels import arrays, simulator


def shares_host_memory(runtime) -> bool:
    """Whether :func:`read_only` on ``runtime`` wraps host arrays rather than copying them."""
    return simulator.zero_copy_ok(runtime)


def read_only(runtime, a) -> cla.Array:
    """A device array with the contents of the numpy array ``a``, for kernels that only read it:
    a buffer over ``a`` on a CPU device, else a copy. The buffer keeps ``a`` alive; ``a`` must not
    change while the device array is in use."""
    a = np.ascontiguousarray(a)
    if not shares_host_memory(runtime) or not a.nbytes:     # OpenCL has no empty buffers
        return arrays.to_device(runtime, a)
    flags = cl.mem_flags.READ_ONLY | cl.mem_flags.USE_HOST_PTR
    return cla.Array(runtime.queue, a.shape, a.dtype, data=cl.Buffer(runtime.context, flags, hostbuf=a))
