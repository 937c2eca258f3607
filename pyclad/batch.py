"""``BatchFunction``: a traced function evaluated with its Jacobians for millions of
tuples at once.

    f = BatchFunction(reprojection, params=(9, 3), data=2)
    r = f.values([cameras, points], index, data=observed)                       # (N, m)
    r, (J_cam, J_pt) = f.values_and_jacobians([cameras, points], index, data=observed)

``params``: one array ``(n_g, d_g)`` per parameter group; ``index``: ``(N, G)`` (or one
1-D array per group) giving the row of each group tuple k uses; ``data``: ``(N, d)``
per-tuple input that is not differentiated. Numpy in, numpy out (evaluated in chunks that
fit the device); ``pyopencl.array.Array`` in, device arrays out with no copy.
"""
from __future__ import annotations

import threading
import warnings
from typing import List, Optional, Sequence, Tuple

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from clkernels import arrays, get_runtime, launch, simulator, templates
from clkernels import multi_device as md
from clkernels.runtime import Runtime

from . import backends
from .trace import trace

MIN_TIMED_TUPLES = 1024
BACKENDS = tuple(backends.BACKENDS)   # ("auto", "codegen", "tape", "numpy")
"""The names ``BatchFunction(..., backend=...)`` takes: ``"auto"``, ``"codegen"``, ``"tape"``, ``"numpy"``."""

# Past this many nodes a straight-line kernel takes the OpenCL compiler too long (and
# spills registers on GPUs); the tape interpreter needs no compilation per graph.
CODEGEN_NODE_LIMIT = 20000



def _cuda_device(arrays):
    """The CUDA device of the first torch CUDA tensor among ``arrays`` (torch is not imported)."""
    for a in arrays:
        if type(a).__module__.split(".")[0] == "torch":
            device = getattr(a, "device", None)
            if device is not None and device.type == "cuda":
                return device
    return None

