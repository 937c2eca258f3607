"""The OpenCL side of the interop, through ctypes on the ICD loader that pyopencl uses:
``cl_khr_external_memory`` (import of another API's memory as a buffer; pyopencl does not wrap
it), the device's UUID (``cl_khr_device_uuid``), and the acquire/release commands around a
use of imported memory.

Every failure raises :class:`ExternalMemoryError` naming the call and the OpenCL error code.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from typing import Optional

import pyopencl as cl

__all__ = ["ExternalMemoryError", "missing_extensions", "device_uuid", "import_fd", "Acquire"]

CL_DEVICE_UUID_KHR = 0x106A
CL_DEVICE_EXTERNAL_MEMORY_IMPORT_HANDLE_TYPES_KHR = 0x204F
CL_DEVICE_HANDLE_LIST_KHR = 0x2051
CL_DEVICE_HANDLE_LIST_END_KHR = 0
CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR = 0x2060
CL_MEM_READ_WRITE = 1
NEEDED = ("cl_khr_external_memory", "cl_khr_external_memory_opaque_fd", "cl_khr_device_uuid")


class ExternalMemoryError(RuntimeError):
    """The OpenCL device or driver cannot import the memory (the message says what is missing)."""


def missing_extensions(device: cl.Device) -> list:
    """The extensions of :data:`NEEDED` that ``device`` lacks (and OpenCL 3.0's
    clCreateBufferWithProperties, named as such)."""
    have = set(device.extensions.split()) | set(device.platform.extensions.split())
    missing = [e for e in NEEDED if e not in have]
    if "OpenCL 3." not in device.platform.version:
        missing.append("OpenCL 3.0 (clCreateBufferWithProperties)")
    return missing


def _loader():
    """The ICD loader pyopencl is linked against (its wheel bundles one), else the system's."""
    here = os.path.dirname(cl.__file__)
    for pattern in (os.path.join(here, "..", "pyopencl.libs", "libOpenCL*.so*"),
                    os.path.join(here, ".libs", "libOpenCL*.so*")):
        found = sorted(glob.glob(pattern))
        if found:
            return ctypes.CDLL(found[0])
    name = ctypes.util.find_library("OpenCL") or "libOpenCL.so.1"
    return ctypes.CDLL(name)


_lib = None
_lock = threading.Lock()


def lib():
    global _lib
    with _lock:
        if _lib is None:
            _lib = _loader()
            _lib.clCreateBufferWithProperties.restype = ctypes.c_void_p
            _lib.clCreateBufferWithProperties.argtypes = [
                ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint64, ctypes.c_size_t,
                ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]
            _lib.clGetExtensionFunctionAddressForPlatform.restype = ctypes.c_void_p
            _lib.clGetExtensionFunctionAddressForPlatform.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            _lib.clGetDeviceInfo.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p,
                                             ctypes.POINTER(ctypes.c_size_t)]
        return _lib


def device_uuid(device: cl.Device) -> Optional[bytes]:
    """The device's 16-byte UUID (cl_khr_device_uuid), or None where it has none."""
    buf = (ctypes.c_ubyte * 16)()
    code = lib().clGetDeviceInfo(ctypes.c_void_p(device.int_ptr), CL_DEVICE_UUID_KHR, 16, buf, None)
    return bytes(buf) if code == 0 else None


def import_fd(context: cl.Context, device: cl.Device, fd: int, size: int) -> cl.Buffer:
    """A buffer of ``size`` bytes over the memory that the opaque file descriptor ``fd`` names."""
    props = (ctypes.c_uint64 * 6)(CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR, fd, CL_DEVICE_HANDLE_LIST_KHR,
                                  device.int_ptr, CL_DEVICE_HANDLE_LIST_END_KHR, 0)
    err = ctypes.c_int32(0)
    mem = lib().clCreateBufferWithProperties(ctypes.c_void_p(context.int_ptr), props, CL_MEM_READ_WRITE,
                                             size, None, ctypes.byref(err))
    if err.value != 0 or not mem:
        raise ExternalMemoryError(f"clCreateBufferWithProperties (an opaque fd of {size} bytes) failed with "
                                  f"OpenCL error {err.value} on {device.name!r}")
    return cl.Buffer.from_int_ptr(mem, retain=False)


_Enqueue = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p),
                            ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p)


class Acquire:
    """clEnqueueAcquireExternalMemObjectsKHR / Release on a platform (the commands that hand
    imported memory to OpenCL and back; no-ops where the driver needs none)."""

    def __init__(self, platform: cl.Platform):
        get = lib().clGetExtensionFunctionAddressForPlatform
        a = get(ctypes.c_void_p(platform.int_ptr), b"clEnqueueAcquireExternalMemObjectsKHR")
        r = get(ctypes.c_void_p(platform.int_ptr), b"clEnqueueReleaseExternalMemObjectsKHR")
        if not a or not r:
            raise ExternalMemoryError(f"{platform.name!r} has no clEnqueueAcquire/ReleaseExternalMemObjectsKHR")
        self._acquire, self._release = _Enqueue(a), _Enqueue(r)

    def _run(self, fn, name, queue: cl.CommandQueue, buffers) -> None:
        mems = (ctypes.c_void_p * len(buffers))(*[b.int_ptr for b in buffers])
        code = fn(ctypes.c_void_p(queue.int_ptr), len(buffers), mems, 0, None, None)
        if code != 0:
            raise ExternalMemoryError(f"{name} failed with OpenCL error {code}")

    def acquire(self, queue, buffers) -> None:
        self._run(self._acquire, "clEnqueueAcquireExternalMemObjectsKHR", queue, buffers)

    def release(self, queue, buffers) -> None:
        self._run(self._release, "clEnqueueReleaseExternalMemObjectsKHR", queue, buffers)
