"""The launch layer every op is built on: calls that cost little more than their kernels.

An op declares its array parameters (:class:`Param`) and writes one function that makes a
:class:`LaunchPlan` for a call signature; :class:`LaunchOp` does the rest, written once here:

- the runtime comes from the inputs (arrays on a caller's own context and queue work as they
  are), or from ``queue=`` / ``device=``;
- a plan is cached per (queue, op, shapes and dtypes, options, config). Making it is the work
  of a first call: the checks that depend only on shapes and options (errors name the
  argument), rendering, building, work sizes, scalar arguments. A repeat call renders,
  hashes, enumerates and derives nothing; it checks the arrays' kinds, sets the buffer
  arguments of the plan's own kernel objects and enqueues;
- outputs and temporaries come from the queue's memory pool;
- ``out=`` takes the caller's arrays for the outputs;
- results come back in the inputs' form: numpy in, numpy out; device arrays in (any of them),
  device arrays out with no copy.
"""
from __future__ import annotations

import math
import threading
import weakref
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from . import arrays, memory, simulator
from . import dtypes as dtypes_      # (Param has an argument named dtypes)
from .runtime import Runtime, get_runtime, runtime_for_context, runtime_for_queue
from .templates import Storage, build, get_program

__all__ = ["Param", "LaunchOp", "LaunchPlan", "Step", "Buffer", "kernel_for_plan", "runtime_for",
           "device_array", "check_host_out", "pooled_array", "accumulator", "ZeroStep", "Slot", "In", "Out", "Tmp", "step", "scratch_steps", "program", "convert_step", "INPUT", "OUTPUT", "TEMP"]

INPUT, OUTPUT, TEMP = 0, 1, 2   # where a kernel argument's buffer comes from, per call


class Param:
    """One array argument of an op: its name (errors use it), the dtypes it takes, or ``like``,
    the name of an earlier parameter whose dtype it must have, and its number of dimensions."""

    __slots__ = ("name", "dtypes", "ndim", "like")

    def __init__(self, name: str, dtypes: Sequence = (), ndim: Optional[int] = None,
                 like: Optional[str] = None):
        self.name, self.ndim, self.like = name, ndim, like
        self.dtypes = dtypes_.allowed(dtypes)
        if not self.dtypes and like is None:
            raise ValueError(f"Param {name!r} needs dtypes or like=")

    def check(self, a, dtype_of: dict):
        """Named errors for a wrong dtype or number of dimensions."""
        if self.like is not None:
            dtypes_.require(self.name, a.dtype, (dtype_of[self.like],), f" like {self.like}")
        else:
            dtypes_.require(self.name, a.dtype, self.dtypes)
        if self.ndim is not None and a.ndim != self.ndim:
            raise ValueError(f"{self.name} must have {self.ndim} dimensions, got shape {tuple(a.shape)}")


class Buffer:
    """An output or temporary of a plan: shape and dtype, fixed by the call signature."""

    __slots__ = ("name", "shape", "dtype", "nbytes", "strides", "size")

    def __init__(self, name: str, shape, dtype):
        self.name, self.shape, self.dtype = name, tuple(int(s) for s in shape), np.dtype(dtype)
        self.size = math.prod(self.shape)   # (np.prod costs microseconds per call)
        self.nbytes = self.size * self.dtype.itemsize
        strides, step = [], self.dtype.itemsize
        for s in reversed(self.shape):
            strides.append(step)
            step *= max(1, s)
        self.strides = tuple(reversed(strides))


class Step:
    """One kernel launch of a plan. ``kernel`` is the plan's own kernel object: its scalar,
    local-memory and constant-buffer arguments (``fixed``: (index, value) pairs) are set once
    when the plan is made; ``slots`` lists the arguments set per call, as (argument index,
    INPUT/OUTPUT/TEMP, position)."""

    __slots__ = ("kernel", "global_size", "local_size", "slots")

    def __init__(self, kernel: cl.Kernel, global_size, local_size, slots, fixed=()):
        self.kernel = kernel
        self.global_size = tuple(int(g) for g in global_size)
        self.local_size = None if local_size is None else tuple(int(s) for s in local_size)
        self.slots = tuple(slots)
        for index, value in fixed:
            kernel.set_arg(index, value)

    @property
    def work_items(self) -> int:
        return int(np.prod(self.global_size))

    def launch(self, queue, sources, wait_for) -> cl.Event:
        k = self.kernel
        for index, source, position in self.slots:
            k.set_arg(index, sources[source][position])
        return cl.enqueue_nd_range_kernel(queue, k, self.global_size, self.local_size,
                                          wait_for=wait_for)


