"""The ways a :class:`pyclad.BatchFunction` evaluates, as objects with one interface.

- :class:`Codegen`: a straight-line kernel generated per function (SIMD lanes on CPUs, Jacobian
  stores staged through local memory on GPUs); device calls go through the launch layer.
- :class:`Tape`: the generic interpreter kernel of Shen & Dai, which walks the node table and
  the forward and reverse sequences (no compilation per function); the tables and the
  per-tuple scratch (values and adjoints) are its own.
- :class:`Numpy`: the host reference (pyclad.interpreter), no device.

``BatchFunction`` asks its backend; no module reaches into another's state.
"""
from __future__ import annotations

from typing import List

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from clkernels import arrays

from . import codegen, interpreter, tape


class Backend:
    """One way of evaluating a traced function; made per BatchFunction."""
    name = ""
    kernel_name = ""
    on_device = True          # runs an OpenCL kernel
    launch_layer = False      # device calls go through clkernels.launch (one launch per call)

    def __init__(self, traced, dtype):
        self.traced, self.dtype = traced, np.dtype(dtype)
        self.real = "double" if self.dtype == np.float64 else "float"

    def source(self, jacobians: bool, stage: int, lanes: int) -> str:
        raise NotImplementedError

    def lanes(self, runtime) -> int:
        """Tuples per work-item."""
        return 1

    def stage_wg(self, runtime, jacobians: bool) -> int:
        """Work-group size of staged Jacobian stores, or 0."""
        return 0

    def scratch_bytes_per_tuple(self) -> int:
        """Device scratch a tuple needs beyond its inputs and outputs."""
        return 0

    def enqueue(self, runtime, plan, args: List, n: int, stride: int) -> List[cl.Event]:
        """Launch the kernel over n tuples with its buffer arguments; ``stride``: tuples per
        launch (the chunk that fits the device)."""
        raise NotImplementedError


class Codegen(Backend):
    name, kernel_name, launch_layer = "codegen", "pyclad_eval", True

    def source(self, jacobians, stage, lanes):
        return codegen.render(self.traced, self.real, jacobians, stage_wg=stage, lanes=lanes)

    def lanes(self, runtime):
        return codegen.lanes(runtime.info, self.real)

    def stage_wg(self, runtime, jacobians):
        if not jacobians or self.lanes(runtime) > 1:
            return 0
        return codegen.stage_size(self.traced, self.dtype.itemsize, runtime.info)

    def enqueue(self, runtime, plan, args, n, stride):
        kernel = plan.kernel
        for i, a in enumerate(args):
            kernel.set_arg(i, a)
        kernel.set_arg(len(args), np.int32(n))
        items = -(-n // plan.lanes)
        return [cl.enqueue_nd_range_kernel(runtime.queue, kernel, (arrays.round_up(items, plan.wg),),
                                           (plan.wg,))]


class Tape(Backend):
    name, kernel_name = "tape", "pyclad_tape"

    def __init__(self, traced, dtype):
        super().__init__(traced, dtype)
        self.tables = tape.Tables(traced, dtype)
        self._device_tables = {}   # per context: the tables uploaded once

    def source(self, jacobians, stage, lanes):
        t = self.traced
        return tape.render(t.group_sizes, t.data_size, t.n_outputs, self.real, jacobians)

    def scratch_bytes_per_tuple(self):
        return 2 * self.dtype.itemsize * self.tables.n_nodes   # values and adjoints

    def device_tables(self, runtime) -> list:
        key = runtime.context.int_ptr   # buffers belong to a context
        if key not in self._device_tables:
            tb = self.tables
            up = lambda a: cla.to_device(runtime.queue, a).data  # noqa: E731
            self._device_tables[key] = [up(tb.nodes), up(tb.consts), np.int32(tb.n_nodes), up(tb.rev),
                                        up(tb.rev_offsets), up(tb.seeds), up(tb.outputs), up(tb.leaves)]
        return self._device_tables[key]

    def enqueue(self, runtime, plan, args, n, stride):
        tables = self.device_tables(runtime)
        scratch = [arrays.empty(runtime, (self.tables.n_nodes, stride), self.dtype) for _ in range(2)]
        return [plan.kernel(runtime.queue, (arrays.round_up(min(stride, n - base), plan.wg),), (plan.wg,),
                            *args, *tables, scratch[0].data, scratch[1].data, np.int32(stride),
                            np.int32(base), np.int32(n))
                for base in range(0, n, stride)]


class Numpy(Backend):
    name, on_device = "numpy", False

    def source(self, jacobians, stage, lanes):
        raise ValueError("the numpy backend runs no OpenCL source")

    def run(self, params, index, data, jacobians):
        """Outputs and Jacobians on the host (pyclad.interpreter)."""
        return interpreter.run(self.traced, params, index, data, jacobians, self.dtype)


BACKENDS = {b.name: b for b in (Codegen, Tape, Numpy)}
