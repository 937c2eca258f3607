"""OpenCL devices: discovery, selection, capabilities, and one cached context + queue each.

Selection order (first that applies wins):
  1. an explicit ``device=`` argument (a ``pyopencl.Device`` or a spec string),
  2. a device chosen in code with :func:`use_device`,
  3. the environment variable ``PYCLAD_DEVICE``,
  4. pyopencl's own ``PYOPENCL_CTX``,
  5. the default: the first GPU, else the first CPU device that is not a simulator.

Spec grammar (case-insensitive): ``[platform][:device]`` where each part is a substring
of the name (platform name/vendor, device name) or an index, plus the type words ``cpu``,
``gpu`` and ``accelerator`` in either part. Examples: ``nvidia``, ``pocl``, ``pocl:0``,
``gpu``, ``oclgrind``, ``0:1``, ``:cpu``.
"""
from __future__ import annotations

import contextvars
import dataclasses
import os
import threading
import warnings
from typing import Callable, List, Optional, Tuple, Union

import pyopencl as cl

__all__ = [
    "DeviceNotFoundError", "NoPlatformError", "DeviceInfo", "Runtime",
    "list_devices", "match_devices", "select_device", "get_runtime", "use_device",
    "describe_devices", "runtime_for_queue", "runtime_for_context", "unusable_devices",
    "start_in_background",
]

_TYPE_WORDS = {
    "cpu": cl.device_type.CPU,
    "gpu": cl.device_type.GPU,
    "accelerator": cl.device_type.ACCELERATOR,
}

NO_PLATFORM_HELP = (
    "No OpenCL platform found. Install a driver (ICD) for your hardware, or get a CPU "
    "device with:  pip install pocl-binary-distribution  (Linux x86-64), or Debian's "
    "pocl-opencl-icd package."
)


class NoPlatformError(RuntimeError):
    """No OpenCL platform (ICD) is installed."""


class DeviceNotFoundError(LookupError):
    """A device spec matched nothing; the message lists every device found."""


_device_list: List[cl.Device] = []
_unusable: List[Tuple[cl.Device, str]] = []

UNKNOWN_CPU_HELP = (
    "its compiler does not know this CPU: PoCL asks LLVM for the host CPU's name, an LLVM older "
    "than the CPU answers 'generic', and clang then rejects every build (PoCL 3.0 from PyPI, "
    "LLVM 14, on an AMD Zen 5 host). Install a PoCL whose LLVM knows it, for example Debian's "
    "pocl-opencl-icd (apt-get install pocl-opencl-icd), or use another OpenCL device.")


def list_devices() -> List[cl.Device]:
    """Every usable device of every OpenCL platform, in platform order. Enumerated once per
    process: the ICDs do not change while it runs, and enumeration costs tens of microseconds per
    call. A device that cannot build any kernel is left out with a warning that says why and what
    to install (:func:`unusable_devices` lists them)."""
    _wait_for_background()
    if _device_list:
        return list(_device_list)
    try:
        platforms = cl.get_platforms()
    except (cl.LogicError, cl.RuntimeError) as exc:  # PLATFORM_NOT_FOUND_KHR
        raise NoPlatformError(f"{NO_PLATFORM_HELP} ({exc})") from None
    devices = []
    _unusable.clear()       # a failed enumeration is redone whole on the next call
    for platform in platforms:
        try:
            found = platform.get_devices()
        except (cl.LogicError, cl.RuntimeError):
            continue  # a platform with no usable device: skip it, keep the others
        for d in found:
            why = _unusable_reason(d)
            if why is None:
                devices.append(d)
            else:
                _unusable.append((d, why))
                warnings.warn(f"OpenCL device {d.name.strip()!r} ({d.platform.name.strip()}) is left "
                              f"out: {why}", RuntimeWarning, stacklevel=2)
    if not devices and _unusable:
        broken = "".join(f"\n  {d.name.strip()} ({d.platform.name.strip()}): {why}" for d, why in _unusable)
        raise NoPlatformError(f"No usable OpenCL device. Found but left out:{broken}")
    if not devices:
        raise NoPlatformError(NO_PLATFORM_HELP)
    _device_list.extend(devices)
    return list(devices)