class Preset:
    """A kernel launched again and again by one owner, whose arguments are set only when they
    change: pyopencl's ``kernel(queue, ...)`` sets every argument at every launch, which on
    NVIDIA's driver costs the host about as much as the enqueue itself (H200 machine: 31 us
    against 15 us a launch). Memory objects compare by handle (no reference is kept, so a buffer
    freed by its owner is not held alive here), numpy scalars by type and bytes (so -0.0 is not
    0.0, and a NaN equals itself), other values by type and value. The kernel object must be this
    Preset's alone: an argument set behind its back would go unnoticed."""

    __slots__ = ("kernel", "last")

    def __init__(self, kernel: cl.Kernel):
        self.kernel = kernel
        self.last = [None] * kernel.num_args

    def __call__(self, queue, global_size, local_size, *args) -> cl.Event:
        k, last = self.kernel, self.last
        for i, a in enumerate(args):
            if isinstance(a, cl.MemoryObjectHolder):
                key = (a.int_ptr,)
            elif isinstance(a, np.generic):
                key = (type(a), a.tobytes())
            else:
                key = (type(a), a)
            if key != last[i]:
                k.set_arg(i, a)
                last[i] = key
        return cl.enqueue_nd_range_kernel(queue, k, global_size, local_size)


_free_kernels: dict = {}        # (program handle, kernel name) -> kernel objects no owner holds


def owned_kernel(program: cl.Program, name: str, owner) -> cl.Kernel:
    """A kernel object of ``program`` for ``owner`` alone (whose arguments no one else sets),
    reused from an owner that is gone: pyopencl makes each kernel object's argument-setting code
    when it makes the object, about 0.15 ms, and a solve owns some 40 of them. The object goes
    back to the free list when ``owner`` is collected."""
    free = _free_kernels.setdefault((program.int_ptr, name), [])
    try:
        kernel = free.pop()
    except IndexError:
        kernel = cl.Kernel(program, name)
    back = weakref.finalize(owner, free.append, kernel)
    owner.__dict__.setdefault("_owned_kernels", []).append(back)
    return kernel


def release_kernels(*owners):
    """Give ``owners``' kernel objects (:func:`owned_kernel`) back now, rather than when they are
    collected (an owner in a reference cycle waits for the garbage collector). An owner must not
    launch them afterwards."""
    for owner in owners:
        for back in owner.__dict__.pop("_owned_kernels", ()):
            back()          # once: a finalizer called by hand is dead for the collector


def presets(program: cl.Program, owner) -> dict:
    """Every kernel of ``program`` as a :class:`Preset` of ``owner``'s own, by name."""
    names = program.get_info(cl.program_info.KERNEL_NAMES).split(";")
    return {name: Preset(owned_kernel(program, name, owner)) for name in names if name}


class ZeroStep:
    """Zero one output or temporary: a fill kernel (integers of the element's size, so no
    device needs cl_khr_fp16 for half), or on the simulator a write from the host (see
    simulator.zeros_from_host)."""

    __slots__ = ("source", "position", "kernel", "size", "host")

    def __init__(self, rt: Runtime, source: int, position: int, buffer: "Buffer"):
        self.source, self.position, self.size = source, position, buffer.size
        self.kernel = self.host = None
        if simulator.zeros_from_host(rt):
            self.host = np.zeros(buffer.nbytes, np.uint8)
        else:
            self.kernel = kernel_for_plan(arrays.zero_fill_program(rt, buffer.dtype.itemsize), "zero_fill")

    @property
    def work_items(self) -> int:
        return self.size

    def launch(self, queue, sources, wait_for) -> cl.Event:
        buf = sources[self.source][self.position]
        if self.host is not None:
            return cl.enqueue_copy(queue, buf, self.host, is_blocking=True, wait_for=wait_for)
        self.kernel.set_arg(0, buf)
        return cl.enqueue_nd_range_kernel(queue, self.kernel, (self.size,), None, wait_for=wait_for)


