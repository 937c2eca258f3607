"""The ways a :class:`pyclad.BatchFunction` evaluates, as objects with one interface.

- :class:`Codegen`: a straight-line kernel generated per function (SIMD lanes on CPUs, Jacobian
  stores staged through local memory on GPUs); device calls go through the launch layer.
- :class:`Tape`: the generic interpreter kernel of Shen & Dai, which walks the node table and
  the forward and reverse sequences (no compilation per function); the tables and the
  per-tuple scratch (values and adjoints) are its own.
- :class:`Numpy`: the host reference (pyclad.interpreter), no device.
- :class:`Auto`: codegen or tape per device, by the estimated cost of codegen's build.

``BatchFunction`` asks its backend; no module reaches into another's state.
"""
from __future__ import annotations

import warnings
from typing import List, Optional

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from clkernels import arrays, launch

from . import codegen, interpreter, tape


class Backend:
    """One way of evaluating a traced function; made per BatchFunction."""
    name = ""
    kernel_name = ""
    on_device = True          # runs an OpenCL kernel
    launch_layer = False      # device calls go through clkernels.launch (one launch per call)

    def __init__(self, traced, dtype, config=None):
        self.traced, self.dtype = traced, np.dtype(dtype)
        self.real = "double" if self.dtype == np.float64 else "float"
        self.config = config

    def kernel_name_for(self, runtime) -> str:
        return self.kernel_name

    def variant(self, runtime, jacobians: bool):
        """What the kernel source depends on besides the function (hashable): the source is
        rendered and built once per variant."""
        raise NotImplementedError

    def source(self, jacobians: bool, variant) -> str:
        raise NotImplementedError

    def source_params(self, jacobians: bool, variant) -> Optional[dict]:
        """Plain values that determine :meth:`source`'s text (with the packages' code), for the
        binary cache (clkernels.templates.program_for); None: not indexed, made every process."""
        return None

    def lanes(self, runtime) -> int:
        """Tuples per work-item."""
        return 1

    def work_group(self, runtime, kernel, jacobians: bool) -> int:
        return arrays.work_group_size(runtime, kernel, 64)

    def enqueue(self, runtime, plan, args: List, n: int, stride: int) -> List[cl.Event]:
        """Launch the kernel over n tuples with its buffer arguments; ``stride``: tuples per
        launch (the chunk that fits the device)."""
        raise NotImplementedError

    def launch_step(self, runtime, kernel, plan, io: List, n: int):
        """The :class:`clkernels.launch.Step` of a launch-layer plan over n tuples (``io``: the
        inputs' and outputs' slots, in the kernel's order)."""
        raise NotImplementedError