def unusable_devices() -> List[Tuple[cl.Device, str]]:
    """The devices :func:`list_devices` left out, each with the reason."""
    list_devices()
    return list(_unusable)


def _compiler_cpu(device: cl.Device) -> Optional[str]:
    """The CPU a PoCL x86-64 CPU device compiles for, from its version string
    ("... HSTR: pthread-x86_64-unknown-linux-gnu-znver3" names znver3); None for other devices."""
    version = device.version or ""
    if "HSTR:" not in version or not device.type & cl.device_type.CPU:
        return None
    target = version.split("HSTR:", 1)[1].strip().split()[0]
    if "x86_64" not in target:
        return None
    return target.rsplit("-gnu-", 1)[-1] if "-gnu-" in target else ""


def _unusable_reason(device: cl.Device) -> Optional[str]:
    """Why ``device`` cannot build kernels, or None. Only a PoCL device compiling for the
    'generic' CPU is suspect (see UNKNOWN_CPU_HELP); one tiny build tells, so a PoCL whose clang
    does take 'generic' stays in."""
    if _compiler_cpu(device) != "generic":
        return None
    try:
        ctx = cl.Context([device])
        cl.Program(ctx, "__kernel void probe(__global int *a) { a[0] = 1; }").build()
    except cl.Error as exc:
        text = str(exc)
        if "unknown target CPU" in text:
            return UNKNOWN_CPU_HELP
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return f"a one-line kernel does not build: {' '.join(lines[-3:])[:300]}"
    return None


def _is_simulator(device: cl.Device) -> bool:
    return "oclgrind" in device.platform.name.lower()


def _match_part(part: str, devices, names) -> List[cl.Device]:
    if part in _TYPE_WORDS:
        return [d for d in devices if d.type & _TYPE_WORDS[part]]
    return [d for d, name in zip(devices, names) if part in name]


def match_devices(spec: str, devices: Optional[List[cl.Device]] = None) -> List[cl.Device]:
    """All devices matching a ``[platform][:device]`` spec, in platform order.

    Each part of the spec is case-insensitive: an index, a substring of the platform's name and
    vendor (or of the device's name), or one of ``cpu``, ``gpu``, ``accelerator``. A bare word
    that names no platform is tried against the device names (``"h200"``, ``"xeon"``).

    Args:
        spec: for example ``"nvidia"``, ``"pocl:0"``, ``"gpu"``, ``"0:1"``, ``":cpu"``.
        devices: the devices to choose from (default: :func:`list_devices`).

    Returns:
        The matching ``pyopencl.Device`` objects; empty when nothing matches.

    Raises:
        NoPlatformError: no OpenCL platform is installed (when ``devices`` is not given).
    """
    devices = list_devices() if devices is None else devices
    spec = spec.strip().lower()
    plat_part, sep, dev_part = spec.partition(":")
    plat_part, dev_part = plat_part.strip(), dev_part.strip()

    platforms = []
    for d in devices:
        if d.platform not in platforms:
            platforms.append(d.platform)
    if plat_part.isdigit():
        index = int(plat_part)
        chosen = [d for d in devices if index < len(platforms) and d.platform == platforms[index]]
    elif plat_part:
        chosen = _match_part(
            plat_part, devices,
            [f"{d.platform.name} {d.platform.vendor}".lower() for d in devices])
        if not chosen and not sep:
            # "h200" or "xeon": a bare word may name the device rather than the platform.
            chosen = _match_part(plat_part, devices, [d.name.lower() for d in devices])
    else:
        chosen = list(devices)
    if dev_part.isdigit():
        # Index within each matched platform, as PYOPENCL_CTX does.
        index = int(dev_part)
        per_platform = {}
        for d in chosen:
            per_platform.setdefault(d.platform.int_ptr, []).append(d)
        chosen = [ds[index] for ds in per_platform.values() if index < len(ds)]
    elif dev_part:
        chosen = _match_part(dev_part, chosen, [d.name.lower() for d in chosen])
    return chosen