class Slot(NamedTuple):
    """A kernel argument filled per call: an input, output or temporary by position."""
    source: int
    position: int


def In(position: int) -> Slot:
    return Slot(INPUT, position)


def Out(position: int) -> Slot:
    return Slot(OUTPUT, position)


def Tmp(position: int) -> Slot:
    return Slot(TEMP, position)


def step(kernel: cl.Kernel, global_size, local_size, args: Sequence) -> Step:
    """A :class:`Step` from the kernel's argument list in order: :class:`Slot` entries
    (``In(0)``, ``Out(1)``, ``Tmp(0)``) are set per call, everything else once."""
    slots, fixed = [], []
    for index, a in enumerate(args):
        if isinstance(a, Slot):
            slots.append((index, a.source, a.position))
        else:
            fixed.append((index, a))
    return Step(kernel, global_size, local_size, slots, fixed)


def scratch_steps(rt: Runtime, buffers: Sequence[Tuple[Slot, "Buffer"]]) -> list:
    """Steps that prepare buffers the kernels write before reading: none on devices, a
    host-written zero fill on the simulator (see simulator.zeros_from_host)."""
    if not simulator.zeros_from_host(rt):
        return []
    return [ZeroStep(rt, slot.source, slot.position, buf) for slot, buf in buffers if buf.nbytes]


def kernel_for_plan(program: cl.Program, name: str) -> cl.Kernel:
    """A kernel object of the plan's own (not the shared one of templates.kernel): each plan
    sets its fixed arguments once and only the buffers per call."""
    return cl.Kernel(program, name)


HELD_TEMP_BYTES = 16 << 20   # temporaries up to this size stay with their plan (LaunchPlan.temp_buffers)


class LaunchPlan:
    """What a call with one signature needs: outputs, temporaries, kernel launches, and
    constant buffers the launches read (kept alive with the plan)."""

    def __init__(self, outputs: Sequence[Buffer], steps: Sequence[Step] = (),
                 temps: Sequence[Buffer] = (), keep=()):
        # A launch over no work-items is an error on some drivers (a crash on PoCL): dropped.
        self.steps = tuple(s for s in steps if s.work_items)
        self.outputs, self.temps, self.keep = tuple(outputs), tuple(temps), keep
        self.lock = threading.Lock()   # set_arg then enqueue must not interleave across threads
        self._held = None

    def temp_buffers(self, rt: Runtime) -> list:
        """Buffers for the temporaries of one call. Small ones (up to HELD_TEMP_BYTES) belong to
        the plan, made once: the plan serves one in-order queue, so a call's launches are done
        with them before the next call's start, and a repeat call allocates nothing. Larger
        ones come from the queue's pool per call, so that idle plans hold no large memory."""
        if self._held is None:
            self._held = [cl.Buffer(rt.context, cl.mem_flags.READ_WRITE, t.nbytes)
                          if 0 < t.nbytes <= HELD_TEMP_BYTES else None for t in self.temps]
        pool = rt.pool
        return [h if h is not None else pool.allocate(t.nbytes) if t.nbytes else None
                for h, t in zip(self._held, self.temps)]

    def enqueue(self, queue: cl.CommandQueue, inputs, outputs, temps, wait_for) -> List[cl.Event]:
        """Launch every step with these buffers; returns the events."""
        events = []
        sources = (inputs, outputs, temps)
        with self.lock:
            for step in self.steps:
                # The queue is in order: only the first launch waits for the inputs' events.
                events.append(step.launch(queue, sources, wait_for if not events else None))
        return events