class Codegen(Backend):
    name, kernel_name, launch_layer = "codegen", "pyclad_eval", True

    def variant(self, runtime, jacobians):
        lanes = self.lanes(runtime)
        stage = 0 if not jacobians or lanes > 1 else \
            codegen.stage_size(self.traced, self.dtype.itemsize, runtime.info)
        return stage, lanes

    def source(self, jacobians, variant):
        stage, lanes = variant
        return codegen.render(self.traced, self.real, jacobians, stage_wg=stage, lanes=lanes)

    def source_params(self, jacobians, variant):
        return {"traced": self.traced.fingerprint(), "real": self.real, "jacobians": bool(jacobians),
                "variant": tuple(variant)}

    def lanes(self, runtime):
        return codegen.lanes(runtime.info, self.real)

    def work_group(self, runtime, kernel, jacobians):
        stage, _ = self.variant(runtime, jacobians)
        return stage or super().work_group(runtime, kernel, jacobians)

    @staticmethod
    def _grid(plan, n) -> int:
        return arrays.round_up(-(-n // plan.lanes), plan.wg)

    def launch_step(self, runtime, kernel, plan, io, n):
        return launch.step(kernel, (self._grid(plan, n),), (plan.wg,), [*io, np.int32(n)])

    def enqueue(self, runtime, plan, args, n, stride):
        kernel = plan.kernel
        kernel.set_args(*args, np.int32(n))
        return [cl.enqueue_nd_range_kernel(runtime.queue, kernel, (self._grid(plan, n),), (plan.wg,))]


class Tape(Backend):
    """The interpreter: its tables (per slot scheme), uploaded once per context, and a scratch
    per queue for its persistent grid, reused by every call (an in-order queue runs one
    launch at a time)."""
    name, kernel_name, launch_layer = "tape", "pyclad_tape", True

    def __init__(self, traced, dtype, config=None):
        if config is not None and not isinstance(config, tape.TapeConfig):
            raise TypeError(f"config must be a pyclad.TapeConfig for the tape backend, not {type(config).__name__}")
        super().__init__(traced, dtype, config)
        self._tables = {}          # TapeConfig.tables_key() -> TapeTables
        self._configs = {}         # device -> its TapeConfig
        self._device_tables = {}   # (context, tables key, joint) -> the tables as kernel arguments
        self._launches = {}        # queue -> (config, the kernel's table and scratch arguments)

    def tables(self, key=(True, True, True, True)) -> tape.TapeTables:
        """The tables of ``key`` = (liveness, fused, library, preload) (TapeConfig.tables_key)."""
        if key not in self._tables:
            self._tables[key] = tape.TapeTables(self.traced, self.dtype, *key)
        return self._tables[key]

    def config_for(self, runtime) -> tape.TapeConfig:
        key = runtime.device.int_ptr
        if key not in self._configs:
            c = self.config or tape.TapeConfig()
            tables = self.tables(c.tables_key())
            self._configs[key] = tape.default_config(runtime.info, self.real, tables, self.traced.n_outputs,
                                                     self.config)
        return self._configs[key]

    def _planes(self, config) -> int:
        """Adjoint planes per slot: one per output in a joint sweep."""
        return self.traced.n_outputs if config.joint else 1

    def variant(self, runtime, jacobians):
        config = self.config_for(runtime)
        tb = self.tables(config.tables_key())
        local = (0, 0)
        if config.layout == "local":
            local = tb.local_slots(config.joint)
            need = tb.local_bytes(config.joint, self._planes(config), config.blocks * config.lanes, config.wg,
                                  self.dtype.itemsize)
            if need > runtime.info.local_mem_bytes:
                raise ValueError(f"TapeConfig(layout='local', wg={config.wg}): {need} bytes of local memory "
                                 f"needed, the device has {runtime.info.local_mem_bytes}; use a smaller wg "
                                 "or layout='node'")
        used = tb.instructions(config.joint) if config.cases == "used" else None
        return config, local, used

    def source(self, jacobians, variant):
        config, local, used = variant
        t = self.traced
        return tape.render(t.group_sizes, t.data_size, t.n_outputs, self.real, jacobians, config, local, used)

    def source_params(self, jacobians, variant):
        config, local, used = variant
        t = self.traced
        return {"sizes": (tuple(t.group_sizes), t.data_size, t.n_outputs), "real": self.real,
                "jacobians": bool(jacobians), "config": config, "local": tuple(local), "used": used}

    def lanes(self, runtime):
        config = self.config_for(runtime)
        return config.lanes * config.blocks

    def work_group(self, runtime, kernel, jacobians):
        return self.config_for(runtime).wg

    def device_tables(self, runtime, config) -> list:
        key = (runtime.context.int_ptr, config.tables_key(), config.joint)   # buffers belong to a context
        if key not in self._device_tables:
            up = lambda a: cla.to_device(runtime.queue, np.ascontiguousarray(a)).data  # noqa: E731
            self._device_tables[key] = [up(a) if isinstance(a, np.ndarray) else a
                                        for a in self.tables(config.tables_key()).arrays(config.joint)]
        return self._device_tables[key]

    def _launch_args(self, runtime):
        """The config and the kernel's table and scratch arguments on a queue, found once: the
        grid's scratch (values, adjoints) is the queue's, reused by every call."""
        key = runtime.queue.int_ptr
        if key not in self._launches:
            config = self.config_for(runtime)
            tb = self.tables(config.tables_key())
            per_item = config.blocks * config.lanes * self.dtype.itemsize * config.work_items
            scratch = [] if config.layout == "local" else \
                [cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE, max(1, slots) * per_item)
                 for slots in (tb.value_slots, tb.adjoint_slots[config.joint] * self._planes(config))]
            self._launches[key] = (config, [*self.device_tables(runtime, config), *scratch,
                                            np.int32(tb.value_slots), np.int32(tb.adjoint_slots[config.joint])])
        return self._launches[key]

    def _grid(self, config, n) -> int:
        return min(config.work_items, arrays.round_up(-(-n // (config.lanes * config.blocks)), config.wg))

    def launch_step(self, runtime, kernel, plan, io, n):
        config, static = self._launch_args(runtime)
        return launch.step(kernel, (self._grid(config, n),), (config.wg,), [*io, *static, np.int32(n)])

    def enqueue(self, runtime, plan, args, n, stride):
        config, static = self._launch_args(runtime)
        kernel = plan.kernel
        kernel.set_args(*args, *static, np.int32(n))
        return [cl.enqueue_nd_range_kernel(runtime.queue, kernel, (self._grid(config, n),), (config.wg,))]


class Numpy(Backend):
    name, on_device = "numpy", False

    def variant(self, runtime, jacobians):
        return None

    def source(self, jacobians, variant):
        raise ValueError("the numpy backend runs no OpenCL source")

    def run(self, params, index, data, jacobians):
        """Outputs and Jacobians on the host (pyclad.interpreter)."""
        return interpreter.run(self.traced, params, index, data, jacobians, self.dtype)


# backend="auto": a straight-line kernel unless its cold build would clearly cost more than it
# saves. Cold builds as the caller waits for them (benchmarks/bench_compile_time.py): on NVIDIA
# 0.70 s for the 95-node Snavely function and 166 s for a 2,000-node graph (about nodes^1.8);
# on PoCL 1.6 s and 3.0 s, where codegen then evaluates faster than the tape. A build estimated
# above this many seconds goes to the tape, which builds one kernel per parameter layout and
# instruction set, in a second or a few.
AUTO_BUILD_LIMIT_S = 10.0


def estimated_codegen_build_s(n_nodes: int, info) -> float:
    """A cold build of the codegen kernel of a graph, from the measured figures above."""
    if info.is_cpu:
        return 1.5 + 7.5e-4 * n_nodes
    return 0.70 * (max(n_nodes, 95) / 95) ** 1.8


class Auto(Backend):
    """Codegen or tape per device, chosen at the first call on it (see AUTO_BUILD_LIMIT_S);
    the choice is announced once per device when it is the tape."""
    name, launch_layer = "auto", True

    def __init__(self, traced, dtype, config=None):
        super().__init__(traced, dtype, config)
        self._codegen, self._tape = Codegen(traced, dtype), Tape(traced, dtype, config)
        self._chosen = {}   # device -> backend

    def choose(self, runtime) -> Backend:
        key = runtime.device.int_ptr
        if key not in self._chosen:
            n = len(self.traced.order)
            build = estimated_codegen_build_s(n, runtime.info)
            if build > AUTO_BUILD_LIMIT_S:
                warnings.warn(f"backend='auto': the graph has {n} nodes; a codegen kernel would take about "
                              f"{build:.0f} s to build on {runtime.info.name} (cold), so the tape evaluates it "
                              "(no per-graph build). Pass backend='codegen' to build it once (pyopencl caches "
                              "it on disk) for the faster evaluation.", stacklevel=4)
                self._chosen[key] = self._tape
            else:
                self._chosen[key] = self._codegen
        return self._chosen[key]

    def kernel_name_for(self, runtime):
        return self.choose(runtime).kernel_name

    def variant(self, runtime, jacobians):
        chosen = self.choose(runtime)
        return chosen.name, chosen.variant(runtime, jacobians)

    def source(self, jacobians, variant):
        name, inner = variant
        return (self._codegen if name == "codegen" else self._tape).source(jacobians, inner)

    def source_params(self, jacobians, variant):
        name, inner = variant
        return (self._codegen if name == "codegen" else self._tape).source_params(jacobians, inner)

    def lanes(self, runtime):
        return self.choose(runtime).lanes(runtime)

    def work_group(self, runtime, kernel, jacobians):
        return self.choose(runtime).work_group(runtime, kernel, jacobians)

    def launch_step(self, runtime, kernel, plan, io, n):
        return self.choose(runtime).launch_step(runtime, kernel, plan, io, n)

    def enqueue(self, runtime, plan, args, n, stride):
        return self.choose(runtime).enqueue(runtime, plan, args, n, stride)


BACKENDS = {b.name: b for b in (Auto, Codegen, Tape, Numpy)}
