"""The two slow calls of an OpenCL driver's start, made without holding Python's GIL.

An OpenCL driver starts at the first enumeration of its platforms (the ICD loader loads every
vendor's library, and each starts its device: NVIDIA's, about a quarter of a second with the
context) and makes a context for a device. pyopencl holds the GIL through both, so a thread that
starts the driver through it stops the rest of the process meanwhile. ``ctypes`` releases the
GIL for the length of a foreign call: here, the same calls through the same ICD loader that
pyopencl uses (the one its wheel bundles, else the system's), so the driver starts once, for both.

Nothing here imports pyopencl: it finds the loader beside pyopencl's package without running it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
from typing import Optional

CL_SUCCESS = 0
CL_DEVICE_TYPE_ALL = 0xFFFFFFFF

_lib = None


def loader_path() -> Optional[str]:
    """The ICD loader that pyopencl's extension links: the one its wheel bundles (auditwheel puts
    it in ``pyopencl/.libs`` or ``pyopencl.libs``), else the system's ``libOpenCL``; None if
    neither is found."""
    spec = importlib.util.find_spec("pyopencl")
    if spec is not None and spec.submodule_search_locations:
        package = list(spec.submodule_search_locations)[0]
        for folder in (os.path.join(package, ".libs"), package + ".libs"):
            found = sorted(glob.glob(os.path.join(folder, "libOpenCL*.so*")))
            if found:
                return found[0]
    return ctypes.util.find_library("OpenCL")


def _library():
    global _lib
    if _lib is None:
        path = loader_path()
        if path is None:
            raise OSError("no OpenCL ICD loader (libOpenCL) found")
        lib = ctypes.CDLL(path)
        lib.clGetPlatformIDs.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(ctypes.c_uint32)]
        lib.clGetPlatformIDs.restype = ctypes.c_int32
        lib.clGetDeviceIDs.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                                       ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint32)]
        lib.clGetDeviceIDs.restype = ctypes.c_int32
        lib.clCreateContext.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p),
                                        ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]
        lib.clCreateContext.restype = ctypes.c_void_p
        _lib = lib
    return _lib


def start_drivers() -> int:
    """Enumerate every platform and its devices, which starts their drivers; returns the number of
    devices found (0 where there is no platform). Raises OSError where no loader is found."""
    lib = _library()
    count = ctypes.c_uint32(0)
    if lib.clGetPlatformIDs(0, None, ctypes.byref(count)) != CL_SUCCESS or not count.value:
        return 0
    platforms = (ctypes.c_void_p * count.value)()
    if lib.clGetPlatformIDs(count.value, platforms, None) != CL_SUCCESS:
        return 0
    total = 0
    for platform in platforms:
        n = ctypes.c_uint32(0)
        if lib.clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, None, ctypes.byref(n)) == CL_SUCCESS:
            total += n.value
    return total


def create_context(device_int_ptr: int) -> Optional[int]:
    """A new context of the one device whose ``cl_device_id`` is ``device_int_ptr`` (a
    ``pyopencl.Device``'s ``int_ptr``), as the handle that ``pyopencl.Context.from_int_ptr(...,
    retain=False)`` takes over; None where the driver refuses (the caller makes it as usual,
    and sees the driver's error there)."""
    lib = _library()
    device = (ctypes.c_void_p * 1)(device_int_ptr)
    err = ctypes.c_int32(0)
    ctx = lib.clCreateContext(None, 1, device, None, None, ctypes.byref(err))
    return ctx if err.value == CL_SUCCESS and ctx else None