def runtime_for(arrays, device=None, queue=None) -> Runtime:
    """The runtime of a call: ``queue=``, else ``device=``, else the first device array's
    queue (or context), else the selected device."""
    if queue is not None:
        if not isinstance(queue, cl.CommandQueue):
            raise TypeError(f"queue must be a pyopencl.CommandQueue, not {type(queue).__name__}")
        return runtime_for_queue(queue)
    if device is not None:
        return get_runtime(device)
    for a in arrays:
        if type(a) is cla.Array or isinstance(a, cla.Array):
            if a.queue is not None:
                return runtime_for_queue(a.queue)
            return runtime_for_context(a.context)
    return get_runtime(None)


def device_array(rt: Runtime, a, name: str):
    """The buffer of a device argument, after the checks every call needs (context, layout)."""
    arrays.check_context(rt, a, name)
    if a.offset:
        raise ValueError(f"{name} is a view with an offset into its buffer; pass {name}.copy()")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous on the device; pass {name}.copy()")
    return a.base_data


def pooled_array(rt: Runtime, shape, dtype, scratch: bool = False) -> cla.Array:
    """A device array from the queue's pool. ``scratch``: later kernels write it in place and
    read it back, so on the simulator it is zeroed from the host (simulator.zeros_from_host)."""
    spec = Buffer("array", shape, dtype)
    a = wrap(rt, spec, rt.pool.allocate(spec.nbytes) if spec.nbytes else None)
    if scratch and spec.nbytes and simulator.zeros_from_host(rt):
        cl.enqueue_copy(rt.queue, a.base_data, np.zeros(spec.nbytes, np.uint8), is_blocking=True)
    return a


def output_buffer(rt: Runtime, nbytes: int):
    """A buffer for an op's output: from the runtime's output pool while one is set (memory
    shared with CUDA, clkernels.interop), else from its queue's pool."""
    return (rt.pool if rt.output_pool is None else rt.output_pool).allocate(nbytes)


def wrap(rt: Runtime, spec: Buffer, data) -> cla.Array:
    # pyopencl's fast constructor path: the shape, strides and size are known to be valid, and
    # the checked path costs about 45 microseconds (numpy reductions over the shape).
    return cla.Array(None, spec.shape, spec.dtype, allocator=rt.pool, strides=spec.strides,
                     data=data, offset=0, _fast=True, _context=rt.context, _queue=rt.queue,
                     _size=spec.size)