class BatchFunction:
    """A Python function traced once into a graph and compiled for batched evaluation.

    Args:
        fn: ``fn(group_0, ..., group_{G-1}[, data]) -> scalar | Vector | list``, written with
            pyclad operations (see :mod:`pyclad`). Called once, at construction.
        params: the size of each parameter group (the differentiated inputs), a tuple of ints
            (or one int for one group).
        data: the size of the per-tuple, non-differentiated input (0 for none).
        dtype: float64 (default) or float32, for inputs, computation and outputs.
        backend: ``"auto"`` (default: codegen, unless its kernel would take too long to build on
            the device, then the tape; see pyclad.backends.AUTO_BUILD_LIMIT_S), ``"codegen"``
            (straight-line kernel), ``"tape"`` (generic interpreter kernel) or ``"numpy"`` (host
            reference, no device).
        device: a device spec, ``pyopencl.Device`` or ``clkernels.Runtime``; default per
            ``clkernels`` selection rules, resolved at each call.
        chunk_size: tuples per launch for host inputs; default from the device's memory.
        config: a :class:`pyclad.TapeConfig`, the tape kernel's variant (tuples per work-item,
            slots, scratch layout); default per device. For ``backend="tape"`` (or ``"auto"``
            where it picks the tape).

    Raises:
        TypeError: a dtype other than float32 or float64, or Python control flow on a traced
            value inside ``fn`` (use :func:`pyclad.where`).
        ValueError: an unknown backend, group sizes below 1, a ``config`` for a backend other
            than the tape, or a function with no outputs.

    Example::

        f = pc.BatchFunction(reprojection, params=(9, 3), data=2)
        r, (J_cam, J_pt) = f.values_and_jacobians([cameras, points], index, data=observed)
    """

    def __init__(self, fn, params: Sequence[int], data: int = 0, dtype=np.float64,
                 backend: str = "auto", device=None, chunk_size: Optional[int] = None,
                 config=None):
        if isinstance(params, (int, np.integer)):
            params = (int(params),)
        self.traced = trace(fn, params, data)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise TypeError(f"dtype must be float32 or float64, not {self.dtype}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
        if backend in ("codegen", "auto") and len(self.traced.order) > CODEGEN_NODE_LIMIT:
            warnings.warn(f"graph has {len(self.traced.order)} nodes (> {CODEGEN_NODE_LIMIT}): "
                          "using the tape backend, which needs no per-graph compilation",
                          stacklevel=2)
            backend = "tape"
        self.backend, self.device, self.chunk_size = backend, device, chunk_size
        if config is not None and backend not in ("tape", "auto"):
            raise ValueError(f"config is the tape kernel's variant; backend={backend!r} takes none")
        self._impl = backends.BACKENDS[backend](self.traced, self.dtype, config)   # pyclad.backends
        self.name = getattr(fn, "__name__", "function")
        self._sources = {}
        self._plans = {}          # (context, device, jacobians) -> _Plan: what a launch needs, found once
        self._device_op = None    # the launch-layer LaunchOp of device calls, made on first use
        # Per device, for devices= splits; a share under MIN_TIMED_TUPLES tuples is too short to time.
        self._throughputs = md.Throughputs(min_timed=MIN_TIMED_TUPLES)

    # -- public API --------------------------------------------------------------------
    @property
    def n_outputs(self) -> int:
        return self.traced.n_outputs

    @property
    def group_sizes(self) -> Tuple[int, ...]:
        return self.traced.group_sizes

    @property
    def source(self) -> str:
        """The OpenCL source of values and Jacobians on the default device."""
        return self.kernel_source()

    def kernel_source(self, jacobians: bool = True, device=None) -> str:
        """The OpenCL source this function runs (values and Jacobians by default) on a
        device: the codegen kernel is specialised per device (SIMD lanes on CPUs, stores
        staged through local memory on GPUs)."""
        if not self._impl.on_device:
            return self._impl.source(jacobians, None)     # says that it runs no source
        return self._source(jacobians, get_runtime(device if device is not None else self.device))

    def _source(self, jacobians, runtime) -> str:
        key = (jacobians, self._impl.variant(runtime, jacobians))
        if key not in self._sources:
            self._sources[key] = self._impl.source(*key)
        return self._sources[key]

    def program_request(self, runtime, jacobians: bool = True):
        """The program a device call (values and Jacobians, or values alone) builds on ``runtime``,
        as a :class:`clkernels.templates.Request` for :func:`clkernels.templates.prefetch`; None
        where the backend runs no source or its source has no parameters to be cached by."""
        if not self._impl.on_device:
            return None
        params = self._impl.source_params(jacobians, self._impl.variant(runtime, jacobians))
        if params is None:
            return None
        return templates.Request(f"pyclad/{self._impl.name}", params,
                                 lambda: self._source(jacobians, runtime))

    def values(self, params, index, data=None, device=None, index_checked=False, devices=None):
        """The function's outputs for every tuple.

        Args:
            params: one array per parameter group, ``(n_g, d_g)`` (numpy, ``pyopencl.array.Array``
                or CUDA tensors).
            index: ``(N, G)`` integer rows (or one 1-D array per group): the row of each group
                that tuple k uses.
            data: ``(N, data)`` per-tuple input, when the function takes data.
            device: where to run host arrays (default: the function's, else the selected device).
            index_checked: skip the range check of a device ``index`` (a reduction and a wait)
                for a caller that checked this very array once and calls again with it; params
                with fewer rows than then would corrupt memory.
            devices: a list of devices (specs, ``pyopencl.Device`` or ``Runtime``) or ``"all"``:
                host arrays' tuples are split across them in proportion to their measured speed.

        Returns:
            ``(N, m)`` outputs, in the inputs' form: numpy for numpy, device arrays for device
            arrays (no copy), CUDA tensors for CUDA tensors.

        Raises:
            IndexError: an index out of range, naming the group and the first offending tuple
                (before any launch).
            ValueError: wrong shapes, or ``device`` with ``devices``.
            TypeError: wrong dtypes.
        """
        return self._dispatch(params, index, data, False, device, index_checked, devices)[0]

    def values_and_jacobians(self, params, index, data=None, device=None, index_checked=False,
                             devices=None):
        """The outputs and their Jacobians for every tuple.

        The arguments, the forms and the errors are those of :meth:`values`.

        Returns:
            ``(outputs, jacobians)``: outputs ``(N, m)`` and a tuple with one Jacobian
            ``(N, m, d_g)`` per parameter group.
        """
        out, jacs = self._dispatch(params, index, data, True, device, index_checked, devices)
        return out, tuple(jacs)

    def _dispatch(self, params, index, data, jacobians, device, index_checked, devices):
        cuda = _cuda_device([*(params if isinstance(params, (list, tuple)) else [params]), index, data])
        if cuda is not None:
            if device is not None or devices is not None:
                raise ValueError("CUDA tensors run on the OpenCL device of their own GPU: leave device= "
                                 "and devices= out")
            return self._run_cuda(cuda, params, index, data, jacobians, index_checked)
        if devices is None:
            return self._run(params, index, data, jacobians, device, index_checked)
        if device is not None:
            raise ValueError("pass device= (one device) or devices= (several), not both")
        if not self._impl.on_device:
            raise ValueError(f"devices= splits the work across OpenCL devices; backend "
                             f"{self.backend!r} runs on the host")
        return self._run_split(params, index, data, jacobians, devices)

    def _run_cuda(self, cuda, params, index, data, jacobians, index_checked):
        """CUDA tensors in, CUDA tensors out, through memory that the GPU's OpenCL device shares
        with CUDA (:mod:`clkernels.interop.torch_cuda`; the index stays on the device)."""
        if not self._impl.on_device:
            raise ValueError(f"backend {self.backend!r} runs on the host; CUDA tensors need a device backend")
        from clkernels.interop.torch_cuda import bridge_for
        bridge = bridge_for(cuda)
        params = list(params) if isinstance(params, (list, tuple)) else [params]
        G = len(params)
        tensors = [*params, index] + ([data] if data is not None else [])

        def call(*arrays):      # on the bridge's runtime (its outputs in the shared pool), not self.device
            out, jacs = self._run_op(list(arrays[:G]), arrays[G], arrays[G + 1] if data is not None else None,
                                     jacobians, bridge.rt, index_checked)
            return (out, *jacs)
        results = bridge.run(call, tensors, n_outputs=1 + (G if jacobians else 0), host_ints=False)
        return results[0], list(results[1:])

    def _run_split(self, params, index, data, jacobians, devices):
        """:meth:`_run`'s result for host arrays, the tuples split across ``devices``
        (:mod:`clkernels.multi_device`: contiguous ranges in proportion to each device's measured
        rate, the devices at once). Every device gets the parameter tables whole (a tuple may use
        any row) and its range of the index and data; every tuple is the one-device kernel's
        arithmetic, so on devices that compile alike the result equals one device's bit for bit."""
        md.refuse_device_arrays([*(params if isinstance(params, (list, tuple)) else [params]), index, data])
        params, index, data = self._check(params, index, data)
        self._validate_range(None, params, index)          # once, for every range

        def work(rt, a, b):
            return self._run(params, index[a:b], data[a:b] if data is not None else None, jacobians, rt,
                             index_checked=True)

        parts = md.split(index.shape[0], devices, self._throughputs, work)
        if len(parts) == 1:
            return parts[0]
        out = np.concatenate([p[0] for p in parts])
        return out, [np.concatenate([p[1][g] for p in parts]) for g in range(len(parts[0][1]))]

    def backend_for(self, device=None) -> str:
        """The backend that evaluates on a device: ``backend`` itself, or what ``"auto"``
        chooses there."""
        if self.backend != "auto":
            return self.backend
        return self._impl.choose(get_runtime(device if device is not None else self.device)).name

    def __repr__(self):
        return f"<BatchFunction {self.name}: {self.traced.summary()}; {self.backend}, {self.dtype}>"

    # -- argument checking ------------------------------------------------------------------
    def _check(self, params, index, data):
        t = self.traced
        if not isinstance(params, (list, tuple)):
            params = [params] if len(t.group_sizes) == 1 else params
        if not isinstance(params, (list, tuple)) or len(params) != len(t.group_sizes):
            raise ValueError(f"params must be a list of {len(t.group_sizes)} arrays "
                             f"(one per group, sizes {t.group_sizes})")
        params = [arrays.check_array(p, f"params[{g}]", [self.dtype], shape=(None, d))
                  for g, (p, d) in enumerate(zip(params, t.group_sizes))]
        index = self._check_index(index)
        n = index.shape[0]
        if t.data_size:
            if data is None:
                raise ValueError(f"data is required: an (N, {t.data_size}) array")
            data = arrays.check_array(data, "data", [self.dtype], shape=(n, t.data_size))
        elif data is not None:
            raise ValueError("data given, but the function was traced with data=0")
        for g, p in enumerate(params):
            if p.shape[0] == 0 and n:
                raise IndexError(f"params[{g}] has no rows, but {n} tuples index it")
        return params, index, data

    def _check_index(self, index):
        G = len(self.traced.group_sizes)
        # A list of G 1-D arrays is one index array per group; any other list is an array.
        if isinstance(index, (list, tuple)) and len(index) == G and \
                all(np.ndim(i) == 1 or arrays.is_device_array(i) for i in index):
            if any(arrays.is_device_array(i) for i in index):
                raise TypeError("device index arrays must be one (N, G) int32 array")
            cols = [np.asarray(i) for i in index]
            if any(c.ndim != 1 or c.shape != cols[0].shape for c in cols):
                raise ValueError("index arrays must be 1-D and all of the same length")
            index = np.stack(cols, axis=1) if cols[0].size else np.zeros((0, G), np.int64)
        if arrays.is_device_array(index):
            return arrays.check_array(index, "index", [np.int32], shape=(None, G))
        index = np.asarray(index)
        if index.ndim == 1 and G == 1:
            index = index[:, None]
        if index.dtype.kind not in "iu":
            raise TypeError(f"index must hold integers, not {index.dtype}")
        return arrays.check_array(index, "index", [index.dtype], shape=(None, G))

    def _validate_range(self, runtime, params, index):
        """Every index in range, checked before any launch (an out-of-range index in a
        kernel is a memory corruption, not an exception)."""
        rows = np.array([p.shape[0] for p in params], np.int64)
        if arrays.is_device_array(index):
            if index.shape[0] == 0:
                return
            bad = _count_bad(runtime, index, rows)
            if bad == 0:
                return
            index = index.get()
        bad = (index < 0) | (index >= rows)
        if bad.any():
            t, g = np.argwhere(bad)[0]
            raise IndexError(f"index of group {g} out of range: tuple {t} uses row {index[t, g]}, "
                             f"but params[{g}] has {rows[g]} rows ({int(bad[:, g].sum())} tuples "
                             f"out of range in that group)")

    # -- evaluation ---------------------------------------------------------------------------
    def _run(self, params, index, data, jacobians, device, index_checked=False):
        if self._impl.launch_layer and _all_device(params, index, data):
            return self._run_op(params, index, data, jacobians, device, index_checked)
        params, index, data = self._check(params, index, data)
        device_args = any(arrays.is_device_array(a) for a in [*params, index, data] if a is not None)
        if not self._impl.on_device:
            host = [a.get() if arrays.is_device_array(a) else a for a in [*params, index, data] if a is not None]
            self._validate_range(None, host[:len(params)], host[len(params)])
            return self._impl.run(host[:len(params)], host[len(params)],
                                  host[-1] if data is not None else None, jacobians)
        # Where the device arrays live (a caller's own context and queue work), unless a device
        # is named here or at construction.
        runtime = launch.runtime_for([*params, index, data], device if device is not None else self.device)
        if (runtime.context.int_ptr, runtime.device.int_ptr, jacobians) not in self._plans:
            templates.storage(self.dtype, runtime)  # refuses float64 on a device without fp64
        if not (index_checked and arrays.is_device_array(index)):
            self._validate_range(runtime, params, index)
        plan = self._plan(runtime, jacobians)
        if device_args:
            return self._run_device(runtime, plan, params, index, data, jacobians)
        return self._run_host(runtime, plan, params, index, data, jacobians)

    # -- device arrays in, device arrays out: through the launch layer -------------------------
    def _run_op(self, params, index, data, jacobians, device, index_checked):
        """The kernel on device arrays as a :class:`clkernels.launch.LaunchOp`: a repeat call
        with the same shapes checks the arrays' kinds, takes its outputs from the pool and
        enqueues (the shape checks and the plan are made once per signature)."""
        op = self._op()
        args = [*params, index] + ([data] if self.traced.data_size else [])
        if data is not None and not self.traced.data_size:
            raise ValueError("data given, but the function was traced with data=0")
        runtime = launch.runtime_for(args, device if device is not None else self.device)
        op.plan(runtime, args, jacobians)                 # shapes checked before the range
        if not index_checked:
            self._validate_range(runtime, params, index)
        outs, _ = op.run(args, jacobians, queue=runtime.queue)
        return outs[0], list(outs[1:])

    def _op(self) -> launch.LaunchOp:
        if self._device_op is None:
            G = len(self.traced.group_sizes)
            params = [launch.Param(f"params[{g}]", [self.dtype], 2) for g in range(G)]
            params.append(launch.Param("index", [np.int32], 2))
            if self.traced.data_size:
                params.append(launch.Param("data", [self.dtype], 2))
            self._device_op = launch.LaunchOp(f"BatchFunction {self.name}", params, self._op_plan,
                                        output_names=("values", *(f"jacobians[{g}]" for g in range(G))))
        return self._device_op

    def _op_plan(self, runtime, args, jacobians, config) -> launch.LaunchPlan:
        t = self.traced
        G = len(t.group_sizes)
        params, index = args[:G], args[G]
        if len(params) != G:
            raise ValueError(f"params must be a list of {G} arrays (one per group, sizes {t.group_sizes})")
        for g, (p, d) in enumerate(zip(params, t.group_sizes)):
            if p.shape[1] != d:
                raise ValueError(f"params[{g}] has shape {tuple(p.shape)}, expected (*, {d})")
        if index.shape[1] != G:
            raise ValueError(f"index has shape {tuple(index.shape)}, expected (*, {G})")
        n = int(index.shape[0])
        if t.data_size and tuple(args[G + 1].shape) != (n, t.data_size):
            raise ValueError(f"data has shape {tuple(args[G + 1].shape)}, expected ({n}, {t.data_size})")
        for g, p in enumerate(params):
            if p.shape[0] == 0 and n:
                raise IndexError(f"params[{g}] has no rows, but {n} tuples index it")
        templates.storage(self.dtype, runtime)  # refuses float64 on a device without fp64
        out_shape, jac_shapes = self._output_shapes(n)
        outputs = [launch.Buffer("values", out_shape, self.dtype)]
        if jacobians:
            outputs += [launch.Buffer(f"jacobians[{g}]", s, self.dtype) for g, s in enumerate(jac_shapes)]
        if n == 0:
            return launch.LaunchPlan(outputs)
        shared = self._plan(runtime, jacobians)             # the program and its geometry
        kernel = launch.kernel_for_plan(shared.kernel.program, self._impl.kernel_name_for(runtime))
        ins = [launch.In(i) for i in range(len(args))]
        outs = [launch.Out(i) for i in range(len(outputs))]
        # On the simulator, outputs are zeroed from the host first (solvers write them in place).
        steps = launch.scratch_steps(runtime, list(zip(outs, outputs)))
        steps.append(self._impl.launch_step(runtime, kernel, shared, [*ins, *outs], n))
        return launch.LaunchPlan(outputs, steps)

    def _plan(self, runtime, jacobians) -> "_Plan":
        """The kernel and launch geometry for a device, worked out on the first call only (the
        source, its hash for the build cache and the work-group queries are not per-call work)."""
        key = (runtime.context.int_ptr, runtime.device.int_ptr, jacobians)
        plan = self._plans.get(key)
        if plan is None:
            request = self.program_request(runtime, jacobians)
            program = (templates.build(self._source(jacobians, runtime), runtime) if request is None else
                       templates.program_for(request.name, request.params, request.make_source, runtime))
            kernel = launch.kernel_for_plan(program, self._impl.kernel_name_for(runtime))
            wg = self._impl.work_group(runtime, kernel, jacobians)
            plan = self._plans[key] = _Plan(kernel, wg, self._impl.lanes(runtime))
        return plan

    def _output_shapes(self, n):
        m = self.n_outputs
        return (n, m), [(n, m, d) for d in self.traced.group_sizes]

    def _per_tuple_bytes(self, jacobians):
        t, item = self.traced, self.dtype.itemsize
        b = 4 * len(t.group_sizes) + item * (t.data_size + t.n_outputs)
        if jacobians:
            b += item * t.n_outputs * sum(t.group_sizes)
        return b

    def _chunk(self, runtime: Runtime, n, jacobians) -> int:
        if self.chunk_size:
            return int(self.chunk_size)
        info = runtime.info
        budget = min(info.max_alloc_bytes, info.global_mem_bytes // 4, 512 << 20)
        return max(256, min(n, budget // self._per_tuple_bytes(jacobians)))

    def _run_host(self, runtime, plan, params, index, data, jacobians):
        queue, n = runtime.queue, index.shape[0]
        out_shape, jac_shapes = self._output_shapes(n)
        out = np.empty(out_shape, self.dtype)
        jacs = [np.empty(s, self.dtype) for s in jac_shapes] if jacobians else []
        if n == 0:
            return out, jacs
        dev_params = [arrays.to_device(runtime, p, f"params[{g}]") for g, p in enumerate(params)]
        chunk = min(n, self._chunk(runtime, n, jacobians))
        # On a CPU device the kernel can read and write the numpy arrays in place (no copy
        # either way); see simulator.zero_copy_ok for the exception.
        in_place = simulator.zero_copy_ok(runtime)
        bufs = None if in_place else _ChunkBuffers(runtime, self, chunk, jacobians)
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            idx = np.ascontiguousarray(index[start:stop], dtype=np.int32)
            rows = np.ascontiguousarray(data[start:stop]) if data is not None else None
            outs = [out[start:stop]] + [j[start:stop] for j in jacs]
            if in_place:
                self._run_in_place(runtime, plan, dev_params, idx, rows, outs, jacobians)
                continue
            cl.enqueue_copy(queue, bufs.index.data, idx)
            if rows is not None:
                cl.enqueue_copy(queue, bufs.data.data, rows)
            self._launch(runtime, plan, dev_params, bufs.index, bufs.data, bufs.out, bufs.jacs,
                         stop - start, jacobians)
            for host, dev in zip(outs, [bufs.out, *bufs.jacs]):
                cl.enqueue_copy(queue, host, dev.data)
        queue.finish()
        return out, jacs

    def _run_in_place(self, runtime, plan, params, idx, rows, outs, jacobians):
        """One chunk on a CPU device with buffers over the host arrays (USE_HOST_PTR);
        mapping the outputs afterwards is what makes the results visible in them."""
        mf, ctx = cl.mem_flags, runtime.context
        wrap = lambda a, flags: _HostBuffer(cl.Buffer(ctx, flags | mf.USE_HOST_PTR, hostbuf=a))  # noqa: E731
        index = wrap(idx, mf.READ_ONLY)
        data = wrap(rows, mf.READ_ONLY) if rows is not None else None
        targets = [wrap(o, mf.WRITE_ONLY) for o in outs]
        self._launch(runtime, plan, params, index, data, targets[0], targets[1:], len(idx), jacobians)
        for host, target in zip(outs, targets):
            mapped, _ = cl.enqueue_map_buffer(runtime.queue, target.data, cl.map_flags.READ, 0,
                                              host.shape, host.dtype, is_blocking=True)
            mapped.base.release(runtime.queue)

    def _run_device(self, runtime, plan, params, index, data, jacobians):
        n = index.shape[0]
        dev = [arrays.to_device(runtime, a, name) for a, name in
               zip([*params, index], [f"params[{g}]" for g in range(len(params))] + ["index"])]
        dev_params, dev_index = dev[:-1], dev[-1]
        if dev_index.dtype != np.int32:
            raise TypeError("index must be int32 when it is a device array")
        dev_data = arrays.to_device(runtime, data, "data") if data is not None else None
        out_shape, jac_shapes = self._output_shapes(n)
        # From the queue's pool; scratch, as solvers write these in place (zeroed on the simulator)
        out = launch.pooled_array(runtime, out_shape, self.dtype, scratch=True)
        jacs = [launch.pooled_array(runtime, s, self.dtype, scratch=True) for s in jac_shapes] if jacobians else []
        if n:
            events = self._launch(runtime, plan, dev_params, dev_index, dev_data, out, jacs, n, jacobians)
            for a in (out, *jacs):  # later device work (and benchmarks) can wait on them
                for event in events:
                    a.add_event(event)
        return out, jacs

    def _launch(self, runtime, plan, params, index, data, out, jacs, n, jacobians):
        args: List = [p.data for p in params] + [index.data]
        if self.traced.data_size:
            args.append(data.data)
        args.append(out.data)
        args += [j.data for j in jacs]
        stride = min(n, self._chunk(runtime, n, jacobians))
        with plan.lock:   # the plan's kernel object: arguments set, then enqueued, per thread
            return self._impl.enqueue(runtime, plan, args, n, stride)


def _all_device(params, index, data) -> bool:
    """Whether a call's arrays are all pyopencl arrays (params a list of them)."""
    return (isinstance(params, (list, tuple)) and all(type(p) is cla.Array for p in params)
            and type(index) is cla.Array and (data is None or type(data) is cla.Array))


class _Plan:
    """A launch's kernel (its own object), work-group size and tuples per work-item on one
    device."""

    def __init__(self, kernel, wg, lanes):
        self.kernel, self.wg, self.lanes = kernel, wg, lanes
        self.lock = threading.Lock()


class _HostBuffer:
    """A buffer over host memory, shaped like a device array for ``_launch``."""

    def __init__(self, buffer):
        self.data = buffer


class _ChunkBuffers:
    def __init__(self, runtime, f: BatchFunction, chunk, jacobians):
        t = f.traced
        self.index = arrays.empty(runtime, (chunk, len(t.group_sizes)), np.int32)
        self.data = arrays.empty(runtime, (chunk, t.data_size), f.dtype) if t.data_size else None
        out_shape, jac_shapes = f._output_shapes(chunk)
        self.out = arrays.empty(runtime, out_shape, f.dtype)
        self.jacs = [arrays.empty(runtime, s, f.dtype) for s in jac_shapes] if jacobians else []


_bad_index_kernels = {}


def _count_bad(runtime, index: cla.Array, rows: np.ndarray) -> int:
    """How many entries of a device (N, G) index array are out of range (one reduction)."""
    from pyopencl.reduction import ReductionKernel
    G = index.shape[1]
    key = (runtime.context.int_ptr, G)
    if key not in _bad_index_kernels:
        _bad_index_kernels[key] = ReductionKernel(
            runtime.context, np.int64, neutral="0", reduce_expr="a+b",
            map_expr=f"(idx[i] < 0 || idx[i] >= rows[i % {G}]) ? 1 : 0",
            arguments="__global const int *idx, __global const long *rows")
    rows_dev = cla.to_device(runtime.queue, rows.astype(np.int64))
    return int(_bad_index_kernels[key](index, rows_dev, queue=runtime.queue).get())