def describe_devices(devices: Optional[List[cl.Device]] = None, mark=None) -> str:
    """A printable table of devices, one line each, as ``python -m clkernels`` shows it.

    Args:
        devices: the devices to list (default: :func:`list_devices`).
        mark: a ``pyopencl.Device`` to point at with an arrow (the chosen one), or None.

    Returns:
        The table: per platform its devices with type, compute units, memory, work-group limit
        and fp64 support, then a ``left out: ...`` line for each unusable device.
    """
    devices = list_devices() if devices is None else devices
    lines = []
    platforms = []
    for d in devices:
        if d.platform not in platforms:
            platforms.append(d.platform)
    for p_index, platform in enumerate(platforms):
        lines.append(f"platform {p_index}: {platform.name} ({platform.vendor}, {platform.version})")
        for d_index, d in enumerate([d for d in devices if d.platform == platform]):
            info = DeviceInfo.of(d)
            arrow = "->" if mark is not None and d == mark else "  "
            lines.append(
                f" {arrow} {p_index}:{d_index}  {info.name}  [{info.type_name}]  "
                f"{info.compute_units} CUs, {info.global_mem_bytes / 2**30:.1f} GiB global, "
                f"{info.local_mem_bytes // 1024} KiB local, max work-group {info.max_work_group_size}, "
                f"fp64 {'yes' if info.fp64 else 'no'}")
    for d, why in _unusable:
        lines.append(f"left out: {d.name.strip()} ({d.platform.name.strip()}): {why}")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What kernels and launchers need to know about a device, read once (``Runtime.info``).

    Attributes:
        name: the device's name.
        platform: the platform's name.
        vendor: one of ``nvidia``, ``amd``, ``intel``, ``apple``, ``pocl``, ``oclgrind``, ``other``.
        type_name: the device's types (``cpu``, ``gpu``, ``accelerator``, joined by ``/``), or ``other``.
        compute_units: the device's compute units.
        global_mem_bytes: global memory.
        max_alloc_bytes: the largest single allocation.
        local_mem_bytes: local memory per work-group.
        max_work_group_size: the largest work-group.
        fp64: whether the device has ``cl_khr_fp64`` (float64 kernels need it).
        int64_atomics: whether it has 64-bit integer atomics.
        is_simulator: the Oclgrind simulator.
        is_cpu: a CPU device.
        native_vector_width_float: the float vector width its compiler emits (CPUs: the
            target's SIMD width, which may be narrower than the hardware's).
        native_vector_width_double: the same for double.
        max_constant_bytes: the constant-memory buffer limit.
    """
    name: str
    platform: str
    vendor: str  # one of nvidia, amd, intel, apple, pocl, oclgrind, other
    type_name: str
    compute_units: int
    global_mem_bytes: int
    max_alloc_bytes: int
    local_mem_bytes: int
    max_work_group_size: int
    fp64: bool
    int64_atomics: bool
    is_simulator: bool
    is_cpu: bool
    native_vector_width_float: int = 1
    native_vector_width_double: int = 1
    max_constant_bytes: int = 64 << 10

    def widest_vector(self, real: str) -> Optional[int]:
        """The widest OpenCL vector of ``real`` ("double" or "float", also for half storage
        computed in float) that a kernel configuration may ask for: on CPU compilers their
        target's native width (PoCL may report a wider one than the CPU it compiles for, and
        LLVM can abort on the wider vectors); None, any width, on GPUs and on the simulator."""
        if not self.is_cpu or self.is_simulator:
            return None
        return self.native_vector_width_double if real == "double" else self.native_vector_width_float

    @classmethod
    def of(cls, device: cl.Device) -> "DeviceInfo":
        text = f"{device.platform.name} {device.platform.vendor} {device.vendor}".lower()
        for vendor in ("oclgrind", "pocl", "portable computing", "nvidia", "amd",
                       "advanced micro", "intel", "apple"):
            if vendor in text:
                break
        else:
            vendor = "other"
        vendor = {"portable computing": "pocl", "advanced micro": "amd"}.get(vendor, vendor)
        types = [word for word, bit in _TYPE_WORDS.items() if device.type & bit] or ["other"]
        ext = device.extensions.split()
        return cls(
            name=device.name.strip(), platform=device.platform.name.strip(), vendor=vendor,
            type_name="/".join(types), compute_units=device.max_compute_units,
            global_mem_bytes=device.global_mem_size, max_alloc_bytes=device.max_mem_alloc_size,
            local_mem_bytes=device.local_mem_size,
            max_work_group_size=device.max_work_group_size,
            fp64="cl_khr_fp64" in ext or device.double_fp_config != 0,
            int64_atomics="cl_khr_int64_base_atomics" in ext,
            is_simulator=_is_simulator(device),
            is_cpu=bool(device.type & cl.device_type.CPU),
            native_vector_width_float=_compiled_vector_width(device, device.native_vector_width_float, 4),
            native_vector_width_double=_compiled_vector_width(device, device.native_vector_width_double, 8),
            max_constant_bytes=device.max_constant_buffer_size)


# LLVM CPU names whose instruction set has 512-bit vectors (AVX-512).
_AVX512_CPUS = frozenset((
    "knl", "knm", "skylake-avx512", "skx", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
    "icelake-server", "tigerlake", "rocketlake", "sapphirerapids", "emeraldrapids", "graniterapids",
    "graniterapids-d", "diamondrapids", "znver4", "znver5", "x86-64-v4"))


def _compiled_vector_width(device: cl.Device, width: int, item_bytes: int) -> int:
    """The native vector width of the code a device's compiler emits, not of the hardware.

    PoCL reports the host's hardware width, but compiles for the CPU it names in its version
    string ("... HSTR: pthread-x86_64-unknown-linux-gnu-znver3"). On a Zen 4 host inside a VM,
    PoCL 3.0 reports 8 doubles (AVX-512) yet compiles for znver3 (256 bits), and LLVM then
    aborts the whole process on a double8 sqrt ("Cannot select: fsqrt"). So a PoCL x86 CPU
    device whose target has no AVX-512 gets at most 256-bit vectors."""
    width = max(1, int(width))
    cpu = _compiler_cpu(device)
    if cpu is None:
        return width
    return width if cpu in _AVX512_CPUS else min(width, 32 // item_bytes)


_chosen_in_code: contextvars.ContextVar = contextvars.ContextVar("pyclad_device", default=None)


def _default_device(devices) -> cl.Device:
    for kind in (cl.device_type.GPU, cl.device_type.CPU):
        for d in devices:
            if d.type & kind and not _is_simulator(d):
                return d
    return devices[0]


def _resolve_spec(spec: str, devices, origin: str) -> cl.Device:
    matches = match_devices(spec, devices)
    if not matches:
        raise DeviceNotFoundError(
            f"{origin} = {spec!r} matches no OpenCL device. Devices found:\n"
            f"{describe_devices(devices)}\n"
            "Spec grammar: [platform][:device], substrings or indices, or cpu/gpu/accelerator "
            "(for example 'pocl', 'nvidia', 'gpu', 'pocl:0').")
    return matches[0]


DeviceLike = Union[None, str, cl.Device]


def select_device(device: DeviceLike = None) -> Tuple[cl.Device, str]:
    """The device to use and the reason it was chosen.

    In this order: ``device`` itself, :class:`use_device` in code, the environment variables
    ``PYCLAD_DEVICE`` and ``PYOPENCL_CTX``, then the default: the first GPU, else the first CPU,
    that is not the Oclgrind simulator (else the first device).

    Args:
        device: None, a spec string (see :func:`match_devices`) or a ``pyopencl.Device``.

    Returns:
        ``(device, reason)``: the ``pyopencl.Device`` and a short text saying why, such as
        ``"environment PYCLAD_DEVICE='pocl'"``.

    Raises:
        DeviceNotFoundError: a spec (argument, ``use_device`` or environment) matches nothing;
            the message lists every device found.
        NoPlatformError: no OpenCL platform is installed.
        TypeError: ``device`` is of another type.
    """
    if isinstance(device, cl.Device):
        return device, "explicit argument"
    devices = list_devices()
    if isinstance(device, str):
        return _resolve_spec(device, devices, "device argument"), f"explicit argument {device!r}"
    if device is not None:
        raise TypeError(f"device must be None, a spec string or a pyopencl.Device, "
                        f"not {type(device).__name__}")
    in_code = _chosen_in_code.get()
    if in_code is not None:
        if isinstance(in_code, cl.Device):
            return in_code, "clkernels.use_device()"
        return _resolve_spec(in_code, devices, "use_device"), f"clkernels.use_device({in_code!r})"
    for var in ("PYCLAD_DEVICE", "PYOPENCL_CTX"):
        spec = os.environ.get(var, "").strip()
        if spec:
            return _resolve_spec(spec, devices, var), f"environment {var}={spec!r}"
    return _default_device(devices), "default (first GPU, else first CPU)"


class Runtime:
    """A device with its context, in-order queue, capabilities and memory pool.

    The library's own runtimes (:func:`get_runtime`) make a context and an in-order queue that
    records no timestamps (see :meth:`profiled`); :func:`runtime_for_queue` wraps a caller's
    queue (and context) instead, so arrays made on a context the library did not create work as
    they are."""

    def __init__(self, device: cl.Device, context: cl.Context = None, queue: cl.CommandQueue = None):
        self.device = device
        if context is None:             # one made without the GIL by start_in_background, if any
            context = _prepared_contexts.pop(device.int_ptr, None)
        self.context = context if context is not None else cl.Context([device])
        # No profiling by default: on NVIDIA's driver it costs the host about 6 us a launch (see
        # profiled), which a caller of a short op or a solver's thousands of launches would pay.
        self.queue = queue if queue is not None else cl.CommandQueue(self.context, device)
        self.info = DeviceInfo.of(device)
        self._pool = None
        self._companion = None      # the runtime of the other profiling mode, same context
        # Launch plans (clkernels.launch) keyed per op and call signature. They hold kernels
        # of this context, so they live with it.
        self.plans: dict = {}
        # Where a launch's outputs come from instead of the pool, while it is set: an object with
        # allocate(nbytes) -> buffer (clkernels.interop's memory shared with CUDA, for one call).
        self.output_pool = None

    @property
    def pool(self):
        """This queue's memory pool: outputs and temporaries of repeat calls reuse freed buffers
        instead of allocating (pyopencl.tools.MemoryPool). One per queue, not per context: a
        buffer freed while a kernel of this in-order queue still uses it may only be handed to
        later commands of the same queue."""
        if self._pool is None:
            from pyopencl.tools import ImmediateAllocator, MemoryPool
            # ImmediateAllocator: allocation errors surface at once (not at first use).
            self._pool = MemoryPool(ImmediateAllocator(self.queue))
        return self._pool

    @property
    def profiling(self) -> bool:
        return bool(self.queue.properties & cl.command_queue_properties.PROFILING_ENABLE)

    def profiled(self) -> "Runtime":
        """A Runtime on the same device and context whose in-order queue records timestamps
        (``event.profile``), made once: for benchmarks and ``profile_kernels``. Each launch on it
        costs the host more on NVIDIA's driver (H200 machine: 15 us against 8.7 us a preset
        launch), which is why the library's own queues leave it off. Arrays of both share the
        context; work on one queue is not ordered with the other's, so a caller finishes one
        before the other reads."""
        return self if self.profiling else self._other_mode()

    def unprofiled(self) -> "Runtime":
        """This runtime if its queue records no timestamps, else one on the same device and
        context whose queue does not (made once; see :meth:`profiled`)."""
        return self._other_mode() if self.profiling else self

    def _other_mode(self) -> "Runtime":
        if self._companion is None:
            props = 0 if self.profiling else cl.command_queue_properties.PROFILING_ENABLE
            other = runtime_for_queue(cl.CommandQueue(self.context, self.device, properties=props))
            other._companion, self._companion = self, other
        return self._companion

    def __repr__(self):
        return f"<Runtime {self.info.name!r} on {self.info.platform!r}>"


_runtimes: dict = {}        # device pointer -> the library's Runtime
_by_queue: dict = {}        # queue pointer -> Runtime (the library's and callers' queues)
_by_context: dict = {}      # context pointer -> Runtime with a queue of the library's
_selected: dict = {}        # selection inputs -> Runtime, so a repeat call enumerates nothing


def _own_runtime(device: cl.Device) -> Runtime:
    key = device.int_ptr
    if key not in _runtimes:
        rt = _runtimes[key] = Runtime(device)
        _by_queue[rt.queue.int_ptr] = rt
        _by_context[rt.context.int_ptr] = rt
    return _runtimes[key]


def get_runtime(device: DeviceLike = None) -> Runtime:
    """The library's :class:`Runtime` (context, in-order queue, memory pool) for a device.

    Made once per device and kept for the process, so repeat calls cost a dictionary look-up.

    Args:
        device: None (the device :func:`select_device` chooses), a spec string, a
            ``pyopencl.Device``, or a :class:`Runtime` (returned as it is).

    Returns:
        The device's :class:`Runtime`.

    Raises:
        DeviceNotFoundError: the spec matches no device.
        NoPlatformError: no OpenCL platform is installed.

    Example::

        rt = clkernels.get_runtime("pocl")
        print(rt.info.name, rt.info.fp64)
    """
    if isinstance(device, Runtime):
        return device
    _wait_for_background()
    if device is None or isinstance(device, str):
        # What decides the choice: the argument, use_device() and the two variables.
        key = (device, _chosen_in_code.get(), os.environ.get("PYCLAD_DEVICE"),
               os.environ.get("PYOPENCL_CTX"))
        try:
            rt = _selected.get(key)
        except TypeError:   # use_device() given an unhashable object: no caching
            rt, key = None, None
        if rt is None:
            rt = _own_runtime(select_device(device)[0])
            if key is not None:
                _selected[key] = rt
        return rt
    return _own_runtime(select_device(device)[0])


# ----------------------------------------------------------------- a start in the background

_background: Optional[threading.Thread] = None
_background_error: Optional[BaseException] = None
_background_lock = threading.Lock()
_prepared_contexts: dict = {}       # device int_ptr -> a context made without the GIL


def start_in_background(device: DeviceLike = None, then: Optional[Callable[[Runtime], object]] = None) -> None:
    """Start the OpenCL driver and make ``device``'s :class:`Runtime` (as :func:`get_runtime`
    would) in a thread, then call ``then(runtime)`` there; at most once per process. For
    command-line tools, which call it before they read their input.

    The driver's start (enumerating the platforms, making a context: about a quarter of a second
    on NVIDIA's) runs through :mod:`clkernels.opencl_nogil`, without the GIL, so the process goes
    on reading and importing meanwhile; through pyopencl it would hold the GIL throughout. Every
    function of this module that needs the devices waits for the thread first, so nothing sees a
    half-made state. Where the thread fails for a reason the foreground meets again (no platform,
    no such device, a driver error), it leaves nothing behind and the foreground's own call
    reports it as without this; any other exception is raised by the next such function."""
    global _background
    with _background_lock:
        if _background is not None:
            return
        # Not a daemon: an early exit (a bad input file) waits for the driver's start to end
        # rather than unloading the driver under it. In the caller's context, so that a
        # use_device() there chooses the device as it would here.
        _background = threading.Thread(target=contextvars.copy_context().run, args=(_start, device, then),
                                       name="opencl-start")
        _background.start()


def _start(device, then):
    global _background_error
    from . import opencl_nogil
    try:
        opencl_nogil.start_drivers()
        chosen = select_device(device)[0]
        handle = opencl_nogil.create_context(chosen.int_ptr)
        if handle is not None:
            _prepared_contexts[chosen.int_ptr] = cl.Context.from_int_ptr(handle, retain=False)
        runtime = get_runtime(device)
        if then is not None:
            then(runtime)
    except (NoPlatformError, DeviceNotFoundError, cl.Error, OSError):
        _prepared_contexts.clear()      # the foreground's call meets the reason and reports it
    except BaseException as e:          # noqa: B902 - raised in the foreground (see below)
        _background_error = e


def _wait_for_background():
    """Wait for :func:`start_in_background`'s thread (not from the thread itself); raise what it
    raised that the foreground would not meet again, once."""
    global _background_error
    thread = _background
    if thread is None or thread is threading.current_thread():
        return
    thread.join()
    error, _background_error = _background_error, None
    if error is not None:
        raise RuntimeError(f"starting the OpenCL runtime in the background failed: {error!r}") from error


def runtime_for_queue(queue: cl.CommandQueue) -> Runtime:
    """A Runtime over a caller's queue (its context and first device), made once per queue."""
    rt = _by_queue.get(queue.int_ptr)
    if rt is None:
        if queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE:
            raise ValueError("the queue is out-of-order; clkernels orders its work by the queue, so "
                             "pass an in-order queue (the default of pyopencl.CommandQueue)")
        devices = queue.context.devices
        device = queue.device if queue.device is not None else devices[0]
        rt = _by_queue[queue.int_ptr] = Runtime(device, queue.context, queue)
    return rt


