"""Every workaround for the Oclgrind simulator, with its reason, in one place.

Oclgrind (Debian's ``oclgrind``) runs kernels in an interpreter that reports out-of-bounds
accesses, uninitialised reads and data races. Its checks have a few blind spots that would
report correct code as wrong; production code never tests for the simulator itself but asks
this module, so the workarounds can be found, reasoned about and removed together.

Each function is a no-op (or the normal answer) on every real device.
"""
from __future__ import annotations

from .runtime import Runtime

__all__ = ["active", "cpu_like", "build_options", "binary_cache_ok", "zeros_from_host", "keep", "zero_copy_ok",
           "single_write_from_offset_zero", "OPTIMISER_HIDES_FREEZE"]

# Templates whose programs are built unoptimised on the simulator: its uninitialised-value
# checker cannot follow the `freeze` that LLVM's optimiser puts on a paired / and %, so
# optimised code reads as uninitialised (and optimised code could hide what the checks are
# there to find).
OPTIMISER_HIDES_FREEZE = frozenset({"clkernels/dcnv4.cl.mako", "solvers/linalg/dense_cholesky_device.cl.mako"})


def active(runtime: Runtime) -> bool:
    """Whether the runtime is the simulator."""
    return runtime.info.is_simulator


def cpu_like(info) -> bool:
    """Whether a device (its DeviceInfo) gets the configurations chosen for CPUs: CPUs, and the
    simulator, which interprets every work-item on the host; there the CPU configurations (wide
    work-items, no compare-and-swap loops) keep its runs short."""
    return info.is_cpu or info.is_simulator


def build_options(runtime: Runtime, template: str) -> tuple:
    """Extra build options for a template on this runtime (see OPTIMISER_HIDES_FREEZE)."""
    if runtime.info.is_simulator and template in OPTIMISER_HIDES_FREEZE:
        return ("-cl-opt-disable",)
    return ()


def binary_cache_ok(runtime: Runtime) -> bool:
    """Whether programs go through the on-disk binary cache (clkernels.cache): not on the
    simulator, which builds in milliseconds and whose checks are what a run there is for, so every
    run builds what it checks from source."""
    return not runtime.info.is_simulator


def zeros_from_host(runtime: Runtime) -> bool:
    """Whether zero-filled or kernel-written scratch buffers must be written from the host.

    The uninitialised-memory checker keeps the shadow of a released buffer and reuses it, at
    the old size, for the next buffer given the same index: a fill kernel's stores past the
    old size are lost, and later reads are reported as uninitialised. A host write resizes the
    shadow. clEnqueueFillBuffer's result is not counted as initialised either."""
    return runtime.info.is_simulator


_KEPT: list = []


def keep(runtime: Runtime, *objects) -> None:
    """Never release these device arrays on the simulator (for the shadow reuse described in
    :func:`zeros_from_host`: a fresh output per call would be reported as uninitialised).
    Only for the tiny shapes the simulator runs."""
    if runtime.info.is_simulator:
        _KEPT.append(objects)


def zero_copy_ok(runtime: Runtime) -> bool:
    """Whether kernels may read and write host memory in place (USE_HOST_PTR buffers): on CPU
    devices, but not on the simulator, whose checks count host-pointer memory as
    uninitialised."""
    return runtime.info.is_cpu and not runtime.info.is_simulator


def single_write_from_offset_zero(runtime: Runtime) -> bool:
    """Whether a buffer filled by several writes must be staged on the host and written once
    from offset 0: Oclgrind 21.10 marks bytes written at a non-zero buffer offset (write or
    copy) as uninitialised, and clobbers what earlier writes marked."""
    return runtime.info.is_simulator
