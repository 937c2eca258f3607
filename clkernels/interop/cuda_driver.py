"""The few CUDA driver calls the interop needs, through ctypes on ``libcuda.so.1``: exportable
device memory (the virtual memory management API: ``cuMemCreate`` with a POSIX file-descriptor
handle type, mapped into the process' CUDA address space, exported as a file descriptor).

No CUDA toolkit is needed: only the driver, which any CUDA build of PyTorch already loads. Every
failure raises :class:`CudaError` with the call's name and the driver's error name.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Optional

__all__ = ["CudaError", "driver", "ExportableAllocation"]

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class CudaError(RuntimeError):
    """A CUDA driver call failed (the message names the call and the driver's error)."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):      # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):          # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class _Driver:
    """libcuda, loaded once; :meth:`call` checks each result."""

    def __init__(self):
        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            self.lib = ctypes.CDLL(name)
        except OSError as exc:
            raise CudaError(f"the CUDA driver library ({name}) cannot be loaded: {exc}") from None
        self.call("cuInit", ctypes.c_uint(0))

    def error_name(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self.lib.cuGetErrorName(ctypes.c_int(code), ctypes.byref(text)) == 0 and text.value:
            return text.value.decode()
        return f"error {code}"

    def call(self, name: str, *args) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            raise CudaError(f"{name} failed: {self.error_name(code)} ({code})")

    def ensure_context(self, ordinal: int) -> None:
        """The device's primary context current on this thread (the one PyTorch uses)."""
        current = ctypes.c_void_p()
        self.call("cuCtxGetCurrent", ctypes.byref(current))
        if current.value:
            return
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(ordinal))
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self.call("cuCtxSetCurrent", ctx)

    def granularity(self, ordinal: int) -> int:
        prop = _prop(ordinal)
        size = ctypes.c_size_t()
        self.call("cuMemGetAllocationGranularity", ctypes.byref(size), ctypes.byref(prop),
                  ctypes.c_int(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return int(size.value)


def _prop(ordinal: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location = _Location(CU_MEM_LOCATION_TYPE_DEVICE, ordinal)
    return prop


_driver: Optional[_Driver] = None
_lock = threading.Lock()


def driver() -> _Driver:
    global _driver
    with _lock:
        if _driver is None:
            _driver = _Driver()
        return _driver


class ExportableAllocation:
    """``size`` bytes (a multiple of the granularity) of device memory on CUDA device ``ordinal``,
    mapped at :attr:`ptr` in this process' CUDA address space and exported as the file
    descriptor :attr:`fd` (for another API to import). :meth:`free` unmaps and releases it."""

    def __init__(self, ordinal: int, size: int):
        d = driver()
        d.ensure_context(ordinal)
        self.ordinal, self.size = ordinal, int(size)
        self.handle, self.ptr, self.fd = ctypes.c_ulonglong(), ctypes.c_ulonglong(), -1
        prop = _prop(ordinal)
        d.call("cuMemCreate", ctypes.byref(self.handle), ctypes.c_size_t(self.size), ctypes.byref(prop),
               ctypes.c_ulonglong(0))
        try:
            d.call("cuMemAddressReserve", ctypes.byref(self.ptr), ctypes.c_size_t(self.size), ctypes.c_size_t(0),
                   ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
            d.call("cuMemMap", self.ptr, ctypes.c_size_t(self.size), ctypes.c_size_t(0), self.handle,
                   ctypes.c_ulonglong(0))
            access = _AccessDesc(_Location(CU_MEM_LOCATION_TYPE_DEVICE, ordinal), CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            d.call("cuMemSetAccess", self.ptr, ctypes.c_size_t(self.size), ctypes.byref(access), ctypes.c_size_t(1))
            fd = ctypes.c_int(-1)
            d.call("cuMemExportToShareableHandle", ctypes.byref(fd), self.handle,
                   ctypes.c_int(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), ctypes.c_ulonglong(0))
            self.fd = fd.value
        except CudaError:
            self.free()
            raise

    def free(self) -> None:
        d = driver()
        if self.ptr.value:
            d.lib.cuMemUnmap(self.ptr, ctypes.c_size_t(self.size))
            d.lib.cuMemAddressFree(self.ptr, ctypes.c_size_t(self.size))
            self.ptr = ctypes.c_ulonglong()
        if self.handle.value:
            d.lib.cuMemRelease(self.handle)
            self.handle = ctypes.c_ulonglong()
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