def runtime_for_context(context: cl.Context) -> Runtime:
    """A Runtime on a caller's context (for arrays made without a queue): the library's own
    runtime when it is the library's context, else one with a new queue on it."""
    rt = _by_context.get(context.int_ptr)
    if rt is None:
        rt = _by_context[context.int_ptr] = runtime_for_queue(cl.CommandQueue(context))
    return rt


class use_device:
    """Choose the device in code: ``use_device("pocl")`` sets it until changed;
    ``with use_device("nvidia") as rt: ...`` sets it for the block only (``rt`` is its
    :class:`Runtime`).

    The choice is per context variable (per thread and asyncio task) and comes before the
    environment variables; an explicit ``device=`` argument still wins over it.

    Args:
        device: a spec string (see :func:`match_devices`), a ``pyopencl.Device``, or None to go
            back to the environment and the default.

    Raises:
        DeviceNotFoundError: the spec matches no device (at once, not at the first launch).
        TypeError: ``device`` is of another type.
    """

    def __init__(self, device: DeviceLike):
        if device is not None and not isinstance(device, (str, cl.Device)):
            raise TypeError("use_device() takes a spec string, a pyopencl.Device or None")
        if isinstance(device, str):
            _resolve_spec(device, list_devices(), "use_device")  # fail now, not at first launch
        self._token = _chosen_in_code.set(device)

    def __enter__(self):
        return get_runtime()

    def __exit__(self, *exc):
        _chosen_in_code.reset(self._token)
        return False