def check_host_out(out, shape, dtype, name: str = "out"):
    """A caller's numpy output: exactly the shape and dtype, writeable and C-contiguous."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, as the inputs are")
    if tuple(out.shape) != tuple(shape) or out.dtype != np.dtype(dtype):
        raise ValueError(f"{name} has shape {tuple(out.shape)} and dtype {out.dtype}, expected "
                         f"{tuple(shape)} and {np.dtype(dtype)}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"{name} must be a writeable C-contiguous numpy array")


def _check_out(rt: Runtime, out, spec: Buffer, name: str, on_device: bool):
    where = "a pyopencl.array.Array, as the inputs are" if on_device else \
        "a numpy array, as the inputs are"
    if on_device != (type(out) is cla.Array or isinstance(out, cla.Array)):
        raise TypeError(f"{name} must be {where}")
    if tuple(out.shape) != spec.shape or out.dtype != spec.dtype:
        raise ValueError(f"{name} has shape {tuple(out.shape)} and dtype {out.dtype}, expected "
                         f"{spec.shape} and {spec.dtype}")
    if on_device:
        device_array(rt, out, name)
    else:
        check_host_out(out, spec.shape, spec.dtype, name)


class LaunchOp:
    """An op: array parameters, and ``make_plan(rt, arrays, options, config) -> LaunchPlan``.

    ``make_plan`` runs on a call signature's first call. It may look only at the arrays'
    shapes and dtypes (the plan serves every call with the same ones), at ``options`` (a
    hashable value: the op's geometry, host tables' contents) and at ``config`` (a hashable
    kernel configuration or None). The dtype and ndim checks of :class:`Param` run before it.
    """

    def __init__(self, name: str, params: Sequence[Param], make_plan: Callable[..., LaunchPlan],
                 output_names: Sequence[str] = ("out",)):
        self.name, self.params, self.make_plan = name, tuple(params), make_plan
        self.output_names = tuple(output_names)

    def __repr__(self):
        return f"<LaunchOp {self.name}>"

    def plan(self, rt: Runtime, args, options=(), config=None) -> LaunchPlan:
        """The cached plan of this call signature on ``rt`` (made on a miss)."""
        key = (self, tuple((a.shape, a.dtype) for a in args), options, config)
        plan = rt.plans.get(key)
        if plan is None:
            dtype_of = {p.name: a.dtype for a, p in zip(args, self.params)}
            for a, p in zip(args, self.params):
                p.check(a, dtype_of)
            plan = self.make_plan(rt, args, options, config)
            _check_plan_memory(rt, plan, args, self.name)
            rt.plans[key] = plan
        return plan

    def __call__(self, args: Sequence, options=(), config=None, *, out=None, device=None,
                 queue=None, like_device: Optional[bool] = None) -> Tuple:
        """Run on ``args`` (one per Param); returns the outputs as a tuple, numpy or device
        arrays like the inputs (``like_device`` overrides). ``out``: one array, or a tuple of
        one per output (None entries allocated), in the form the results take."""
        return self.run(args, options, config, out=out, device=device, queue=queue,
                        like_device=like_device)[0]

    def run(self, args: Sequence, options=(), config=None, *, out=None, device=None,
            queue=None, like_device: Optional[bool] = None):
        """:meth:`__call__`, returning ``(outputs, events)``: the events of every launch."""
        args = [a if type(a) in _ARRAY_TYPES else _as_array(a, p.name)
                for a, p in zip(args, self.params)]
        rt = runtime_for(args, device, queue)
        plan = self.plan(rt, args, options, config)
        q = rt.queue
        ins, wait, uploads, any_device = [], [], [], False
        for a, p in zip(args, self.params):
            if type(a) is np.ndarray:
                ins.append(_upload(rt, a, uploads))
            else:
                any_device = True
                ins.append(device_array(rt, a, p.name))
                if a.events:
                    wait.extend(a.events)
        on_device = any_device if like_device is None else like_device
        outs = self._outputs(rt, plan, out, on_device)
        temps = plan.temp_buffers(rt) if plan.temps else ()
        events = plan.enqueue(q, ins, [o.base_data for o in outs], temps, wait)
        if on_device:
            if events:
                # The first and the last launch: a wait on an output covers the whole call (the
                # queue is in order), and the two events span its device time.
                ends = (events[0], events[-1]) if len(events) > 1 else events
                for o in outs:
                    for e in ends:
                        o.add_event(e)
            return tuple(outs), events
        results = self._download(rt, plan, outs, out, events)
        del uploads                 # (done: the blocking download came after them in the queue)
        return results, events

    # -- pieces of a call --------------------------------------------------------------------
    def _outputs(self, rt: Runtime, plan: LaunchPlan, out, on_device: bool) -> list:
        """Device arrays for the outputs: the caller's (``out=``, checked) or pooled ones. For
        numpy results the device array is pooled and ``out`` is filled afterwards."""
        if out is None:   # the common case, without the checks of a caller's arrays
            return [wrap(rt, spec, output_buffer(rt, spec.nbytes) if spec.nbytes else None)
                    for spec in plan.outputs]
        given = _out_tuple(out, len(plan.outputs), self.output_names)
        arrays = []
        for spec, o, name in zip(plan.outputs, given, self.output_names):
            if o is not None:
                _check_out(rt, o, spec, name if len(plan.outputs) > 1 else "out", on_device)
                if on_device:
                    arrays.append(o)
                    continue
            arrays.append(wrap(rt, spec, output_buffer(rt, spec.nbytes) if spec.nbytes else None))
        return arrays

    def _download(self, rt: Runtime, plan: LaunchPlan, outs, out, events):
        given = _out_tuple(out, len(plan.outputs), self.output_names)
        results = []
        for i, (spec, dev, o) in enumerate(zip(plan.outputs, outs, given)):
            host = o if o is not None else np.empty(spec.shape, spec.dtype)
            if spec.nbytes:
                cl.enqueue_copy(rt.queue, host, dev.base_data, is_blocking=i == len(plan.outputs) - 1)
            results.append(host)
        if results and plan.outputs[-1].nbytes == 0:
            rt.queue.finish()   # the last copy did not block
        return tuple(results)


_ARRAY_TYPES = (np.ndarray, cla.Array)


def _check_plan_memory(rt: Runtime, plan: LaunchPlan, args, name: str) -> None:
    """Once per plan (never on a repeat call): its outputs, temporaries and the uploads of host
    inputs must fit on the device, and on a CPU device in the host (clkernels.memory), or the
    driver would abort the process when the call allocates them."""
    buffers = [b.nbytes for b in plan.outputs + plan.temps]
    buffers += [a.nbytes for a in args if type(a) is np.ndarray]
    memory.check(rt.info, sum(buffers), f"{name}'s outputs, temporaries and uploaded inputs",
                 largest=max(buffers, default=0))


def _as_array(a, name: str):
    if isinstance(a, (np.ndarray, cla.Array)):
        return a
    try:
        return np.asarray(a)
    except Exception:   # anything numpy cannot take: re-raised as the argument's error
        raise TypeError(f"{name} must be a numpy array or pyopencl.array.Array, "
                        f"not {type(a).__name__}") from None


def _upload(rt: Runtime, a: np.ndarray, pending: list):
    """A pooled device copy of a host input (C-contiguous first: a copy the transfer needs).
    The transfer does not block; its event goes to ``pending``, which the caller keeps until
    the results' blocking download (pyopencl's event keeps ``a`` alive, and waits for the
    transfer when it is released)."""
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    if not a.nbytes:
        return None
    buf = rt.pool.allocate(a.nbytes)
    pending.append(cl.enqueue_copy(rt.queue, buf, a, is_blocking=False))
    return buf


def _out_tuple(out, n: int, names) -> tuple:
    if out is None:
        return (None,) * n
    if n == 1 and not isinstance(out, (tuple, list)):
        return (out,)
    if not isinstance(out, (tuple, list)) or len(out) != n:
        raise TypeError(f"out must be a tuple of {n} arrays (or None entries): "
                        f"({', '.join(names)})")
    return tuple(out)


def convert_step(rt: Runtime, source: Tuple[int, int], target: Tuple[int, int], buffer: Buffer) -> Step:
    """A step storing a float32 buffer (``source``) in ``buffer``'s 16-bit storage (``target``):
    half through vstore_half_rte, so that no device needs cl_khr_fp16, or bfloat16 (the
    Storage's rounding to nearest even)."""
    st = Storage(buffer.dtype)
    text = (f"{st.helpers()}__kernel void to_storage(__global const float *src, __global {st.ptr} *dst, int n) "
            f"{{ const int i = get_global_id(0); if (i < n) {st.store('src[i]', 'dst', 'i')}; }}")
    kernel = kernel_for_plan(build(text, rt), "to_storage")
    wg = arrays.work_group_size(rt, kernel, 256)
    return Step(kernel, (arrays.round_up(buffer.size, wg),), (wg,),
                [(0, *source), (1, *target)], [(2, np.int32(buffer.size))])


def accumulator(rt: Runtime, dtype, spec: Buffer, out_index: int, temps: list, steps: list):
    """A zero-filled float32 accumulator for output ``out_index`` (whose storage is ``dtype``):
    the output itself for float32, else a float32 temporary (appended to ``temps``) that the
    returned step stores as ``dtype`` (half or bfloat16); the caller appends that step after its kernels. The zero fill
    goes to ``steps`` now. Returns (the accumulator's slot, the conversion step or None)."""
    if np.dtype(dtype) == np.float32:
        steps.append(ZeroStep(rt, OUTPUT, out_index, spec))
        return Out(out_index), None
    temps.append(Buffer(spec.name + "_float32", spec.shape, np.float32))
    steps.append(ZeroStep(rt, TEMP, len(temps) - 1, temps[-1]))
    return Tmp(len(temps) - 1), convert_step(rt, (TEMP, len(temps) - 1), (OUTPUT, out_index), spec)


def program(rt: Runtime, template: str, options=(), **params) -> cl.Program:
    """Render and build a template for a plan (both cached; get_program adds the simulator's options)."""
    return get_program(template, rt, tuple(options), **params)
