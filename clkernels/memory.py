"""Does an allocation fit? Checked before big buffers are made, so that a request the device or
the host cannot serve is a :class:`DeviceMemoryError` that says how much was needed and what to
do, never an abort inside the OpenCL driver.

Why the host too: on a CPU device (PoCL) a device buffer is host memory, and PoCL does not
report a failed ``malloc`` as ``CL_MEM_OBJECT_ALLOCATION_FAILURE``: it asserts or dereferences
NULL, and the process dies (rc 134/139), for instance under ``ulimit -v``. So on CPU devices the
host's free memory (``MemAvailable`` of ``/proc/meminfo``) and the process' address-space limit
(``RLIMIT_AS`` minus its current ``VmSize``) bound what may be allocated, beside the device's
own limits (global memory, largest single allocation).

The check reads ``/proc`` (tens of microseconds): the launch layer makes it once per plan (a
call signature's first call), for plans whose buffers pass :data:`CHECKED_BYTES`, never on a
repeat call.
"""
from __future__ import annotations

import resource
from typing import Optional, Tuple

# Buffers smaller than this in all are not checked: they cannot be what exhausts a host, and the
# check would cost more than the allocation.
CHECKED_BYTES = 64 << 20


class DeviceMemoryError(MemoryError):
    """A request does not fit in the device's (or, for a CPU device, the host's) memory; the
    message says how many bytes were needed, how many are available and what to do.
    ``solvers.ba.lm_device.DeviceMemoryError`` is this class."""

    def __init__(self, message: str, needed: int = 0, available: Optional[int] = None):
        super().__init__(message)
        self.needed, self.available = needed, available


def _meminfo_available() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _vm_size() -> Optional[int]:
    # VmSize (the address space in use), not the resident size: RLIMIT_AS limits the former.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def host_available() -> Tuple[Optional[int], str]:
    """``(bytes, what limits them)``: the least of the host's available memory and what the
    address-space limit leaves this process; ``(None, "")`` where neither can be read."""
    found = []
    avail = _meminfo_available()
    if avail is not None:
        found.append((avail, "the host's available memory, MemAvailable"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        used = _vm_size()
        if used is not None:
            found.append((max(0, soft - used), f"this process' address-space limit, RLIMIT_AS (ulimit -v), "
                                               f"of {soft / 2**30:.2f} GiB with {used / 2**30:.2f} GiB in use"))
    if not found:
        return None, ""
    return min(found, key=lambda f: f[0])


def available(info) -> Tuple[int, str]:
    """``(bytes, what limits them)`` a device (a :class:`clkernels.DeviceInfo`) may still
    allocate in all: its global memory, and on a CPU device the host's (:func:`host_available`)."""
    have, why = int(info.global_mem_bytes), f"{info.name!r}'s global memory"
    if info.is_cpu:
        host, host_why = host_available()
        if host is not None and host < have:
            have, why = host, host_why
    return have, why


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB ({n} bytes)"


def check(info, needed: int, what: str, largest: int = 0, advice: str = "") -> None:
    """Raise :class:`DeviceMemoryError` unless ``needed`` bytes in all, the largest buffer
    ``largest`` bytes, fit on the device of ``info``. ``what`` names the request in the message
    (e.g. ``"letterbox's output"``); ``advice``: what the caller can do, beside the generic."""
    fix = advice or "use smaller inputs (a smaller size or fewer items per call)"
    # The largest allocation only on CPU devices: PoCL refuses more, while NVIDIA's driver serves
    # buffers past the quarter of its memory it reports (refusing them would refuse what works).
    if info.is_cpu and largest > info.max_alloc_bytes:
        raise DeviceMemoryError(
            f"{what} needs a buffer of {_gib(largest)}, more than one allocation may be on "
            f"{info.name!r} ({_gib(int(info.max_alloc_bytes))}); {fix}", largest, int(info.max_alloc_bytes))
    if needed < CHECKED_BYTES:
        return
    have, why = available(info)
    if needed > have:
        more = "free memory or raise the limit (ulimit -v), or " if info.is_cpu else "use a device with more memory, or "
        raise DeviceMemoryError(
            f"{what} needs {_gib(needed)} on {info.name!r}, but only {_gib(have)} is available "
            f"({why}); {more}{fix}", needed, have)
